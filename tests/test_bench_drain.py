"""Smoke test of the drain benchmarks with tiny sizes: every variant runs and is exact."""

from __future__ import annotations

import pytest

from pgcounters.demos.bench import SCENARIOS, drain


def test_the_drain_scenario_is_exact(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(drain, "BATCH", 700)
    scenario = drain.drain(dsn, 1, True)
    assert set(scenario.runs) == {f"{v} {size}" for v in drain.VARIANTS for size in ("10k", "100k")}
    assert all(r.exact for runs in scenario.runs.values() for r in runs)
    assert scenario.runs["pgcounters 10k"][0].operations == 10_000
    assert {c["baseline"] for c in scenario.comparisons} >= {"reference-between 10k"}
    assert SCENARIOS["drain"] is drain.drain


@pytest.mark.slow
def test_the_lag_scenario_is_exact(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(drain, "_lag_seconds", lambda quick: 1.0)
    scenario = drain.drain_lag(dsn, 1, True)
    assert set(scenario.runs) == {"poll", "listen", "insert-plain", "insert-wakeup-trigger"}
    assert all(r.exact for runs in scenario.runs.values() for r in runs)
    poll = scenario.runs["poll"][0]
    assert poll.operations > 0
    assert poll.extra["samples"] > 0
    assert poll.extra["lag p99 ms"] >= poll.extra["lag p50 ms"] >= 0
    assert SCENARIOS["drain-lag"] is drain.drain_lag


@pytest.mark.parametrize("variant", drain.BUSY_VARIANTS)
def test_the_busy_rows_scenario_is_exact(dsn: str, variant: str) -> None:
    from pgcounters.config import connect
    from pgcounters.schema import install

    with connect(dsn) as conn:
        install(conn)
    run = drain._busy_run(dsn, variant, 5_000)
    assert run.exact
    assert run.operations == (4_500 if variant == "rows held" else 5_000)
    assert run.extra["deadlocks"] == 0
    assert run.extra["busy rows' lag after release ms"] >= 0
    if variant == "rows held":
        assert run.extra["deltas left for later"] > 0
    assert SCENARIOS["drain-busy"] is drain.drain_busy
