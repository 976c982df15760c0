"""``held-horizon``: the queue, the counters and exact reads while a long transaction holds
the xmin horizon.

A production database always has one sooner or later: a ``pg_dump``, a report in
REPEATABLE READ, a session idle in a transaction. While it is open, VACUUM removes no row
version that died after it started. The scenario offers a steady load (pgbench: 2,000
increments/s of a named counter over 10,000 keys, and 75 transactions/s each inserting a
child row and deleting one, 150 statements/s, under a declared counter of children per
parent kept in a counter column) with one ``pgcounters worker`` (defaults), and one
connection reading exactly all along (``get`` of a key, ``get_many`` of 50 keys, the
exact value of the declared counter for a parent). Three phases: clean, then another
session runs ``BEGIN ISOLATION LEVEL REPEATABLE READ`` and a first query and stays idle
(held), then it ends (after). Sampled every few seconds: milliseconds per drain batch,
worker CPU per delta (the process and its backend), lag, sizes and dead tuples of the
queue, the counters table and the parent table, read latencies.

Each phase is reported as a variant, with its figures relative to the clean phase's
("x clean") beside the targets: queue dead tuples 0 during the hold; drain CPU per delta
at most 1.5x clean, lag p99 under 1 s; counters and parent table at most 3x their clean
size; exact read p99 at most 2x clean during the hold and the 2 minutes after; within
60 s of the end every figure within 10% of clean. 30 minutes of hold (5 with ``--quick``).
Needs pgbench and Linux (``/proc`` for the CPU times).
"""

from __future__ import annotations

import random
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from pgcounters import horizon, triggers
from pgcounters.client import Counters
from pgcounters.config import connect
from pgcounters.connection import Conn
from pgcounters.demos import sqlfiles
from pgcounters.demos.bench import pgbench
from pgcounters.demos.bench.drain import _percentile, _spawn_worker
from pgcounters.demos.bench.live import _Pgbench, _worker_backend
from pgcounters.demos.bench.report import Measurement, Scenario
from pgcounters.demos.bench.worker_cost import cpu_seconds
from pgcounters.schema import install
from pgcounters.specs import ColumnTarget, CounterSpec, Table

NAME = "bench.horizon"
DECLARED = "bench.horizon_children"
RATE = 2000.0
KEYS = 10_000
CHILD_RATE = 75.0
PARENTS = 1_000
CHILDREN_EACH = 10
CLIENTS = 4
MANY = 50
TABLES = {"queue": "queue", "counters": "counters", "bench_horizon_parent": "parent"}
READS = ("get", f"get_many({MANY})", "declared")


def _q(name: str) -> str:
    return sqlfiles.named("bench_horizon.sql")[name]


def _scalar(conn: Conn, name: str) -> float:
    row = conn.execute(_q(name)).fetchone()
    return float(row[0]) if row and row[0] is not None else 0.0


def spec() -> CounterSpec:
    return CounterSpec(
        name=DECLARED,
        source=Table("bench_horizon_child"),
        keys=("parent_id",),
        target=ColumnTarget(Table("bench_horizon_parent"), "n"),
    )


def _cleanup(conn: Conn) -> None:
    triggers.uninstall(conn, DECLARED, drop_values=True)
    Counters(conn).drop_counter(NAME)
    conn.execute(_q("drop_tables"))


def _prepare(dsn: str) -> None:
    with connect(dsn) as conn:
        install(conn)
        _cleanup(conn)
        conn.execute(_q("create_tables"))
        conn.execute(_q("fill_parents"), {"parents": PARENTS})
        triggers.install(conn, [spec()])
        conn.execute(_q("fill_children"), {"parents": PARENTS, "each": CHILDREN_EACH})
        pc = Counters(conn)
        pc.create_counter(NAME, key=int)
        # every key once: the clean phase compares rows with rows
        pc.incr_many([(NAME, k, 1) for k in range(1, KEYS + 1)])
        pc.drain()
        conn.execute("SELECT pgcounters.disable_wakeups()")
        conn.execute("VACUUM ANALYZE pgcounters.queue, pgcounters.counters, bench_horizon_parent")


class _Reader(threading.Thread):
    """Exact reads all along: (monotonic time, kind, seconds) of each."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.dsn = dsn
        self.stop = threading.Event()
        self.times: list[tuple[float, str, float]] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            rnd = random.Random(7)
            with connect(self.dsn) as conn:
                pc = Counters(conn)
                while not self.stop.is_set():
                    for kind in READS:
                        started = time.perf_counter()
                        if kind == "get":
                            pc.get(NAME, rnd.randint(1, KEYS))
                        elif kind == "declared":
                            pc.get(DECLARED, rnd.randint(1, PARENTS))
                        else:
                            pc.get_many(NAME, rnd.sample(range(1, KEYS + 1), MANY))
                        self.times.append((time.monotonic(), kind, time.perf_counter() - started))
                    time.sleep(0.02)
        except BaseException as exc:  # reported by the scenario
            self.error = exc


@dataclass
class _Sample:
    t: float
    values: dict[str, float] = field(default_factory=dict)


def _phases(clean: float, held: float, after: float) -> dict[str, tuple[float, float]]:
    """Each phase's span in seconds since the start of the load (the first seconds of the
    clean phase left out: connections and caches warm up)."""
    end = clean + held
    return {
        "clean": (min(20.0, clean / 3), clean),
        "held": (clean, end),
        "held, last minute": (max(clean, end - 60), end),
        "after (2 min)": (end, end + min(120.0, after)),
        "60-120 s after": (end + min(60.0, after / 2), end + min(120.0, after)),
    }


def _run(dsn: str, binary: str, clean: float, held: float, after: float, every: float) -> Scenario:
    scenario = Scenario(
        "held-horizon",
        f"pgbench offers {RATE:,.0f} increments/s of a named counter over {KEYS:,} keys and "
        f"{CHILD_RATE:g} transactions/s of an INSERT and a DELETE under a declared counter "
        f"(children per parent, {PARENTS:,} parents) while one worker drains (defaults) and "
        f"one connection reads exactly (get, get_many of {MANY}, the declared counter). "
        f"Clean for {clean:g} s, then a REPEATABLE READ transaction is held for {held:g} s, "
        f"then {after:g} s after it ends. Figures per phase; 'x clean' is the ratio to the "
        "clean phase. Targets: queue dead tuples 0 while held; CPU/delta <= 1.5x clean; lag "
        "p99 < 1 s; counters and parent size <= 3x clean; read p99 <= 2x clean during and 2 "
        "min after; every figure within 10% of clean 60-120 s after.",
        unit="deltas",
        extra_aggregate="median",
    )
    _prepare(dsn)
    worker = _spawn_worker(dsn)
    reader = _Reader(dsn)
    samples: list[_Sample] = []
    lags: list[tuple[float, float]] = []
    holder: psycopg.Connection[tuple[object, ...]] | None = None
    total = clean + held + after
    try:
        with connect(dsn) as conn:
            backend = _worker_backend(conn, worker.pid, worker.poll)
            named = _Pgbench(
                binary, dsn, _q("pgbench_named") + ";\n", clients=CLIENTS, seconds=total, rate=RATE
            )
            children = _Pgbench(
                binary,
                dsn,
                _q("pgbench_children") + ";\n",
                clients=2,
                seconds=total,
                rate=CHILD_RATE,
            )
            started = time.monotonic()
            named.start()
            children.start()
            reader.start()
            cpu_prev = cpu_seconds(worker.pid) + cpu_seconds(backend)
            drained_prev = conn.execute(_q("drained")).fetchone() or (0.0, 0.0, 0.0)
            due = started
            while named.is_alive():
                due += every
                while time.monotonic() < due and named.is_alive():
                    lags.append((time.monotonic() - started, _scalar(conn, "oldest_pending")))
                    time.sleep(0.05)
                now = time.monotonic()
                t = now - started
                if holder is None and clean <= t < clean + held:
                    holder = psycopg.connect(dsn, application_name="held-horizon benchmark")
                    holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                    holder.execute(_q("hold"))
                elif holder is not None and not holder.closed and t >= clean + held:
                    holder.rollback()
                    holder.close()
                sample = _Sample(round(t, 1))
                oldest = horizon.holders(conn, 1)
                sample.values["horizon s"] = (oldest[0].seconds or 0.0) if oldest else 0.0
                conn.execute("SELECT pg_stat_clear_snapshot()")
                for name, size, _live, dead in conn.execute(_q("sample")):
                    sample.values[f"size MB: {TABLES[name]}"] = size / 2**20
                    sample.values[f"dead tuples: {TABLES[name]}"] = float(dead)
                cpu = cpu_seconds(worker.pid) + cpu_seconds(backend)
                drained = conn.execute(_q("drained")).fetchone() or drained_prev
                batches = drained[0] - drained_prev[0]
                deltas = drained[1] - drained_prev[1]
                inside = drained[2] - drained_prev[2]
                if deltas:
                    sample.values["CPU us/delta"] = (cpu - cpu_prev) / deltas * 1e6
                if batches:
                    sample.values["ms/batch"] = inside / batches * 1000
                sample.values["deltas"] = deltas
                cpu_prev, drained_prev = cpu, drained
                recent = [s for at, s in lags if at > t - every]
                sample.values["lag ms: p99"] = _percentile(recent, 0.99) * 1000
                for kind in READS:
                    window = [
                        s for at, k, s in list(reader.times) if k == kind and at > now - every
                    ]
                    if window:
                        sample.values[f"read p99 ms: {kind}"] = _percentile(window, 0.99) * 1000
                samples.append(sample)
            result = named.finish()
            children.finish()
            reader.stop.set()
            reader.join(timeout=60)
            if reader.error is not None:
                raise reader.error
            deadline = time.monotonic() + 600
            while _scalar(conn, "pending") and time.monotonic() < deadline:
                time.sleep(0.2)
            row = conn.execute(_q("totals")).fetchone()
            assert row is not None
            exact = int(row[0]) == KEYS + result.transactions and int(row[1]) == 0
            _cleanup(conn)
    finally:
        if holder is not None and not holder.closed:
            holder.close()
        worker.terminate()
        worker.wait(timeout=60)
    _report(scenario, samples, lags, reader.times, _phases(clean, held, after), started, exact)
    return scenario


def _report(
    scenario: Scenario,
    samples: list[_Sample],
    lags: list[tuple[float, float]],
    reads: list[tuple[float, str, float]],
    phases: dict[str, tuple[float, float]],
    started: float,
    exact: bool,
) -> None:
    def figures(lo: float, hi: float) -> dict[str, float]:
        inside = [s for s in samples if lo < s.t <= hi]
        out: dict[str, float] = {}
        for key in ("CPU us/delta", "ms/batch"):
            values = [s.values[key] for s in inside if key in s.values]
            out[key] = statistics.median(values) if values else 0.0
        out["lag p99 ms"] = _percentile([v for at, v in lags if lo < at <= hi], 0.99) * 1000
        for label in TABLES.values():
            out[f"{label} MB max"] = max(
                (s.values.get(f"size MB: {label}", 0.0) for s in inside), default=0.0
            )
            out[f"{label} dead max"] = max(
                (s.values.get(f"dead tuples: {label}", 0.0) for s in inside), default=0.0
            )
        for kind in READS:
            times = [s for at, k, s in reads if k == kind and lo < at - started <= hi]
            out[f"{kind} p99 ms"] = _percentile(times, 0.99) * 1000
        return out

    clean = figures(*phases["clean"])
    for phase, (lo, hi) in phases.items():
        found = figures(lo, hi)
        extra = {k: round(v, 3) for k, v in found.items()}
        if phase != "clean":
            for key, value in found.items():
                base = clean.get(key, 0.0)
                if base and "dead" not in key:
                    extra[f"{key} x clean"] = round(value / base, 2)
        deltas = sum(s.values.get("deltas", 0.0) for s in samples if lo < s.t <= hi)
        scenario.add(phase, Measurement(max(hi - lo, 1e-3), int(deltas), exact, extra))
    series: dict[str, list[tuple[float, float]]] = {}
    for s in samples:
        for key, value in s.values.items():
            if key != "deltas":
                series.setdefault(key, []).append((s.t, value))
    scenario.series = series


def held_horizon(dsn: str, repeat: int, quick: bool) -> Scenario:
    """One long run (``repeat`` does not apply): 2 min clean, 30 min held, 3 min after;
    with ``--quick`` 1 min, 5 min and 2 min."""
    clean, held, after, every = (60.0, 300.0, 120.0, 5.0) if quick else (120.0, 1800.0, 180.0, 10.0)
    binary = pgbench.find()
    if binary is None or not Path("/proc/self/stat").exists():
        scenario = Scenario("held-horizon", "Exact counters while the xmin horizon is held.")
        scenario.description += " " + (
            pgbench.MISSING if binary is None else "skipped: no /proc to read CPU times from"
        )
        return scenario
    return _run(dsn, binary, clean, held, after, every)
