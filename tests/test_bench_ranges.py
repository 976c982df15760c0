"""Smoke run of the range-read benchmark with tiny sizes: every read checked, ratios reported."""

from __future__ import annotations

from pgcounters.demos.bench import SCENARIOS
from pgcounters.demos.bench.ranges import VARIANTS, prepare, run_variant


def test_every_variant_reads_the_truth(dsn: str) -> None:
    prepare(dsn)
    for variant in VARIANTS:
        m = run_variant(dsn, variant, 7)
        assert m.operations == 7, variant
        assert m.exact, variant


def test_the_scenario_is_registered_and_reports_its_target(dsn: str) -> None:
    scenario = SCENARIOS["range-read"](dsn, 1, True)
    assert set(scenario.runs) == set(VARIANTS)
    targets = {(c["variant"], c["baseline"]): c["target"] for c in scenario.comparisons}
    assert targets[("30-day range", "stored read (reference)")] == 0.5
    assert "| 30-day range | stored read (reference) |" in scenario.table()


def test_the_scenario_runs_alone_on_a_database_without_the_schema(empty_dsn: str) -> None:
    """`pgcounters bench range-read` on a new embedded server: the scenario installs the
    schema."""
    prepare(empty_dsn)
    m = run_variant(empty_dsn, VARIANTS[0], 3)
    assert m.exact
    assert m.operations == 3
