"""The async client: its rate under concurrency, and what it adds to one statement.

* ``async-pool``: 8 tasks on one event loop increment through an
  ``AsyncCounters`` on an ``AsyncConnectionPool`` of 8 connections, against
  ``sync-pool``: the sync ``Counters`` on a ``ConnectionPool`` of 8, from 8
  threads, and ``sync-threads``: 8 threads with a connection each.
* ``psycopg-pool``: the same 8 tasks on the same pool sending the very statement
  ``incr`` sends with psycopg's own ``await conn.execute(...)``: what psycopg's async
  I/O reaches at that concurrency without the client, so that ``async-pool`` against it
  is what the client adds, and it against ``sync-pool`` what async costs by itself.
* ``async-incr``: one task, ``await pc.incr(...)`` in a loop, against
  ``psycopg-execute``: psycopg's own ``await conn.execute(...)`` of the very
  statement ``incr`` sends (same parameters), on the same kind of connection.

Every increment is its own transaction, committed with ``synchronous_commit=off``
in every variant so that the client's cost shows rather than the disk's flush;
each run is checked exact.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from pgcounters.client import AsyncCounters, Counters, array_literal
from pgcounters.demos.bench.report import Comparison, Measurement, Scenario
from pgcounters.sqlfiles import query  # the library's own statement, as incr sends it

COUNTER = "bench_async"
# the session of every variant: commits that do not wait for the WAL flush
SESSION: dict[str, Any] = {"autocommit": True, "options": "-c synchronous_commit=off"}
KEYS = 10
WORKERS = 8

COMPARISONS: tuple[Comparison, ...] = (
    ("async-pool", "sync-pool", 1.0),
    ("async-pool", "sync-threads", None),
    # what the client adds under concurrency (at most 10%), and psycopg's async by itself
    ("async-pool", "psycopg-pool", 0.91),
    ("psycopg-pool", "sync-pool", None),
    # time per call of psycopg's execute / time per call of incr: 1/1.1 = at most 10% added
    ("async-incr", "psycopg-execute", 0.91),
)
VARIANTS = (
    "sync-threads",
    "sync-pool",
    "async-pool",
    "psycopg-pool",
    "psycopg-execute",
    "async-incr",
)


def prepare(dsn: str) -> None:
    """Declare the counter and empty its queue."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        pc = Counters(conn)
        pc.drop_counter(COUNTER)
        pc.create_counter(COUNTER, int)


def _total(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        pc = Counters(conn)
        total = sum(pc.get_many(COUNTER, range(KEYS)))
        pc.drain()
        return total


def _threads(work: Callable[[int], None]) -> float:
    threads = [threading.Thread(target=work, args=(w,)) for w in range(WORKERS)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - started


def _sync_threads(dsn: str, per_worker: int) -> float:
    conns = [psycopg.connect(dsn, **SESSION) for _ in range(WORKERS)]
    clients = [Counters(c) for c in conns]
    for pc in clients:
        pc.counter(COUNTER)

    def work(w: int) -> None:
        pc = clients[w]
        for i in range(per_worker):
            pc.incr(COUNTER, (w + i) % KEYS)

    try:
        return _threads(work)
    finally:
        for c in conns:
            c.close()


def _sync_pool(dsn: str, per_worker: int) -> float:
    with ConnectionPool(dsn, min_size=WORKERS, max_size=WORKERS, kwargs=SESSION, open=True) as pool:
        pool.wait()
        pc = Counters(pool)
        pc.counter(COUNTER)

        def work(w: int) -> None:
            for i in range(per_worker):
                pc.incr(COUNTER, (w + i) % KEYS)

        return _threads(work)


async def _async_pool(dsn: str, per_worker: int, *, raw: bool = False) -> float:
    pool = AsyncConnectionPool(dsn, min_size=WORKERS, max_size=WORKERS, kwargs=SESSION, open=False)
    await pool.open(wait=True)
    async with pool:
        pc = AsyncCounters(pool)
        counter = await pc.counter(COUNTER)
        statement = query("enqueue")

        async def work(w: int) -> None:
            if raw:
                for i in range(per_worker):
                    async with pool.connection() as conn:
                        key = array_literal([str((w + i) % KEYS)])
                        await conn.execute(statement, (counter.id, key, 1))
                return
            for i in range(per_worker):
                await pc.incr(COUNTER, (w + i) % KEYS)

        started = time.perf_counter()
        await asyncio.gather(*(work(w) for w in range(WORKERS)))
        return time.perf_counter() - started


async def _one_connection(dsn: str, calls: int, *, raw: bool) -> float:
    conn = await psycopg.AsyncConnection.connect(dsn, **SESSION)
    async with conn:
        pc = AsyncCounters(conn)
        counter = await pc.counter(COUNTER)
        statement = query("enqueue")
        started = time.perf_counter()
        if raw:
            for i in range(calls):
                # what incr sends: the counter's id, the key as a text[] literal, the delta
                await conn.execute(statement, (counter.id, array_literal([str(i % KEYS)]), 1))
        else:
            for i in range(calls):
                await pc.incr(COUNTER, i % KEYS)
        return time.perf_counter() - started


def run_variant(dsn: str, variant: str, per_worker: int) -> Measurement:
    """One run of ``variant``: ``per_worker`` increments by each of the 8 workers (or
    ``8 * per_worker`` by the single task of the per-call variants)."""
    before = _total(dsn)
    calls = WORKERS * per_worker
    if variant == "sync-threads":
        seconds = _sync_threads(dsn, per_worker)
    elif variant == "sync-pool":
        seconds = _sync_pool(dsn, per_worker)
    elif variant in ("async-pool", "psycopg-pool"):
        seconds = asyncio.run(_async_pool(dsn, per_worker, raw=variant == "psycopg-pool"))
    elif variant in ("psycopg-execute", "async-incr"):
        seconds = asyncio.run(_one_connection(dsn, calls, raw=variant == "psycopg-execute"))
    else:
        raise ValueError(f"unknown variant {variant!r}")
    return Measurement(seconds, calls, exact=_total(dsn) - before == calls)


def async_api(dsn: str, repeat: int, quick: bool) -> Scenario:
    per_worker = 100 if quick else 1000
    scenario = Scenario(
        "async",
        f"{WORKERS} tasks on one event loop through an AsyncConnectionPool vs the sync client "
        f"from {WORKERS} threads, {per_worker} increments each (each its own transaction, "
        "synchronous_commit off); "
        f"and one task's {WORKERS * per_worker} awaited incr() vs psycopg's own async execute "
        "of the same statement.",
        unit="increments",
    )
    scenario.headline = ("async-pool", "sync-pool")
    prepare(dsn)
    for _ in range(repeat):
        for variant in VARIANTS:
            scenario.add(variant, run_variant(dsn, variant, per_worker))
    scenario.compare(COMPARISONS)
    return scenario
