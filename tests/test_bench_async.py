"""Smoke run of the async benchmark with tiny sizes: every variant exact, ratios reported."""

from __future__ import annotations

from pgcounters.demos.bench import SCENARIOS
from pgcounters.demos.bench.asyncapi import (
    PAIRS,
    ROUNDS,
    VARIANTS,
    WORKERS,
    prepare,
    run_pair,
    run_threads,
)


def test_every_variant_counts_every_increment(dsn: str) -> None:
    prepare(dsn)
    for pair in PAIRS:
        runs = run_pair(dsn, pair, ROUNDS)
        assert set(runs) == set(pair)
        for variant, m in runs.items():
            assert m.operations == WORKERS * ROUNDS, variant
            assert m.exact, variant
            assert m.extra["cpu_us"] > 0, variant
        assert runs[pair[0]].extra["paired"] > 0
        assert "paired" not in runs[pair[1]].extra
    m = run_threads(dsn, ROUNDS)
    assert m.exact
    assert m.operations == WORKERS * ROUNDS


def test_the_scenario_is_registered_and_reports_both_ratios(dsn: str) -> None:
    scenario = SCENARIOS["async"](dsn, 1, True)
    assert set(scenario.runs) == set(VARIANTS)
    targets = {(c["variant"], c["baseline"]): c["target"] for c in scenario.comparisons}
    # what the client adds to psycopg's own execute: the targets
    assert targets[("async-incr", "psycopg-execute")] == 0.91
    assert targets[("async-pool", "psycopg-pool")] == 0.91
    # async against sync, ours and psycopg's own side by side: reported, no target
    assert targets[("async-pool", "sync-pool")] is None
    assert targets[("psycopg-pool", "psycopg-sync-pool")] is None
    table = scenario.table()
    assert "| async-pool | psycopg-pool |" in table
    assert "| psycopg-pool | psycopg-sync-pool |" in table
    assert "cpu_us" in table
    assert "load1" in table
    assert "paired" in table


def test_the_scenario_runs_alone_on_a_database_without_the_schema(empty_dsn: str) -> None:
    """`pgcounters bench async` on a new embedded server: the scenario installs the schema."""
    prepare(empty_dsn)
    m = run_threads(empty_dsn, ROUNDS)
    assert m.exact
    assert m.operations == WORKERS * ROUNDS
