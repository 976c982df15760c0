"""Smoke runs of the write benchmarks with tiny sizes: every variant exact, ratios reported."""

from __future__ import annotations

from pgcounters.bench import SCENARIOS, pgbench
from pgcounters.bench.sqlincr import VARIANTS


def test_pgbench_is_found_and_its_rate_is_read(dsn: str) -> None:
    binary = pgbench.find()
    assert binary is not None  # the embedded PostgreSQL ships it
    result = pgbench.run(binary, dsn, "SELECT 1;\n", clients=2, transactions=5)
    assert result.transactions == 10
    assert result.tps > 0 and result.seconds > 0


def test_the_sql_increment_scenario_counts_every_increment(dsn: str) -> None:
    scenario = SCENARIOS["sql-increment"](dsn, 1, True)
    assert set(scenario.runs) == set(VARIANTS)
    assert all(m.exact and m.operations == 2000 for runs in scenario.runs.values() for m in runs)
    targets = {(c["variant"], c["baseline"]): c["target"] for c in scenario.comparisons}
    assert targets[("incr queued", "INSERT queued")] == 0.95
    assert targets[("incr unlogged", "INSERT unlogged")] == 0.95
    assert "| incr queued | INSERT queued |" in scenario.table()
