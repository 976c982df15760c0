"""Smoke tests of the long-run benchmarks (`soak`, `exact-read-live`) with tiny sizes."""

from __future__ import annotations

from pathlib import Path

import pytest

from pgcounters.demos.bench import ON_REQUEST, SCENARIOS, horizon, live, output, pgbench
from pgcounters.demos.bench.report import Measurement, Scenario

needs_pgbench = pytest.mark.skipif(pgbench.find() is None, reason="pgbench not found")


def test_growth_compares_the_last_third_with_the_middle_one() -> None:
    assert live._growth([1.0, 5.0, 5.0, 5.0, 5.0, 5.0]) == 1.0
    assert live._growth([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]) == 1.5
    assert live._growth([9.0, 9.0]) == 1.0  # too short to tell


@needs_pgbench
def test_the_soak_samples_sizes_and_is_exact(dsn: str, tmp_path: Path) -> None:
    binary = pgbench.find()
    assert binary is not None
    scenario = live._soak_run(dsn, binary, 3.0, 1.0)
    (run,) = scenario.runs["worker (defaults)"]
    assert run.exact
    assert run.operations > 0
    for table in ("queue", "counters", "parent"):
        points = scenario.series[f"size MB: {table}"]
        assert len(points) >= 2
        assert all(size > 0 for _, size in points)
        assert run.extra[f"{table} growth"] > 0
    assert {"worker CPU %", "pending deltas"} <= set(scenario.series)
    assert run.extra["lag p99 ms"] >= run.extra["lag p50 ms"] >= 0
    assert "series" in scenario.as_json()
    pytest.importorskip("matplotlib")
    path = tmp_path / "soak.png"
    output.series_chart(scenario, path)
    assert path.read_bytes().startswith(output.PNG_MAGIC)
    assert SCENARIOS["soak"] is live.soak
    assert "soak" in ON_REQUEST


@needs_pgbench
def test_exact_reads_beside_a_worker_are_exact(dsn: str) -> None:
    binary = pgbench.find()
    assert binary is not None
    stored, exact = live._live_run(dsn, binary, 100)
    assert stored.exact
    assert exact.exact
    assert stored.operations == exact.operations > 0
    assert exact.extra["p99 us"] >= exact.extra["p50 us"] > 0
    assert SCENARIOS["exact-read-live"] is live.exact_read_live


def test_a_scenario_without_series_gets_a_bar_chart(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    scenario = Scenario("plain", "no series")
    scenario.add("a", Measurement(1.0, 10))
    written = output.write([scenario], {}, tmp_path)
    assert written.charts == [tmp_path / "plain.png"]
    assert "series" not in scenario.as_json()


@needs_pgbench
def test_held_horizon_holds_a_snapshot_in_its_middle_phase_and_is_exact(
    dsn: str, tmp_path: Path
) -> None:
    binary = pgbench.find()
    assert binary is not None
    scenario = horizon._run(dsn, binary, 6.0, 6.0, 6.0, 1.0)
    assert list(scenario.runs) == [
        "clean", "held", "held, last minute", "after (2 min)", "60-120 s after",
    ]  # fmt: skip
    for runs in scenario.runs.values():
        (run,) = runs
        assert run.exact
    # the snapshot is held in the middle phase only (sampled once a second)
    ages = dict(scenario.series["horizon s"])
    assert [t for t, age in ages.items() if age > 0.5] != []
    assert all(6.0 <= t <= 13.0 for t, age in ages.items() if age > 0.5)
    for table in ("queue", "counters", "parent"):
        assert all(size > 0 for _, size in scenario.series[f"size MB: {table}"])
    held = scenario.runs["held"][0]
    assert held.operations > 0
    assert held.extra["ms/batch x clean"] > 0
    for kind in ("get", "get_many(50)", "declared"):
        assert held.extra[f"{kind} p99 ms"] > 0
    pytest.importorskip("matplotlib")
    path = tmp_path / "held-horizon.png"
    output.series_chart(scenario, path)
    assert path.read_bytes().startswith(output.PNG_MAGIC)
    assert SCENARIOS["held-horizon"] is horizon.held_horizon
    assert "held-horizon" in ON_REQUEST
