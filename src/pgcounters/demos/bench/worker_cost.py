"""``worker-cost``: the CPU a worker spends per applied delta under a steady load.

pgbench client processes call ``pgcounters.incr`` at a steady 2,500 increments/s in
total (10 keys, each its own transaction) for 10 s (4 s with ``--quick``); one worker
(``pgcounters worker``, its own process) drains. Measured: the CPU time of the worker
process and of its backend (``/proc/<pid>/stat``, user + system) over the run and the
catch-up after it, per delta applied; the age of the oldest pending delta sampled every
10 ms (p50/p99); the CPU both use in the 2 s after the queue is empty (idle). Variants:

* ``linger 0``: the worker drains again as soon as a round applied anything (a batch, a
  transaction, for every few deltas);
* ``linger 10 ms``, ``linger 20 ms (default)`` and ``linger 50 ms``: it waits that long
  after a batch that was not full, so the next batch gathers the deltas of that time.

The rate column is deltas per CPU second (higher is better). Every run is checked: the
counter's total equals the increments pgbench made. Needs Linux (``/proc``) and pgbench.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from pgcounters.config import connect
from pgcounters.connection import Conn
from pgcounters.demos import sqlfiles
from pgcounters.demos.bench import pgbench
from pgcounters.demos.bench.drain import _percentile, _reset_lag, _sample_lag, _spawn_worker
from pgcounters.demos.bench.report import Comparison, Measurement, Scenario
from pgcounters.schema import install
from pgcounters.worker import APPLICATION_NAME

RATE = 2500.0
CLIENTS = 16
VARIANTS = {
    "linger 0": 0.0,
    "linger 10 ms": 0.01,
    "linger 20 ms (default)": 0.02,
    "linger 50 ms": 0.05,
}
COMPARISONS: tuple[Comparison, ...] = (
    ("linger 10 ms", "linger 0", None),
    ("linger 20 ms (default)", "linger 0", None),
    ("linger 50 ms", "linger 0", None),
)
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _q(name: str) -> str:
    return sqlfiles.named("bench_writes.sql")[name]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux ``/proc/<pid>/stat``)."""
    text = Path(f"/proc/{pid}/stat").read_text(encoding="ascii")
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime


def _run(dsn: str, binary: str, linger: float, seconds: float) -> Measurement:
    with connect(dsn) as conn:
        install(conn)
        _reset_lag(conn, False)
    worker = _spawn_worker(dsn, "--linger", f"{linger:g}", "--min-interval", "0.05")
    samples: list[float] = []
    stop = threading.Event()
    sampler = threading.Thread(target=_sample_lag, args=(dsn, stop, samples), daemon=True)
    try:
        with connect(dsn) as conn:
            deadline = time.monotonic() + 120
            backend = None
            while backend is None:
                row = conn.execute(_q("worker_backend"), {"name": APPLICATION_NAME}).fetchone()
                backend = int(row[0]) if row else None
                if backend is None and (time.monotonic() > deadline or worker.poll() is not None):
                    raise RuntimeError("the worker did not start")
                if backend is None:
                    time.sleep(0.05)
            before = cpu_seconds(worker.pid) + cpu_seconds(backend)
            sampler.start()
            result = pgbench.run(
                binary,
                dsn,
                _q("pgbench_incr_lag") + ";\n",
                clients=CLIENTS,
                seconds=seconds,
                rate=RATE,
            )
            stop.set()
            sampler.join(timeout=60)
            deadline = time.monotonic() + 120
            while int(_scalar(conn, "lag_total")) < result.transactions:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.01)
            busy = cpu_seconds(worker.pid) + cpu_seconds(backend) - before
            time.sleep(2.0)  # idle: the queue is empty
            idle = (cpu_seconds(worker.pid) + cpu_seconds(backend) - before - busy) / 2.0
            total = int(_scalar(conn, "lag_total"))
    finally:
        stop.set()
        worker.terminate()
        worker.wait(timeout=60)
    return Measurement(
        busy,
        result.transactions,
        total == result.transactions,
        {
            "CPU us/delta": round(busy / max(result.transactions, 1) * 1e6, 1),
            "lag p50 ms": round(_percentile(samples, 0.5) * 1000, 1),
            "lag p99 ms": round(_percentile(samples, 0.99) * 1000, 1),
            "idle CPU ms/s": round(idle * 1000, 2),
            "increments/s": round(result.tps),
        },
    )


def _scalar(conn: Conn, name: str) -> float:
    row = conn.execute(_q(name)).fetchone()
    return float(row[0]) if row else 0.0


def worker_cost(dsn: str, repeat: int, quick: bool) -> Scenario:
    seconds = 4.0 if quick else 10.0
    scenario = Scenario(
        "worker-cost",
        f"pgbench calls pgcounters.incr at a steady {RATE:,.0f} increments/s ({CLIENTS} client "
        f"processes, 10 keys) for {seconds:g} s; one worker drains. CPU of the worker process "
        "and its backend per delta applied (rate: deltas per CPU second, higher is better), "
        "lag (age of the oldest pending delta, every 10 ms), and CPU when idle. Variants: "
        "the worker's linger after a batch that was not full.",
        unit="deltas",
        extra_aggregate="median",
    )
    binary = pgbench.find()
    if binary is None or not Path("/proc/self/stat").exists():
        scenario.description += " " + (
            pgbench.MISSING if binary is None else "skipped: no /proc to read CPU times from"
        )
        return scenario
    for _ in range(repeat):
        for variant, linger in VARIANTS.items():
            scenario.add(variant, _run(dsn, binary, linger, seconds))
    scenario.compare(COMPARISONS)
    scenario.headline = ("linger 20 ms (default)", "linger 0")
    return scenario
