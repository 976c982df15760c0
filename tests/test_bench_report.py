"""The benchmark's results: one JSON object, a Markdown report and PNG charts."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from pgcounters import cli
from pgcounters.demos import bench
from pgcounters.demos.bench import blog
from pgcounters.demos.bench.output import PNG_MAGIC
from pgcounters.demos.bench.report import Measurement, Scenario

FIGURES = {"median_seconds", "min_seconds", "max_seconds", "rate", "runs", "exact"}


def _scenario(headline: tuple[str, str] | None = None) -> Scenario:
    scenario = Scenario("s", "made-up figures", unit="reads", headline=headline)
    scenario.add("reference", Measurement(2.0, 10))
    scenario.add("pgcounters", Measurement(1.0, 100))  # 100x fewer seconds per read
    scenario.add("other", Measurement(1.0, 10))
    scenario.compare([("other", "reference", None), ("pgcounters", "reference", 50.0)])
    return scenario


def test_ratios_compare_time_per_operation_and_pick_the_headline() -> None:
    document = _scenario().as_json()
    # no headline named: the first comparison with a target
    assert (document["ratio"], document["target"], document["met"]) == (20.0, 50.0, False)
    assert document["headline"] == "pgcounters vs reference"
    assert [c["ratio"] for c in _scenario().comparisons] == [2.0, 20.0]
    assert document["ratios"] == _scenario().comparisons
    named = _scenario(("other", "reference")).as_json()
    assert (named["ratio"], named["target"], named["met"]) == (2.0, None, None)
    assert "Headline: other vs reference: 2.0x." in _scenario(("other", "reference")).table()


def test_an_inexact_run_is_refused() -> None:
    with pytest.raises(AssertionError, match="not exact"):
        Scenario("s", "").add("v", Measurement(1.0, 1, exact=False))


def test_a_quick_run_prints_one_json_object_and_writes_the_files(
    dsn: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(
        bench.SCENARIOS, "top-n", functools.partial(blog.top_n, rows=2000, articles=100)
    )
    monkeypatch.setitem(
        bench.SCENARIOS,
        "exact-read",
        functools.partial(blog.exact_read, pending=100, base=300, reads=20),
    )
    out = tmp_path / "results"
    md = tmp_path / "docs" / "bench.md"
    code = cli.run(
        ["--dsn", dsn, "bench", "top-n", "exact-read", "--repeat", "1", "--quick", "--json",
         "--output", str(out), "--markdown", str(md)]
    )  # fmt: skip
    assert code == 0
    printed = capsys.readouterr()
    document = json.loads(printed.out)  # the whole of stdout is one JSON object
    assert [s["name"] for s in document["scenarios"]] == ["top-n", "exact-read"]
    for scenario in document["scenarios"]:
        assert {"ratio", "target", "met", "ratios", "variants"} <= set(scenario)
        assert isinstance(scenario["ratio"], float)
        assert isinstance(scenario["target"], float)
        assert isinstance(scenario["met"], bool)
        assert scenario["met"] == (scenario["ratio"] >= scenario["target"])
        assert scenario["ratios"], scenario["name"]
        for figures in scenario["variants"].values():
            assert set(figures) >= FIGURES
            assert figures["min_seconds"] <= figures["median_seconds"] <= figures["max_seconds"]
            assert figures["rate"] > 0
    assert json.loads((out / "results.json").read_text()) == document
    for name in ("top-n", "exact-read"):
        assert (out / f"{name}.png").read_bytes()[:8] == PNG_MAGIC
    report = (out / "results.md").read_text()
    assert "| top-n | counter column vs annotate(Count) (reference) |" in report
    assert "![exact-read](./exact-read.png)" in report
    assert "![top-n](../results/top-n.png)" in md.read_text()
    assert "results written to" in printed.err


def test_an_unknown_scenario_is_a_clear_error(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as usage:
        cli.run(["--dsn", dsn, "bench", "top-m"])
    assert usage.value.code == cli.EXIT_USAGE
    assert "unknown scenario top-m" in capsys.readouterr().err
