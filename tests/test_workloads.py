"""The reference workloads of the demo and the benchmarks: every variant counts exactly."""

from __future__ import annotations

import pytest

from pgcounters.demos import workloads


@pytest.mark.parametrize("variant", list(workloads.VARIANTS))
def test_every_variant_of_the_hot_counter_workload_is_exact(dsn: str, variant: str) -> None:
    workloads.prepare(dsn, 10)
    plan = workloads.make_plan(writers=3, per_writer=40, counters=10)
    result = workloads.run_variant(dsn, variant, plan)
    assert result.increments == 120
    assert result.totals == workloads.expected_totals(plan)
    assert result.exact


def test_the_transaction_workload_is_exact_and_queued_increments_never_deadlock(
    dsn: str,
) -> None:
    workloads.prepare(dsn, 10)
    plan = workloads.make_plan(writers=4, per_writer=12, counters=10, per_transaction=(1, 3))
    result = workloads.run_variant(dsn, "pgcounters-queued", plan, work_seconds=0.005)
    assert result.exact
    assert result.deadlocks == 0
