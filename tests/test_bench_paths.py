"""Smoke test of the path benchmark with tiny sizes: both variants run, exact."""

from __future__ import annotations

from pgcounters.demos.bench import SCENARIOS, paths


def test_the_path_insert_scenario_is_exact(dsn: str) -> None:
    scenario = paths.path_insert(dsn, 2, True, rows=3000, articles=50)
    assert set(scenario.runs) == set(paths.VARIANTS)
    assert all(r.exact for runs in scenario.runs.values() for r in runs)
    assert scenario.runs["two-level path"][0].operations == 3000
    assert [c["baseline"] for c in scenario.comparisons] == ["no counters"]
    assert SCENARIOS["path-insert"] is paths.path_insert
