"""Draining: the reference ``BETWEEN`` drain vs pgcounters' concurrency-safe drain; and lag.

``drain``: N deltas are queued over the reference technique's 10 counters (not timed), then
drained to the end in batches of 100k (timed), at N = 10k, 100k and 1M
(10k and 100k with ``--quick``). Variants, interleaved:

* ``reference-between``: depesz's function as published, on the reference tables
  (``counter_name text``, ``value_change int4``);
* ``between-claim``: the reference ``id BETWEEN`` claim on pgcounters' queue
  with pgcounters' own sum and upsert: the same data and apply step as
  pgcounters, only the claim differs;
* ``pgcounters``: :meth:`Counters.drain` (``drain_batch``: the sole drainer of
  a queue deletes the first N rows without row locks);
* ``pgcounters-skip-locked``: the same while another session holds the
  queue's drain lock, so every batch claims its rows ``FOR UPDATE SKIP
  LOCKED`` (what a second concurrent drainer does; the version-1 claim).

Every run checks every total.

``drain-lag``: writers add several thousand increments per second, each its
own transaction, while one worker (``pgcounters worker`` in its own process)
drains; a sampler reads the age of the oldest pending delta every 10 ms and
reports its median and 99th percentile. Once with the worker polling, once
listening for wake-ups. Two more variants measure what the wake-up trigger
costs the writers (as many increments as they can, with and without it).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections import Counter as Tally
from collections.abc import Iterator

from pgcounters.client import Counters
from pgcounters.config import connect
from pgcounters.connection import Conn
from pgcounters.demos import sqlfiles
from pgcounters.demos.bench.report import Comparison, Measurement, Scenario
from pgcounters.schema import install
from pgcounters.worker import APPLICATION_NAME

KEYS = 10
BATCH = 100_000
VARIANTS = ("reference-between", "between-claim", "pgcounters", "pgcounters-skip-locked")
LOCK_QUERY = "SELECT pg_advisory_lock(hashtext('pgcounters.drain'), 0)"


def _label(n: int) -> str:
    return f"{n // 1_000_000}M" if n >= 1_000_000 else f"{n // 1000}k"


def _prepare(conn: Conn) -> None:
    install(conn)
    conn.execute(sqlfiles.read("reference_queue.sql").encode())
    conn.execute(sqlfiles.read("reference_drain.sql").encode())
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO reference_counters (counter_name) VALUES (%s)",
            [(str(i),) for i in range(KEYS)],
        )


def _fill(conn: Conn, variant: str, n: int) -> int:
    """Empty the tables of ``variant``, queue ``n`` deltas of 1 over KEYS counters."""
    if variant == "reference-between":
        conn.execute("UPDATE reference_counters SET current_value = 0")
        conn.execute("TRUNCATE reference_queue")
        conn.execute(
            "INSERT INTO reference_queue (counter_name, value_change)"
            " SELECT (g %% %s)::text, 1 FROM generate_series(1, %s) g",
            (KEYS, n),
        )
        conn.execute("VACUUM ANALYZE reference_queue, reference_counters")
        target = 0
    else:
        pc = Counters(conn)
        pc.drop_counter("bench.drain")
        target = pc.create_counter("bench.drain", key=int).id
        conn.execute("TRUNCATE pgcounters.queue")
        conn.execute(
            "INSERT INTO pgcounters.queue (target_id, key, delta)"
            " SELECT %s, ARRAY[(g %% %s)::text], 1 FROM generate_series(1, %s) g",
            (target, KEYS, n),
        )
        conn.execute("VACUUM ANALYZE pgcounters.queue, pgcounters.counters")
    conn.execute("CHECKPOINT")
    return target


def _drain(conn: Conn, variant: str) -> int:
    """Drain to the end; returns the batches run."""
    batches = 0
    if variant == "reference-between":
        while True:
            with conn.transaction():
                # the reference range is inclusive: p_limit + 1 ids
                conn.execute("SELECT reference_apply_counter_queue(%s)", (BATCH - 1,))
            batches += 1
            if conn.execute("SELECT min(id) FROM reference_queue").fetchone() == (None,):
                return batches
    if variant == "between-claim":
        while True:
            with conn.transaction():
                row = conn.execute("SELECT reference_between_drain_batch(%s)", (BATCH,)).fetchone()
            batches += 1
            if conn.execute("SELECT min(id) FROM pgcounters.queue").fetchone() == (None,):
                return batches
            assert row is not None
    return Counters(conn).drain(BATCH).batches


def _totals(conn: Conn, variant: str) -> dict[int, int]:
    if variant == "reference-between":
        rows = conn.execute("SELECT counter_name, current_value FROM reference_counters").fetchall()
        return {int(k): int(v) for k, v in rows}
    values = Counters(conn).get_many("bench.drain", range(KEYS), exact=False)
    return dict(enumerate(values))


@contextlib.contextmanager
def _drain_lock_held(dsn: str, variant: str) -> Iterator[None]:
    """For the skip-locked variant: another session holds the logged queue's drain lock."""
    if variant != "pgcounters-skip-locked":
        yield
        return
    with connect(dsn) as other:
        other.execute(LOCK_QUERY)
        yield


def drain(dsn: str, repeat: int, quick: bool) -> Scenario:
    sizes = (10_000, 100_000) if quick else (10_000, 100_000, 1_000_000)
    scenario = Scenario(
        "drain",
        f"Drain N queued deltas over {KEYS} counters to the end, batches of {BATCH:,}, one "
        "transaction each. Target: >= 800,000 deltas/s with a concurrency-safe claim, "
        "matching the reference unsafe BETWEEN form.",
        unit="deltas",
    )
    with connect(dsn) as conn:
        _prepare(conn)
        for n in sizes:
            for _ in range(repeat):
                for variant in VARIANTS:
                    _fill(conn, variant, n)
                    with _drain_lock_held(dsn, variant):
                        started = time.perf_counter()
                        batches = _drain(conn, variant)
                        seconds = time.perf_counter() - started
                    exact = _totals(conn, variant) == dict.fromkeys(range(KEYS), n // KEYS)
                    scenario.add(
                        f"{variant} {_label(n)}",
                        Measurement(seconds, n, exact, {"batches": float(batches)}),
                    )
        conn.execute("TRUNCATE reference_queue, pgcounters.queue")
        Counters(conn).drop_counter("bench.drain")
    comparisons: list[Comparison] = []
    for n in sizes:
        size = _label(n)
        comparisons += [
            (f"pgcounters {size}", f"reference-between {size}", 1.0),
            (f"pgcounters {size}", f"between-claim {size}", 1.0),
            (f"between-claim {size}", f"reference-between {size}", None),
            (f"pgcounters {size}", f"pgcounters-skip-locked {size}", None),
        ]
    scenario.compare(comparisons)
    # the headline: the largest queue, pgcounters against the reference function
    scenario.headline = (
        f"pgcounters {_label(sizes[-1])}",
        f"reference-between {_label(sizes[-1])}",
    )
    return scenario


# -- lag under a sustained load ----------------------------------------------------


class _Writers:
    """Threads incrementing counters, each increment its own transaction."""

    def __init__(self, dsn: str, threads: int, rate: float | None) -> None:
        self.dsn, self.threads, self.rate = dsn, threads, rate
        self.tally: Tally[int] = Tally()
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.started = self.seconds = 0.0

    def _run(self, idx: int) -> None:
        local: Tally[int] = Tally()
        try:
            with connect(self.dsn) as conn:
                pc = Counters(conn)
                pc.counter("bench.lag")
                period = self.threads / self.rate if self.rate else 0.0
                due = time.perf_counter()
                i = idx
                while not self._stop.is_set():
                    key = i % KEYS
                    pc.incr("bench.lag", key)
                    local[key] += 1
                    i += self.threads
                    if period:
                        due += period
                        pause = due - time.perf_counter()
                        if pause > 0:
                            time.sleep(pause)
        except BaseException as exc:
            self.errors.append(exc)
        with self._lock:
            self.tally.update(local)

    def start(self) -> None:
        self.started = time.perf_counter()
        self._threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(self.threads)
        ]
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=60)
        self.seconds = time.perf_counter() - self.started
        if self.errors:
            raise self.errors[0]


def _sample_lag(dsn: str, stop: threading.Event, out: list[float]) -> None:
    with connect(dsn) as conn:
        while not stop.is_set():
            row = conn.execute(
                "SELECT coalesce(extract(epoch FROM clock_timestamp() - ("
                " SELECT created_at FROM pgcounters.queue ORDER BY id LIMIT 1)), 0)::float8"
            ).fetchone()
            assert row is not None
            out.append(max(0.0, float(row[0])))
            time.sleep(0.01)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else 0.0


def _spawn_worker(dsn: str, *args: str) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k not in ("PGCOUNTERS_DSN", "DATABASE_URL")}
    return subprocess.Popen(
        [sys.executable, "-m", "pgcounters", "--dsn", dsn, "worker", "--log-level", "warning",
         *args],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def _reset_lag(conn: Conn, wakeups: bool) -> None:
    pc = Counters(conn)
    pc.drop_counter("bench.lag")
    pc.create_counter("bench.lag", key=int)
    conn.execute("TRUNCATE pgcounters.queue")
    if wakeups:
        conn.execute("SELECT pgcounters.enable_wakeups(interval '50 milliseconds')")
    else:
        conn.execute("SELECT pgcounters.disable_wakeups()")


def _lag_run(dsn: str, variant: str, rate: float, seconds: float) -> Measurement:
    listen = variant == "listen"
    with connect(dsn) as conn:
        _reset_lag(conn, listen)
    # polling every 50 ms; listening: woken within the 50 ms wake-up interval, polling
    # only every 1 s as a fallback
    args = ["--listen", "--min-interval", "1"] if listen else ["--min-interval", "0.05"]
    worker = _spawn_worker(dsn, *args)
    samples: list[float] = []
    stop = threading.Event()
    sampler = threading.Thread(target=_sample_lag, args=(dsn, stop, samples), daemon=True)
    writers = _Writers(dsn, 4, rate)
    try:
        with connect(dsn) as conn:
            deadline = time.monotonic() + 120
            while conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
                " AND datname = current_database()",
                (APPLICATION_NAME,),
            ).fetchone() != (1,):
                if time.monotonic() > deadline or worker.poll() is not None:
                    raise RuntimeError("the worker did not start")
                time.sleep(0.05)
        writers.start()
        time.sleep(0.5)  # warm-up
        sampler.start()
        time.sleep(seconds)
        stop.set()
        sampler.join(timeout=60)
        writers.stop()
        with connect(dsn) as conn:
            deadline = time.monotonic() + 120
            while Counters(conn).pending()[0] and time.monotonic() < deadline:
                time.sleep(0.05)
            values = Counters(conn).get_many("bench.lag", range(KEYS), exact=False)
    finally:
        worker.terminate()
        worker.wait(timeout=60)
    done = sum(writers.tally.values())
    exact = dict(enumerate(values)) == {k: writers.tally.get(k, 0) for k in range(KEYS)}
    return Measurement(
        writers.seconds,
        done,
        exact,
        {
            "lag p50 ms": round(_percentile(samples, 0.5) * 1000, 1),
            "lag p99 ms": round(_percentile(samples, 0.99) * 1000, 1),
            "samples": float(len(samples)),
        },
    )


def _insert_run(dsn: str, variant: str, seconds: float) -> Measurement:
    with connect(dsn) as conn:
        _reset_lag(conn, variant == "insert-wakeup-trigger")
    writers = _Writers(dsn, 4, None)
    writers.start()
    time.sleep(seconds)
    writers.stop()
    seconds = writers.seconds
    with connect(dsn) as conn:
        pc = Counters(conn)
        pc.drain()
        values = pc.get_many("bench.lag", range(KEYS), exact=False)
        conn.execute("SELECT pgcounters.disable_wakeups()")
    exact = dict(enumerate(values)) == {k: writers.tally.get(k, 0) for k in range(KEYS)}
    return Measurement(seconds, sum(writers.tally.values()), exact)


def _lag_seconds(quick: bool) -> float:
    return 3.0 if quick else 10.0


def drain_lag(dsn: str, repeat: int, quick: bool) -> Scenario:
    rate = 4000.0
    seconds = _lag_seconds(quick)
    scenario = Scenario(
        "drain-lag",
        f"4 writers at {rate:,.0f} increments/s in total, each its own transaction, for "
        f"{seconds:g} s, one worker draining: age of the oldest pending delta, sampled every "
        "10 ms (p50/p99 over runs: median of the runs' figures). insert-*: the writers "
        "unpaced, without and with the wake-up trigger.",
        unit="increments",
        extra_aggregate="median",
    )
    with connect(dsn) as conn:
        install(conn)
    for _ in range(repeat):
        for variant in ("poll", "listen"):
            scenario.add(variant, _lag_run(dsn, variant, rate, seconds))
        for variant in ("insert-plain", "insert-wakeup-trigger"):
            measurement = _insert_run(dsn, variant, min(seconds, 3.0))
            # equal durations: compare throughput through the time per increment
            per = measurement.seconds / max(measurement.operations, 1)
            scenario.add(variant, Measurement(per * 10_000, 10_000, measurement.exact))
    with connect(dsn) as conn:
        Counters(conn).drop_counter("bench.lag")
        conn.execute("SELECT pgcounters.disable_wakeups()")
    scenario.compare([("insert-wakeup-trigger", "insert-plain", 0.9)])
    return scenario


# -- draining beside application transactions that hold parent rows ----------------

BUSY_ROWS = 100
HELD = 10  # rows one application transaction holds for the whole drain
BUSY_VARIANTS = ("rows free", "open transaction", "rows held")


def _busy_setup(conn: Conn, n: int) -> int:
    conn.execute("DROP TABLE IF EXISTS bench_busy_article")
    Counters(conn).drop_counter("bench.busy")
    conn.execute(
        "CREATE TABLE bench_busy_article (id bigint PRIMARY KEY, body text NOT NULL DEFAULT '',"
        " n bigint NOT NULL DEFAULT 0)"
    )
    conn.execute("INSERT INTO bench_busy_article (id) SELECT generate_series(1, %s)", (BUSY_ROWS,))
    target = Counters(conn).create_column_counter("bench.busy", "bench_busy_article", "n").id
    conn.execute("TRUNCATE pgcounters.queue")
    conn.execute(
        "INSERT INTO pgcounters.queue (target_id, key, delta)"
        " SELECT %s, ARRAY[(g %% %s + 1)::text], 1 FROM generate_series(1, %s) g",
        (target, BUSY_ROWS, n),
    )
    conn.execute("VACUUM ANALYZE pgcounters.queue, bench_busy_article")
    return target


def _rolling_updates(
    dsn: str, stop: threading.Event, seed: int, errors: list[BaseException]
) -> None:
    """An application: transactions that update 2-3 of the rows HELD+1.. in random order."""
    import random

    rng = random.Random(seed)
    try:
        with connect(dsn) as conn:
            while not stop.is_set():
                with conn.transaction():
                    for row in rng.sample(range(HELD + 1, BUSY_ROWS + 1), rng.choice((2, 3))):
                        conn.execute(
                            "UPDATE bench_busy_article SET body = %s WHERE id = %s", ("x", row)
                        )
                    time.sleep(0.005)  # the rest of the request, locks held
    except BaseException as exc:
        errors.append(exc)


def _pending_rows(conn: Conn, held_only: bool) -> int:
    row = conn.execute(
        "SELECT count(*) FROM pgcounters.queue WHERE NOT (%s AND key::text[] <@ %s::text[]"
        " AND cardinality(key::text[]) = 1)",
        (held_only, [str(i) for i in range(1, HELD + 1)]),
    ).fetchone()
    return int(row[0]) if row else 0


def _deadlocks(conn: Conn) -> int:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
    ).fetchone()
    return int(row[0]) if row else 0


def _busy_run(dsn: str, variant: str, n: int) -> Measurement:
    from pgcounters.worker import Worker, WorkerSettings

    held = variant == "rows held"
    busy = variant != "rows free"  # application threads and an open transaction
    with connect(dsn) as conn:
        _busy_setup(conn, n)
        deadlocks = _deadlocks(conn)
        holder = connect(dsn, autocommit=False)
        stop = threading.Event()
        errors: list[BaseException] = []
        apps = [
            threading.Thread(target=_rolling_updates, args=(dsn, stop, i, errors), daemon=True)
            for i in range(2 if busy else 0)
        ]
        workers = [Worker(dsn, WorkerSettings(batch_size=10_000, log_every=0)) for _ in range(2)]
        threads = [threading.Thread(target=w.run, daemon=True) for w in workers]
        try:
            if held:
                holder.execute(
                    "SELECT 1 FROM bench_busy_article WHERE id <= %s ORDER BY id FOR UPDATE",
                    (HELD,),
                )
            elif busy:
                # the same open transaction, holding no row: it keeps vacuum from removing
                # the drained rows just as much (the control of "rows held")
                holder.execute("SELECT pg_current_xact_id()")
            for t in apps:
                t.start()
            started = time.perf_counter()
            for t in threads:
                t.start()
            # everything but the held rows' deltas applied
            while _pending_rows(conn, held) and all(t.is_alive() for t in threads):
                time.sleep(0.002)
            drained = time.perf_counter() - started
            stop.set()
            for t in apps:
                t.join(timeout=60)
            released = time.perf_counter()
            holder.commit()
            while _pending_rows(conn, False) and all(t.is_alive() for t in threads):
                time.sleep(0.002)
            tail = time.perf_counter() - released
        finally:
            stop.set()
            holder.close()
            for w in workers:
                w.stop()
            for t in threads:
                t.join(timeout=60)
        values = dict(conn.execute("SELECT id, n FROM bench_busy_article").fetchall())
        new_deadlocks = _deadlocks(conn) - deadlocks
        Counters(conn).drop_counter("bench.busy")
        conn.execute("DROP TABLE bench_busy_article")
    if errors:
        raise errors[0]
    exact = values == dict.fromkeys(range(1, BUSY_ROWS + 1), n // BUSY_ROWS) and not new_deadlocks
    applied = n - (n // BUSY_ROWS) * HELD if held else n
    return Measurement(
        drained,
        applied,
        exact,
        {
            "busy rows' lag after release ms": round(tail * 1000, 1),
            "deltas left for later": float(sum(w.get_stats().busy for w in workers)),
            "deadlocks": float(new_deadlocks),
        },
    )


def drain_busy(dsn: str, repeat: int, quick: bool) -> Scenario:
    n = 100_000 if quick else 1_000_000
    scenario = Scenario(
        "drain-busy",
        f"Two workers drain {n:,} deltas of a column counter over {BUSY_ROWS} parent rows. "
        f"rows held: one application transaction holds {HELD} of the rows for the whole drain "
        "and two application threads update 2-3 of the others in random order (5 ms per "
        "transaction, locks held); open transaction: the same, the long transaction holding "
        "no row (it holds back vacuum all the same); the time is until every delta of a free "
        "row is applied. "
        "The busy rows' lag is from the release of the held rows until their deltas are "
        "applied. A run with a deadlock is not exact.",
        unit="deltas",
        extra_aggregate="median",
    )
    with connect(dsn) as conn:
        install(conn)
    for _ in range(repeat):
        for variant in BUSY_VARIANTS:
            scenario.add(variant, _busy_run(dsn, variant, n))
    scenario.compare([("rows held", "open transaction", None), ("rows held", "rows free", None)])
    scenario.headline = ("rows held", "open transaction")
    return scenario
