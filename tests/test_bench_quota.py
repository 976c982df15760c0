"""Smoke run of the quota benchmark with tiny sizes: every variant exact, none over the limit."""

from __future__ import annotations

import pytest

from pgcounters.demos.bench import SCENARIOS
from pgcounters.demos.bench.quota import VARIANTS, prepare, run_variant


@pytest.mark.parametrize("clients", [1, 8])
def test_every_variant_is_exact_and_never_over_the_limit(dsn: str, clients: int) -> None:
    prepare(dsn)
    for variant in VARIANTS:
        m = run_variant(dsn, variant, clients, 10)
        assert m.operations == clients * 10
        assert m.exact, variant
        assert m.extra == {"windows over limit": 0.0}


def test_the_scenario_is_registered_and_reports_ratios(dsn: str) -> None:
    scenario = SCENARIOS["quota"](dsn, 1, True)
    assert set(scenario.runs) == {*VARIANTS, *(f"hot8-{v}" for v in VARIANTS)}
    assert all(m.exact for runs in scenario.runs.values() for m in runs)
    targets = {(c["variant"], c["baseline"]): c["target"] for c in scenario.comparisons}
    assert targets[("pgcounters", "reference")] == 2.0
    assert "| pgcounters | reference |" in scenario.table()
