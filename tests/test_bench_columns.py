"""Smoke test of the counter-column benchmarks with tiny sizes: every variant runs, exact."""

from __future__ import annotations

from pgcounters.demos.bench import SCENARIOS, columns


def test_the_guard_scenario_is_exact(dsn: str) -> None:
    scenario = columns.column_guard(dsn, 1, True, articles=300)
    assert set(scenario.runs) == set(columns.GUARD_VARIANTS) | set(columns.DRAIN_VARIANTS)
    assert all(r.exact for runs in scenario.runs.values() for r in runs)
    assert scenario.runs["guard"][0].operations == 300
    assert scenario.runs["drain, guard"][0].operations == 1500
    assert {c["baseline"] for c in scenario.comparisons} == {
        "no guard",
        "no guard, save() shape",
        "drain, no guard",
    }
    assert SCENARIOS["column-guard"] is columns.column_guard


def test_the_backfill_scenario_is_exact(dsn: str) -> None:
    scenario = columns.backfill_scenario(dsn, 1, True, comments=3000, batch=10)
    assert set(scenario.runs) == {"backfill", "recount"}
    run = scenario.runs["backfill"][0]
    assert run.exact
    assert run.operations == 60
    assert run.extra["longest batch ms"] > 0
    assert SCENARIOS["backfill"] is columns.backfill_scenario
