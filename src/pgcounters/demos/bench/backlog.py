"""``backlog-wait``: what a worker catching up on a backlog makes an application wait for.

A backlog of deltas of a counter column (500,000 over 100,000 parent rows; 100,000 over
20,000 with ``--quick``) is queued (not timed), then one ``pgcounters worker`` process
drains it while an application thread updates random parent rows (another column of the
row, as an article's ``save()`` does), one short transaction each, and times every update:
the longest is how long the drain held a row the application wanted. A second run queues
the backlog again, starts the worker and sends it SIGTERM once its first batch runs: the
time to its exit is what a deploy waits for. Variants: ``time-sized`` (the default
``--batch-seconds``) and ``one large batch`` (``--batch-seconds 0``: a backlog in batches of up to
``--max-batch-size``). Targets: the longest wait at most 1 s, the exit at most 5 s. Every
run checks every parent row's total.
"""

from __future__ import annotations

import random
import signal
import threading
import time

from pgcounters.client import Counters
from pgcounters.config import connect
from pgcounters.connection import Conn
from pgcounters.demos import sqlfiles
from pgcounters.demos.bench.drain import _percentile, _spawn_worker
from pgcounters.demos.bench.report import Measurement, Scenario
from pgcounters.schema import install

COUNTER = "bench.backlog"
VARIANTS = {"time-sized": (), "one large batch": ("--batch-seconds", "0")}


def _q(name: str) -> str:
    return sqlfiles.named("bench_backlog.sql")[name]


def _scalar(conn: Conn, name: str, params: dict[str, int] | None = None) -> int:
    row = conn.execute(_q(name), params).fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def _queue(conn: Conn, deltas: int, rows: int) -> None:
    """A fresh parent table and a backlog of ``deltas`` deltas of 1 over its ``rows`` rows."""
    pc = Counters(conn)
    pc.drop_counter(COUNTER)
    conn.execute(_q("drop_parent"))
    conn.execute(_q("create_parent"))
    conn.execute(_q("fill_parent"), {"rows": rows})
    pc.create_column_counter(COUNTER, "bench_backlog_parent", "n")
    conn.execute("TRUNCATE pgcounters.queue")
    conn.execute(_q("queue"), {"id": pc.counter(COUNTER).id, "deltas": deltas, "rows": rows})
    conn.execute("VACUUM ANALYZE pgcounters.queue, bench_backlog_parent")


class _Application(threading.Thread):
    """Updates of random parent rows, each timed, until stopped."""

    def __init__(self, dsn: str, rows: int) -> None:
        super().__init__(daemon=True)
        self.dsn, self.rows = dsn, rows
        self.stop = threading.Event()
        self.waits: list[float] = []

    def run(self) -> None:
        rnd = random.Random(11)
        with connect(self.dsn) as conn:
            while not self.stop.is_set():
                started = time.perf_counter()
                conn.execute(_q("touch"), {"id": rnd.randint(1, self.rows)})
                self.waits.append(time.perf_counter() - started)


def _drain_run(dsn: str, args: tuple[str, ...], deltas: int, rows: int) -> Measurement:
    with connect(dsn) as conn:
        _queue(conn, deltas, rows)
        app = _Application(dsn, rows)
        app.start()
        time.sleep(0.5)
        worker = _spawn_worker(dsn, *args)
        started = time.monotonic()
        try:
            deadline = started + 1800
            while _scalar(conn, "pending") and time.monotonic() < deadline:
                time.sleep(0.05)
            seconds = time.monotonic() - started
        finally:
            app.stop.set()
            app.join(timeout=60)
            worker.terminate()
            worker.wait(timeout=120)
        exact = _scalar(conn, "wrong_rows", {"each": deltas // rows}) == 0
        # the same backlog again: SIGTERM while the worker is inside its first batch
        _queue(conn, deltas, rows)
        worker = _spawn_worker(dsn, *args)
        try:
            deadline = time.monotonic() + 120
            while not _scalar(conn, "draining"):
                if time.monotonic() > deadline or worker.poll() is not None:
                    raise RuntimeError("the worker did not start a batch")
                time.sleep(0.01)
            asked = time.monotonic()
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=600)
            stopped = time.monotonic() - asked
        finally:
            if worker.poll() is None:
                worker.kill()
        Counters(conn).drop_counter(COUNTER)
        conn.execute(_q("drop_parent"))
    return Measurement(
        seconds,
        deltas,
        exact,
        {
            "longest wait ms": round(max(app.waits, default=0.0) * 1000, 1),
            "wait p99 ms": round(_percentile(app.waits, 0.99) * 1000, 1),
            "updates": float(len(app.waits)),
            "SIGTERM to exit s": round(stopped, 2),
        },
    )


def backlog_wait(dsn: str, repeat: int, quick: bool) -> Scenario:
    deltas, rows = (100_000, 20_000) if quick else (500_000, 100_000)
    scenario = Scenario(
        "backlog-wait",
        f"A worker drains a backlog of {deltas:,} deltas of a counter column over {rows:,} "
        "parent rows while an application updates random parent rows, each update timed "
        "(the longest: how long a batch held a row the application wanted); then the "
        "backlog again and SIGTERM while the worker's first batch runs. time-sized: the "
        "default --batch-seconds 0.5; one large batch: --batch-seconds 0. Targets: the "
        "longest wait <= 1 s, SIGTERM to exit <= 5 s.",
        unit="deltas",
        extra_aggregate="median",
    )
    with connect(dsn) as conn:
        install(conn)
    for _ in range(repeat):
        for variant, args in VARIANTS.items():
            scenario.add(variant, _drain_run(dsn, args, deltas, rows))
    scenario.compare([("time-sized", "one large batch", None)])
    return scenario
