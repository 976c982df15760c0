"""Smoke run of the async benchmark with tiny sizes: every variant exact, ratios reported."""

from __future__ import annotations

from pgcounters.demos.bench import SCENARIOS
from pgcounters.demos.bench.asyncapi import VARIANTS, WORKERS, prepare, run_variant


def test_every_variant_counts_every_increment(dsn: str) -> None:
    prepare(dsn)
    for variant in VARIANTS:
        m = run_variant(dsn, variant, 5)
        assert m.operations == WORKERS * 5, variant
        assert m.exact, variant


def test_the_scenario_is_registered_and_reports_both_ratios(dsn: str) -> None:
    scenario = SCENARIOS["async"](dsn, 1, True)
    assert set(scenario.runs) == set(VARIANTS)
    targets = {(c["variant"], c["baseline"]): c["target"] for c in scenario.comparisons}
    assert targets[("async-pool", "sync-pool")] == 1.0
    assert targets[("async-incr", "psycopg-execute")] == 0.91
    assert targets[("async-pool", "psycopg-pool")] == 0.91
    assert targets[("psycopg-pool", "sync-pool")] is None
    assert "| async-pool | psycopg-pool |" in scenario.table()
    assert "| async-incr | psycopg-execute |" in scenario.table()
