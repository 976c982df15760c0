"""The reference hot-counter workload (depesz's queue): plain UPDATE, its queues, and pgcounters."""

from __future__ import annotations

from collections.abc import Sequence

from pgcounters.demos import workloads
from pgcounters.demos.bench.report import Comparison, Measurement, Scenario

HOT_COMPARISONS: tuple[Comparison, ...] = (
    ("raw-queue", "update", None),
    ("raw-unlogged", "update", None),
    ("raw-batched", "update", None),
    # each path against the SQL it wraps, sent by hand from the same client (target: >= 0.9x)
    ("pgcounters-queued", "sql-queued", 0.9),
    ("pgcounters-unlogged", "sql-unlogged", 0.9),
    ("pgcounters-batched", "sql-batched", 0.9),
    ("pgcounters-direct", "sql-direct", 0.9),
    # and against the reference technique's own tables (a text name and an int4 delta per row)
    ("pgcounters-queued", "raw-queue", None),
    ("pgcounters-unlogged", "raw-unlogged", None),
    ("pgcounters-batched", "raw-batched", None),
    ("pgcounters-batched", "update", None),
    ("pgcounters-direct", "update", None),
    ("pgcounters-batching", "update", 10.0),
)
TXN_COMPARISONS: tuple[Comparison, ...] = (
    ("pgcounters-queued", "update", 8.0),
    ("pgcounters-unlogged", "update", None),
)


def _run(
    dsn: str,
    scenario: Scenario,
    variants: Sequence[str],
    plan: workloads.Plan,
    repeat: int,
    *,
    work_seconds: float = 0.0,
    sample_locks: bool = False,
) -> None:
    workloads.prepare(dsn, 10)
    for _ in range(repeat):
        for variant in variants:
            r = workloads.run_variant(
                dsn, variant, plan, work_seconds=work_seconds, sample_locks=sample_locks
            )
            extra: dict[str, float] = {}
            if sample_locks:
                extra = {"deadlocks": float(r.deadlocks), "lock waits": float(r.lock_wait_samples)}
            scenario.add(variant, Measurement(r.seconds, r.increments, r.exact, extra))


def hot_counters(dsn: str, repeat: int, quick: bool) -> Scenario:
    per_writer = 200 if quick else 1000
    scenario = Scenario(
        "hot-counters",
        f"The reference workload: 10 concurrent writers x {per_writer} increments over 10 "
        "counters, each increment its own transaction.",
        unit="increments",
    )
    # the headline: the batching client against the reference plain UPDATE
    scenario.headline = ("pgcounters-batching", "update")
    plan = workloads.make_plan(10, per_writer, 10)
    _run(dsn, scenario, list(workloads.VARIANTS), plan, repeat)
    scenario.compare(HOT_COMPARISONS)
    return scenario


def hot_counters_txn(dsn: str, repeat: int, quick: bool) -> Scenario:
    per_writer = 10 if quick else 40
    scenario = Scenario(
        "hot-counters-txn",
        f"10 writers x {per_writer} increments; each transaction increments 1-3 of 10 counters "
        "in random order, then works 20 ms before COMMIT.",
        unit="increments",
    )
    scenario.headline = ("pgcounters-queued", "update")
    plan = workloads.make_plan(10, per_writer, 10, per_transaction=(1, 3))
    _run(
        dsn,
        scenario,
        ["update", "pgcounters-queued", "pgcounters-unlogged"],
        plan,
        repeat,
        work_seconds=0.02,
        sample_locks=True,
    )
    scenario.compare(TXN_COMPARISONS)
    return scenario
