"""Counters under a steady load for a long time: ``soak`` and ``exact-read-live``.

``soak``: pgbench client processes send a steady stream of transactions (2,500
increments/s: each transaction increments a named counter over 10,000 keys and a
counter column of a 1,000-row parent table, through ``pgcounters.incr``) for 10
minutes (30 s with ``--quick``) while one ``pgcounters worker`` process drains with
its default settings. Sampled every 10 s (2 s with ``--quick``): the total size of the
queues, of ``pgcounters.counters`` and of the parent table, their live and dead tuples
(the statistics' view) and autovacuum runs, the deltas pending, the age of the oldest
one, and the CPU of the worker process and of its backend. A soak passes when every
total is exact at the end and the sizes plateau: the largest size of the last third of
the run is compared with the largest of the middle third (``growth``, 1.0 = flat).

``exact-read-live``: 4 pgbench clients increment a counter of 100 keys at 2,000
increments/s in total while a worker drains (defaults); one connection reads a key
stored (``exact=False``) and exact, alternately, and times each read. The ratio is
stored / exact at the median (an exact read sums the pending deltas of the key: with
a worker keeping up, those of the last few milliseconds).

Both need pgbench and Linux (``/proc`` for the CPU times).
"""

from __future__ import annotations

import statistics
import threading
import time
from pathlib import Path

from pgcounters.client import Counters
from pgcounters.config import connect
from pgcounters.connection import Conn
from pgcounters.demos import sqlfiles
from pgcounters.demos.bench import pgbench
from pgcounters.demos.bench.drain import _percentile, _spawn_worker
from pgcounters.demos.bench.report import Measurement, Scenario
from pgcounters.demos.bench.worker_cost import cpu_seconds
from pgcounters.schema import install
from pgcounters.worker import APPLICATION_NAME

SOAK_RATE = 2500.0  # increments per second: two per transaction
SOAK_CLIENTS = 16
SOAK_KEYS = 10_000
SOAK_ROWS = 1_000
LIVE_RATE = 2000.0
LIVE_WRITERS = 4
LIVE_KEYS = 100
TABLES = {
    "queue": "queue",
    "queue_unlogged": "unlogged queue",
    "counters": "counters",
    "bench_soak_parent": "parent",
}


def _q(name: str) -> str:
    return sqlfiles.named("bench_live.sql")[name]


def _scalar(conn: Conn, name: str) -> float:
    row = conn.execute(_q(name)).fetchone()
    return float(row[0]) if row and row[0] is not None else 0.0


def _worker_backend(conn: Conn, worker_pid: int, poll: object) -> int:
    """The pid of the worker's backend, once it is connected."""
    deadline = time.monotonic() + 120
    while True:
        row = conn.execute(
            sqlfiles.named("bench_writes.sql")["worker_backend"], {"name": APPLICATION_NAME}
        ).fetchone()
        if row:
            return int(row[0])
        if time.monotonic() > deadline or (callable(poll) and poll() is not None):
            raise RuntimeError("the worker did not start")
        time.sleep(0.05)


class _Pgbench(threading.Thread):
    """pgbench in the background (its own processes); ``result`` once it ended."""

    def __init__(self, binary: str, dsn: str, script: str, **options: object) -> None:
        super().__init__(daemon=True)
        self.args = (binary, dsn, script)
        self.options = options
        self.result: pgbench.PgbenchRun | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = pgbench.run(*self.args, **self.options)  # type: ignore[arg-type]
        except BaseException as exc:  # reported by finish()
            self.error = exc

    def finish(self) -> pgbench.PgbenchRun:
        self.join(timeout=3600)
        if self.error is not None:
            raise self.error
        if self.result is None:
            raise RuntimeError("pgbench did not finish")
        return self.result


def _growth(values: list[float]) -> float:
    """The largest value of the last third of a series over the largest of the middle third."""
    third = len(values) // 3
    if third == 0:
        return 1.0
    middle = max(values[third : 2 * third])
    last = max(values[2 * third :])
    return round(last / middle, 3) if middle else 1.0


def _soak_run(dsn: str, binary: str, seconds: float, every: float) -> Scenario:
    scenario = Scenario(
        "soak",
        f"pgbench sends {SOAK_RATE:,.0f} increments/s ({SOAK_CLIENTS} client processes; each "
        f"transaction increments a named counter over {SOAK_KEYS:,} keys and a counter column "
        f"of a {SOAK_ROWS:,}-row parent table) for {seconds:g} s while one worker drains "
        f"(defaults). Sampled every {every:g} s: table sizes, dead tuples, worker CPU. "
        "growth: the largest size of the last third of the run over the largest of the "
        "middle third (1.0 = flat).",
        unit="increments",
        extra_aggregate="median",
    )
    with connect(dsn) as conn:
        install(conn)
        pc = Counters(conn)
        pc.drop_counter("bench.soak")
        pc.drop_counter("bench.soak_column")
        conn.execute(_q("soak_drop_parent"))
        conn.execute(_q("soak_parent"))
        conn.execute(_q("soak_fill_parent"), {"rows": SOAK_ROWS})
        pc.create_counter("bench.soak", key=int)
        pc.create_column_counter("bench.soak_column", "bench_soak_parent", "n")
        conn.execute("TRUNCATE pgcounters.queue, pgcounters.queue_unlogged")
        conn.execute("SELECT pgcounters.disable_wakeups()")
        conn.execute("VACUUM ANALYZE pgcounters.queue, pgcounters.counters, bench_soak_parent")
    worker = _spawn_worker(dsn)
    series: dict[str, list[tuple[float, float]]] = {}
    lags: list[float] = []
    try:
        with connect(dsn) as conn:
            backend = _worker_backend(conn, worker.pid, worker.poll)
            load = _Pgbench(
                binary,
                dsn,
                _q("pgbench_soak") + ";\n",
                clients=SOAK_CLIENTS,
                seconds=seconds,
                rate=SOAK_RATE / 2,
            )
            started = time.monotonic()
            cpu0 = cpu_prev = cpu_seconds(worker.pid) + cpu_seconds(backend)
            load.start()
            due = started
            while load.is_alive():
                due += every
                # the lag between samples: every 50 ms
                while time.monotonic() < due and load.is_alive():
                    lags.append(_scalar(conn, "oldest_pending"))
                    time.sleep(0.05)
                now = time.monotonic()
                t = round(now - started, 1)
                conn.execute("SELECT pg_stat_clear_snapshot()")
                for name, size, _live, dead, vacuums in conn.execute(_q("soak_sample")):
                    label = TABLES[name]
                    series.setdefault(f"size MB: {label}", []).append((t, size / 2**20))
                    series.setdefault(f"dead tuples: {label}", []).append((t, float(dead)))
                    series.setdefault(f"autovacuums: {label}", []).append((t, float(vacuums)))
                cpu = cpu_seconds(worker.pid) + cpu_seconds(backend)
                series.setdefault("worker CPU %", []).append(
                    (t, 100 * (cpu - cpu_prev) / max(now - (due - every), 1e-3))
                )
                cpu_prev = cpu
                series.setdefault("pending deltas", []).append((t, _scalar(conn, "pending_deltas")))
            result = load.finish()
            busy = cpu_seconds(worker.pid) + cpu_seconds(backend) - cpu0
            deadline = time.monotonic() + 300
            while _scalar(conn, "pending_deltas") and time.monotonic() < deadline:
                time.sleep(0.1)
            row = conn.execute(_q("soak_totals")).fetchone()
            assert row is not None
            exact = (int(row[0]), int(row[1])) == (result.transactions, result.transactions)
            pc = Counters(conn)
            pc.drop_counter("bench.soak")
            pc.drop_counter("bench.soak_column")
            conn.execute(_q("soak_drop_parent"))
    finally:
        worker.terminate()
        worker.wait(timeout=60)
    increments = 2 * result.transactions
    sizes = {k: v for k, v in series.items() if k.startswith("size MB")}
    extra: dict[str, float] = {
        "worker CPU %": round(100 * busy / result.seconds, 1) if result.seconds else 0.0,
        "CPU us/delta": round(busy / max(increments, 1) * 1e6, 1),
        "lag p50 ms": round(_percentile(lags, 0.5) * 1000, 1),
        "lag p99 ms": round(_percentile(lags, 0.99) * 1000, 1),
    }
    for key, points in sizes.items():
        label = key.removeprefix("size MB: ")
        values = [v for _, v in points]
        extra[f"{label} MB max"] = round(max(values), 2)
        extra[f"{label} growth"] = _growth(values)
    for key, points in series.items():
        if key.startswith("dead tuples: "):
            extra[f"{key.removeprefix('dead tuples: ')} dead max"] = max(v for _, v in points)
    scenario.add("worker (defaults)", Measurement(result.seconds, increments, exact, extra))
    scenario.series = series
    return scenario


def soak(dsn: str, repeat: int, quick: bool) -> Scenario:
    """One long run (``repeat`` does not apply): 10 minutes, 30 s with ``--quick``."""
    seconds, every = (30.0, 2.0) if quick else (600.0, 10.0)
    binary = pgbench.find()
    if binary is None or not Path("/proc/self/stat").exists():
        scenario = Scenario("soak", "A steady load for a long time.")
        scenario.description += " " + (
            pgbench.MISSING if binary is None else "skipped: no /proc to read CPU times from"
        )
        return scenario
    return _soak_run(dsn, binary, seconds, every)


# -- exact reads while a worker keeps up ----------------------------------------------


def _live_run(dsn: str, binary: str, reads: int) -> tuple[Measurement, Measurement]:
    with connect(dsn) as conn:
        install(conn)
        pc = Counters(conn)
        pc.drop_counter("bench.live")
        pc.create_counter("bench.live", key=int)
        conn.execute("TRUNCATE pgcounters.queue")
        conn.execute("SELECT pgcounters.disable_wakeups()")
    worker = _spawn_worker(dsn)
    stored: list[float] = []
    exact: list[float] = []
    pending: list[float] = []
    try:
        with connect(dsn) as conn:
            _worker_backend(conn, worker.pid, worker.poll)
            pc = Counters(conn)
            pc.get("bench.live", 0, exact=True)  # names cached, statements prepared
            load = _Pgbench(
                binary,
                dsn,
                _q("pgbench_live_writer") + ";\n",
                clients=LIVE_WRITERS,
                seconds=max(2.0, reads / 400),
                rate=LIVE_RATE,
            )
            load.start()
            time.sleep(0.5)  # the writers are connected and the worker keeps pace
            i = 0
            while load.is_alive() and len(exact) < reads:
                key = i % LIVE_KEYS
                started = time.perf_counter()
                pc.get("bench.live", key, exact=False)
                stored.append(time.perf_counter() - started)
                started = time.perf_counter()
                pc.get("bench.live", key, exact=True)
                exact.append(time.perf_counter() - started)
                if i % 50 == 0:
                    pending.append(_scalar(conn, "pending_deltas"))
                i += 1
            result = load.finish()
            deadline = time.monotonic() + 120
            while _scalar(conn, "pending_deltas") and time.monotonic() < deadline:
                time.sleep(0.05)
            ok = int(_scalar(conn, "live_total")) == result.transactions
            pc.drop_counter("bench.live")
    finally:
        worker.terminate()
        worker.wait(timeout=60)

    def measured(times: list[float]) -> Measurement:
        return Measurement(
            sum(times),
            len(times),
            ok,
            {
                "p50 us": round(statistics.median(times) * 1e6, 1),
                "p99 us": round(_percentile(times, 0.99) * 1e6, 1),
                "pending deltas (median)": statistics.median(pending) if pending else 0.0,
                "writes/s": round(result.tps),
            },
        )

    return measured(stored), measured(exact)


def exact_read_live(dsn: str, repeat: int, quick: bool) -> Scenario:
    reads = 500 if quick else 2000
    scenario = Scenario(
        "exact-read-live",
        f"{LIVE_WRITERS} pgbench clients increment a counter of {LIVE_KEYS} keys at "
        f"{LIVE_RATE:,.0f} increments/s while one worker drains (defaults); one connection "
        f"reads a key stored and exact, alternately, {reads:,} times each. Target: an exact "
        "read at most 2x a stored one (>= 0.5x).",
        unit="reads",
        extra_aggregate="median",
    )
    binary = pgbench.find()
    if binary is None:
        scenario.description += " " + pgbench.MISSING
        return scenario
    for _ in range(repeat):
        stored, exact = _live_run(dsn, binary, reads)
        scenario.add("stored", stored)
        scenario.add("exact", exact)
    scenario.compare([("exact", "stored", 0.5)])
    return scenario
