"""``pgcounters demo``: the reference hot-counter workload, naive vs pgcounters, totals checked;
then the blog under a concurrent mixed load, every counter checked (:mod:`.blog`)."""

from __future__ import annotations

from pgcounters.config import connect
from pgcounters.demos import blog, workloads
from pgcounters.errors import PgCountersError
from pgcounters.schema import install, installed_version

REFERENCE_VARIANTS = (
    "update",
    "pgcounters-queued",
    "pgcounters-unlogged",
    "pgcounters-batched",
    "pgcounters-batching",
)
TXN_VARIANTS = ("update", "pgcounters-queued")


def _table(title: str, results: list[workloads.RunResult], extra: bool = False) -> list[str]:
    base = results[0]
    head = f"{'technique':<22} {'seconds':>8} {'incr/s':>9} {'vs UPDATE':>10} {'exact':>6}"
    if extra:
        head += f" {'deadlocks':>9} {'lock waits':>10}"
    lines = [title, head, "-" * len(head)]
    for r in results:
        line = (
            f"{r.variant:<22} {r.seconds:>8.2f} {r.rate:>9.0f} "
            f"{base.seconds / r.seconds:>9.1f}x {'yes' if r.exact else 'NO':>6}"
        )
        if extra:
            line += f" {r.deadlocks:>9} {r.lock_wait_samples:>10}"
        lines.append(line)
    return lines


def run(
    dsn: str,
    *,
    writers: int = 10,
    per_writer: int = 1000,
    txn_per_writer: int = 20,
    blog_seconds: float = 30.0,
) -> int:
    """Run the demo against ``dsn``; return a process exit code (0 when every total is exact)."""
    with connect(dsn) as conn:
        applied = install(conn)
        print(
            f"schema: version {installed_version(conn)}"
            + (" (installed now)" if applied else " (already installed)")
        )
    workloads.prepare(dsn, 10)

    plan = workloads.make_plan(writers, per_writer, 10)
    print(
        f"\nThe reference workload: {writers} concurrent writers x {per_writer} increments over "
        "10 counters, each increment its own transaction."
    )
    reference = [workloads.run_variant(dsn, v, plan) for v in REFERENCE_VARIANTS]
    print("\n".join(_table("", reference)))

    plan_txn = workloads.make_plan(writers, txn_per_writer, 10, per_transaction=(1, 3))
    print(
        f"\nIn real transactions: {writers} writers, each transaction increments 1-3 counters "
        "in random order,\nthen does 20 ms of other work before COMMIT "
        f"({sum(len(w) for w in plan_txn)} transactions)."
    )
    txn = [
        workloads.run_variant(dsn, v, plan_txn, work_seconds=0.02, sample_locks=True)
        for v in TXN_VARIANTS
    ]
    print("\n".join(_table("", txn, extra=True)))
    print(
        "\n'exact': after draining, every counter equals the number of increments the writers made."
        "\n'lock waits': samples (every 5 ms) in which some transaction waited for a row lock."
    )
    bad = [r.variant for r in reference + txn if not r.exact]
    if bad:
        print(f"\nFAILED: totals differ for {', '.join(bad)}")
    else:
        print("\nAll totals exact.")
    blog_failed = blog.main(dsn, blog_seconds)
    return 1 if bad or blog_failed else 0


def main(dsn: str) -> int:
    try:
        return run(dsn)
    except PgCountersError as exc:
        print(f"pgcounters demo: {exc}")
        return 1
