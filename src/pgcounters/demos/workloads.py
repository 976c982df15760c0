"""The reference hot-counter workloads, run with the naive technique and with pgcounters.

The reference workload (depesz's queue technique): 10 concurrent writers, each doing
1000 increments of 10 counters in random order, each increment its own transaction. Variants:

* ``update``: ``UPDATE counters SET value = value + 1`` (the naive way)
* ``raw-queue`` / ``raw-unlogged`` / ``raw-batched``: the reference hand-written
  queue INSERTs (logged, UNLOGGED, 10 rows per INSERT), with the reference index
  on the counter name so that exact reads stay fast
* ``sql-queued`` / ``-unlogged`` / ``-batched`` / ``-direct``: the statements pgcounters
  sends, on its own tables, written by hand (what each of its paths wraps)
* ``pgcounters-queued`` / ``-unlogged`` / ``-batched`` / ``-direct``: the same
  through :class:`pgcounters.Counters`
* ``pgcounters-batching``: the batching client (:class:`pgcounters.batching.BatchingCounters`),
  one per run shared by the writer threads as in a web process; it writes on size and every
  100 ms, and the timed run includes its final flush, so every increment is in the queue when
  the clock stops

The "in real transactions" workload makes each transaction increment 1-3
counters in random order and then do ~20 ms of other work before committing,
which is where row locks on hot counters hurt (and deadlock).

Both the demo and the benchmark suite run these; every run checks every total.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter as Tally
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import psycopg
from psycopg import sql

from pgcounters.batching import BatchingCounters
from pgcounters.client import Counters, Mode
from pgcounters.config import connect
from pgcounters.connection import Conn
from pgcounters.demos import sqlfiles
from pgcounters.schema import install

Plan = list[list[list[int]]]  # writer -> transaction -> counter indexes
Op = Callable[[Conn, Counters, Sequence[int]], None]


@dataclass
class RunResult:
    variant: str
    seconds: float
    increments: int
    transactions: int
    deadlocks: int = 0
    lock_wait_samples: int = 0
    exact: bool = False
    totals: dict[int, int] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.increments / self.seconds if self.seconds else 0.0


def make_plan(
    writers: int = 10,
    per_writer: int = 1000,
    counters: int = 10,
    *,
    per_transaction: tuple[int, int] = (1, 1),
    seed: int = 4,
) -> Plan:
    """Random counter choices, the same for every variant of one run."""
    rng = random.Random(seed)
    plan: Plan = []
    for _ in range(writers):
        txns: list[list[int]] = []
        left = per_writer
        while left > 0:
            n = min(left, rng.randint(*per_transaction))
            txns.append([rng.randrange(counters) for _ in range(n)])
            left -= n
        plan.append(txns)
    return plan


def expected_totals(plan: Plan) -> dict[int, int]:
    tally: Tally[int] = Tally()
    for writer in plan:
        for txn in writer:
            tally.update(txn)
    return dict(tally)


# -- the naive and raw techniques ---------------------------------------------


def prepare(dsn: str, counters: int) -> None:
    """Create the reference tables and pgcounters' counters for a run (idempotent)."""
    with connect(dsn) as conn:
        install(conn)
        conn.execute(sqlfiles.read("reference_queue.sql").encode())
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO reference_counters (counter_name) VALUES (%s)",
                [(str(i),) for i in range(counters)],
            )
        pc = Counters(conn)
        for mode in ("queued", "unlogged", "direct"):
            pc.drop_counter(f"bench.{mode}")
            pc.create_counter(f"bench.{mode}", key=int, mode=mode)


def _update(conn: Conn, pc: Counters, items: Sequence[int]) -> None:
    for i in items:
        conn.execute(
            "UPDATE reference_counters SET current_value = current_value + 1 "
            "WHERE counter_name = %s",
            (str(i),),
        )


def _raw_insert(table: str) -> Op:
    stmt = sql.SQL("INSERT INTO {} (counter_name, value_change) VALUES (%s, 1)").format(
        sql.Identifier(table)
    )

    def op(conn: Conn, pc: Counters, items: Sequence[int]) -> None:
        for i in items:
            conn.execute(stmt, (str(i),))

    return op


def _raw_batched(conn: Conn, pc: Counters, items: Sequence[int]) -> None:
    values = sql.SQL(", ").join([sql.SQL("(%s, 1)")] * len(items))
    conn.execute(
        sql.SQL("INSERT INTO reference_queue (counter_name, value_change) VALUES {}").format(
            values
        ),
        [str(i) for i in items],
    )


# the statements pgcounters sends, written by hand: what each of its paths wraps
_SQL_INSERT = {
    mode: sql.SQL("INSERT INTO {} (target_id, key, delta) VALUES (%s, %s::text[], 1)").format(
        sql.Identifier("pgcounters", table)
    )
    for mode, table in (("queued", "queue"), ("unlogged", "queue_unlogged"))
}
_SQL_UPDATE = (
    "UPDATE pgcounters.counters SET value = value + 1 WHERE target_id = %s AND key = %s::text[]"
)
_SQL_UPSERT = (
    "INSERT INTO pgcounters.counters AS c (target_id, key, value) VALUES (%s, %s::text[], 1)"
    " ON CONFLICT (target_id, key) DO UPDATE SET value = c.value + excluded.value"
)


def _sql_insert(mode: Mode) -> Op:
    name, stmt = f"bench.{mode}", _SQL_INSERT[mode]

    def op(conn: Conn, pc: Counters, items: Sequence[int]) -> None:
        target = pc.counter(name).id
        for i in items:
            conn.execute(stmt, (target, f"{{{i}}}"))

    return op


def _sql_batched(conn: Conn, pc: Counters, items: Sequence[int]) -> None:
    target = pc.counter("bench.queued").id
    values = sql.SQL(", ").join([sql.SQL("(%s, %s::text[], 1)")] * len(items))
    params: list[object] = []
    for i in items:
        params += [target, f"{{{i}}}"]
    conn.execute(
        sql.SQL("INSERT INTO pgcounters.queue (target_id, key, delta) VALUES {}").format(values),
        params,
    )


def _sql_direct(conn: Conn, pc: Counters, items: Sequence[int]) -> None:
    target = pc.counter("bench.direct").id
    for i in items:
        if conn.execute(_SQL_UPDATE, (target, f"{{{i}}}")).rowcount == 0:
            conn.execute(_SQL_UPSERT, (target, f"{{{i}}}"))


def _pgc(mode: Mode) -> Op:
    name = f"bench.{mode}"

    def op(conn: Conn, pc: Counters, items: Sequence[int]) -> None:
        for i in items:
            pc.incr(name, i)

    return op


def _pgc_batched(conn: Conn, pc: Counters, items: Sequence[int]) -> None:
    pc.incr_many([("bench.queued", i, 1) for i in items])


def _batching_op(batcher: BatchingCounters) -> Op:
    def op(conn: Conn, pc: Counters, items: Sequence[int]) -> None:
        for i in items:
            batcher.incr("bench.queued", i)

    return op


def _pgc_batching(conn: Conn, pc: Counters, items: Sequence[int]) -> None:
    raise AssertionError("run_variant gives this variant its own operation")  # pragma: no cover


VARIANTS: dict[str, tuple[Op, str]] = {
    # name: (operation, how totals are read)
    "update": (_update, "reference_counters"),
    "raw-queue": (_raw_insert("reference_queue"), "reference_queue"),
    "raw-unlogged": (_raw_insert("reference_queue_unlogged"), "reference_queue_unlogged"),
    "raw-batched": (_raw_batched, "reference_queue"),
    "sql-queued": (_sql_insert("queued"), "bench.queued"),
    "sql-unlogged": (_sql_insert("unlogged"), "bench.unlogged"),
    "sql-batched": (_sql_batched, "bench.queued"),
    "sql-direct": (_sql_direct, "bench.direct"),
    "pgcounters-queued": (_pgc("queued"), "bench.queued"),
    "pgcounters-unlogged": (_pgc("unlogged"), "bench.unlogged"),
    "pgcounters-batched": (_pgc_batched, "bench.queued"),
    "pgcounters-direct": (_pgc("direct"), "bench.direct"),
    "pgcounters-batching": (_pgc_batching, "bench.queued"),
}
BATCHING = "pgcounters-batching"
BATCHED = {"raw-batched", "sql-batched", "pgcounters-batched"}


def _reset(conn: Conn, pc: Counters) -> None:
    conn.execute("UPDATE reference_counters SET current_value = 0")
    conn.execute("TRUNCATE reference_queue, reference_queue_unlogged")
    for mode in ("queued", "unlogged", "direct"):
        pc.drop_counter(f"bench.{mode}")
        pc.create_counter(f"bench.{mode}", key=int, mode=mode)
    # every variant starts from tables without dead rows: an UPDATE of a counter leaves a
    # dead row version (and, in pgcounters.counters, dead index entries) for the next variant
    conn.execute(
        "VACUUM ANALYZE reference_counters, reference_queue, reference_queue_unlogged,"
        " pgcounters.counters, pgcounters.queue, pgcounters.queue_unlogged"
    )


def _totals(conn: Conn, pc: Counters, source: str, counters: int) -> dict[int, int]:
    if source == "reference_counters":
        rows = conn.execute("SELECT counter_name, current_value FROM reference_counters").fetchall()
        return {int(k): int(v) for k, v in rows if v}
    if source.startswith("reference_queue"):
        # the reference exact read: stored + pending, here all pending
        rows = conn.execute(
            sql.SQL("SELECT counter_name, sum(value_change) FROM {} GROUP BY 1").format(
                sql.Identifier(source)
            )
        ).fetchall()
        return {int(k): int(v) for k, v in rows}
    pc.drain()
    values = pc.get_many(source, range(counters))
    return {i: v for i, v in enumerate(values) if v}


class _LockSampler(threading.Thread):
    """Counts samples in which some backend waits for a row lock (pg_locks not granted)."""

    def __init__(self, dsn: str, interval: float = 0.005) -> None:
        super().__init__(daemon=True)
        self.dsn, self.interval = dsn, interval
        self.samples = self.waiting = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        with connect(self.dsn) as conn:
            while not self._stop_event.is_set():
                row = conn.execute(
                    "SELECT count(*) FROM pg_locks WHERE NOT granted AND locktype = 'transactionid'"
                ).fetchone()
                self.samples += 1
                if row and row[0]:
                    self.waiting += 1
                time.sleep(self.interval)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


def run_variant(
    dsn: str,
    variant: str,
    plan: Plan,
    *,
    work_seconds: float = 0.0,
    counters: int = 10,
    sample_locks: bool = False,
) -> RunResult:
    """Run one variant: one thread and connection per writer; check every total."""
    op, source = VARIANTS[variant]
    batcher: BatchingCounters | None = None
    if variant == BATCHING:
        batcher = BatchingCounters(dsn, interval=0.1, flush_at_exit=False)
        op = _batching_op(batcher)
    with connect(dsn) as admin:
        admin_pc = Counters(admin)
        _reset(admin, admin_pc)
    # batched variants send each writer's increments 10 per statement
    if variant in BATCHED:
        flat = [[i for txn in writer for i in txn] for writer in plan]
        plan = [[items[i : i + 10] for i in range(0, len(items), 10)] for items in flat]
    conns = [connect(dsn, autocommit=True) for _ in plan]
    clients = [Counters(c) for c in conns]
    for pc in clients:  # warm the declaration cache, as a long-lived process would have it
        pc.counter("bench.queued")
        pc.counter("bench.unlogged")
        pc.counter("bench.direct")
    deadlocks = [0] * len(plan)
    errors: list[BaseException] = []
    start = threading.Barrier(len(plan) + 1)

    def writer(idx: int) -> None:
        conn, pc = conns[idx], clients[idx]
        try:
            start.wait()
            for txn in plan[idx]:
                while True:
                    try:
                        if work_seconds or (len(txn) > 1 and variant not in BATCHED):
                            with conn.transaction():
                                op(conn, pc, txn)
                                if work_seconds:
                                    time.sleep(work_seconds)
                        else:
                            op(conn, pc, txn)
                        break
                    except psycopg.errors.DeadlockDetected:
                        deadlocks[idx] += 1  # the transaction rolled back: do it again
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(len(plan))]
    for t in threads:
        t.start()
    sampler = _LockSampler(dsn) if sample_locks else None
    if sampler:
        sampler.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    if batcher is not None:
        batcher.close()  # the last batch is written before the clock stops
    seconds = time.perf_counter() - t0
    if sampler:
        sampler.stop()
    for c in conns:
        c.close()
    if errors:
        raise errors[0]
    with connect(dsn) as admin:
        totals = _totals(admin, Counters(admin), source, counters)
    expected = expected_totals(plan)
    return RunResult(
        variant=variant,
        seconds=seconds,
        increments=sum(expected.values()),
        transactions=sum(len(w) for w in plan),
        deadlocks=sum(deadlocks),
        lock_wait_samples=sampler.waiting if sampler else 0,
        exact=totals == expected,
        totals=totals,
    )
