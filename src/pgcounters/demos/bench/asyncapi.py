"""The async client: what it adds to psycopg's own async execute, and async against sync.

Every comparison sends the same statement with the same parameters (``incr`` sends one
``INSERT`` into the queue: no transaction block, no savepoint, no lookup once the
counter's declaration is cached), on the same connections, in autocommit, and checks
the count exact. The two sides of a pair run **interleaved**: rounds of calls of one,
then of the other (the order alternating from round to round), on the same connection or
pool, so that the machine's drift (other work, autovacuum, the queue's growth) hits both
alike; each side's time is its median round's, times the number of rounds.

* ``async-incr`` against ``psycopg-execute``: one task on one ``AsyncConnection``,
  ``await pc.incr(...)`` against ``await conn.execute(...)`` of the statement ``incr``
  sends (the key already encoded: its validation is the client's cost).
* ``async-pool`` against ``psycopg-pool``: 8 tasks on one event loop sharing one
  ``AsyncConnectionPool`` of 8, ``AsyncCounters`` on the pool against
  ``async with pool.connection() as conn: await conn.execute(...)``.
* ``sync-pool`` against ``psycopg-sync-pool``: the same with 8 threads sharing one
  ``ConnectionPool`` of 8; and ``sync-threads``: 8 threads with a connection each.

So ``psycopg-pool`` against ``psycopg-sync-pool`` is what async costs in psycopg by
itself, reported beside ``async-pool`` against ``sync-pool`` in the same run. Each run
records the client's CPU time per call (``cpu_us``, the process's CPU over its calls),
the load average when it started (``load1``) and, for pgcounters' side of a pair, the
median over the rounds of psycopg's round time over pgcounters' adjacent one (``paired``,
the ratio least moved by a loaded machine).

Every increment is its own transaction, committed with ``synchronous_commit=off`` in
every variant so that the client's cost shows rather than the disk's flush.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from pgcounters.client import AsyncCounters, Counters, array_literal
from pgcounters.demos.bench.report import Comparison, Measurement, Scenario
from pgcounters.schema import install
from pgcounters.sqlfiles import query  # the library's own statement, as incr sends it

COUNTER = "bench_async"
# the session of every variant: commits that do not wait for the WAL flush
SESSION: dict[str, Any] = {"autocommit": True, "options": "-c synchronous_commit=off"}
KEYS = 10
# pgcounters' calls write keys 0..9, psycopg's own 10..19: each side is checked exact
RAW_KEYS = range(KEYS, 2 * KEYS)
WORKERS = 8
ROUNDS = 20

COMPARISONS: tuple[Comparison, ...] = (
    # time per call of psycopg's execute / time per call of incr: 1/1.1 = at most 10% added
    ("async-incr", "psycopg-execute", 0.91),
    ("async-pool", "psycopg-pool", 0.91),
    ("sync-pool", "psycopg-sync-pool", None),
    # async against sync: ours, and psycopg's own beside it (the driver's bound)
    ("async-pool", "sync-pool", None),
    ("psycopg-pool", "psycopg-sync-pool", None),
    ("async-pool", "sync-threads", None),
)
PAIRS: tuple[tuple[str, str], ...] = (
    ("async-incr", "psycopg-execute"),
    ("async-pool", "psycopg-pool"),
    ("sync-pool", "psycopg-sync-pool"),
)
VARIANTS = (*(v for pair in PAIRS for v in pair), "sync-threads")


def prepare(dsn: str) -> None:
    """Install the schema (a fresh database), declare the counter and empty its queue."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        install(conn)
        pc = Counters(conn)
        pc.drop_counter(COUNTER)
        pc.create_counter(COUNTER, int)


def _totals(dsn: str) -> tuple[int, int]:
    """(the count of pgcounters' keys, the count of psycopg's own keys)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        pc = Counters(conn)
        ours = sum(pc.get_many(COUNTER, range(KEYS)))
        raw = sum(pc.get_many(COUNTER, RAW_KEYS))
        pc.drain()
        return ours, raw


class _Clock:
    """The wall and process CPU times of the rounds of one side of a pair."""

    def __init__(self) -> None:
        self.rounds: list[float] = []
        self.cpu = 0.0

    def add(self, wall: float, cpu: float) -> None:
        self.rounds.append(wall)
        self.cpu += cpu

    @property
    def wall(self) -> float:
        """The median round's wall time times the number of rounds: a round that another
        program's burst of work stalled weighs no more than any other."""
        return statistics.median(self.rounds) * len(self.rounds) if self.rounds else 0.0


def _interleaved_sync(sides: tuple[Callable[[], None], Callable[[], None]]) -> list[_Clock]:
    clocks = [_Clock(), _Clock()]
    for r in range(ROUNDS):
        for side in (0, 1) if r % 2 == 0 else (1, 0):
            wall, cpu = time.perf_counter(), time.process_time()
            sides[side]()
            clocks[side].add(time.perf_counter() - wall, time.process_time() - cpu)
    return clocks


async def _interleaved_async(
    sides: tuple[Callable[[], Awaitable[None]], Callable[[], Awaitable[None]]],
) -> list[_Clock]:
    clocks = [_Clock(), _Clock()]
    for r in range(ROUNDS):
        for side in (0, 1) if r % 2 == 0 else (1, 0):
            wall, cpu = time.perf_counter(), time.process_time()
            await sides[side]()
            clocks[side].add(time.perf_counter() - wall, time.process_time() - cpu)
    return clocks


def _raw_key(i: int) -> str:
    # what incr sends for an int key: the text[] literal of its one part
    return array_literal([str(RAW_KEYS[i % KEYS])])


def _threads(work: Callable[[int], None]) -> None:
    threads = [threading.Thread(target=work, args=(w,)) for w in range(WORKERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _sync_threads(dsn: str, per_worker: int) -> _Clock:
    conns = [psycopg.connect(dsn, **SESSION) for _ in range(WORKERS)]
    clients = [Counters(c) for c in conns]
    for pc in clients:
        pc.counter(COUNTER)

    def work(w: int) -> None:
        pc = clients[w]
        for i in range(per_worker):
            pc.incr(COUNTER, (w + i) % KEYS)

    try:
        clock = _Clock()
        wall, cpu = time.perf_counter(), time.process_time()
        _threads(work)
        clock.add(time.perf_counter() - wall, time.process_time() - cpu)
        return clock
    finally:
        for c in conns:
            c.close()


def _sync_pool(dsn: str, per_round: int) -> list[_Clock]:
    with ConnectionPool(dsn, min_size=WORKERS, max_size=WORKERS, kwargs=SESSION, open=True) as pool:
        pool.wait()
        pc = Counters(pool)
        counter = pc.counter(COUNTER)
        statement = query("enqueue")

        def ours() -> None:
            def work(w: int) -> None:
                for i in range(per_round):
                    pc.incr(COUNTER, (w + i) % KEYS)

            _threads(work)

        def raw() -> None:
            def work(w: int) -> None:
                for i in range(per_round):
                    with pool.connection() as conn:
                        conn.execute(statement, (counter.id, _raw_key(w + i), 1))

            _threads(work)

        return _interleaved_sync((ours, raw))


async def _async_pool(dsn: str, per_round: int) -> list[_Clock]:
    pool = AsyncConnectionPool(dsn, min_size=WORKERS, max_size=WORKERS, kwargs=SESSION, open=False)
    await pool.open(wait=True)
    async with pool:
        pc = AsyncCounters(pool)
        counter = await pc.counter(COUNTER)
        statement = query("enqueue")

        async def our_task(w: int) -> None:
            for i in range(per_round):
                await pc.incr(COUNTER, (w + i) % KEYS)

        async def raw_task(w: int) -> None:
            for i in range(per_round):
                async with pool.connection() as conn:
                    await conn.execute(statement, (counter.id, _raw_key(w + i), 1))

        async def ours() -> None:
            await asyncio.gather(*(our_task(w) for w in range(WORKERS)))

        async def raw() -> None:
            await asyncio.gather(*(raw_task(w) for w in range(WORKERS)))

        return await _interleaved_async((ours, raw))


async def _one_connection(dsn: str, per_round: int) -> list[_Clock]:
    conn = await psycopg.AsyncConnection.connect(dsn, **SESSION)
    async with conn:
        pc = AsyncCounters(conn)
        counter = await pc.counter(COUNTER)
        statement = query("enqueue")

        async def ours() -> None:
            for i in range(per_round):
                await pc.incr(COUNTER, i % KEYS)

        async def raw() -> None:
            for i in range(per_round):
                await conn.execute(statement, (counter.id, _raw_key(i), 1))

        return await _interleaved_async((ours, raw))


def run_pair(dsn: str, pair: tuple[str, str], per_worker: int) -> dict[str, Measurement]:
    """One interleaved run of a pair (pgcounters' variant, psycopg's own): ``per_worker``
    increments by each of the 8 workers of each side (or ``8 * per_worker`` by the single
    task of ``async-incr`` and ``psycopg-execute``)."""
    if per_worker % ROUNDS:
        raise ValueError(f"per_worker must be a multiple of {ROUNDS}, got {per_worker}")
    load = os.getloadavg()[0]
    before = _totals(dsn)
    calls = WORKERS * per_worker
    if pair == ("async-incr", "psycopg-execute"):
        clocks = asyncio.run(_one_connection(dsn, calls // ROUNDS))
    elif pair == ("async-pool", "psycopg-pool"):
        clocks = asyncio.run(_async_pool(dsn, per_worker // ROUNDS))
    elif pair == ("sync-pool", "psycopg-sync-pool"):
        clocks = _sync_pool(dsn, per_worker // ROUNDS)
    else:
        raise ValueError(f"unknown pair {pair!r}")
    after = _totals(dsn)
    # round by round, psycopg's time over pgcounters' adjacent one: the drift between
    # rounds cancels out
    paired = statistics.median(
        theirs / ours for ours, theirs in zip(clocks[0].rounds, clocks[1].rounds, strict=True)
    )
    return {
        variant: Measurement(
            clock.wall,
            calls,
            exact=after[side] - before[side] == calls,
            extra={
                "cpu_us": round(clock.cpu / calls * 1e6, 1),
                "load1": load,
                **({"paired": round(paired, 3)} if side == 0 else {}),
            },
        )
        for side, (variant, clock) in enumerate(zip(pair, clocks, strict=True))
    }


def run_threads(dsn: str, per_worker: int) -> Measurement:
    """One run of ``sync-threads``: 8 threads with a connection each."""
    load = os.getloadavg()[0]
    before = _totals(dsn)[0]
    clock = _sync_threads(dsn, per_worker)
    calls = WORKERS * per_worker
    return Measurement(
        clock.wall,
        calls,
        exact=_totals(dsn)[0] - before == calls,
        extra={"cpu_us": round(clock.cpu / calls * 1e6, 1), "load1": load},
    )


def async_api(dsn: str, repeat: int, quick: bool) -> Scenario:
    per_worker = 100 if quick else 1000  # multiples of ROUNDS
    scenario = Scenario(
        "async",
        f"pgcounters against psycopg's own execute of the same statement, interleaved in "
        f"{ROUNDS} alternating rounds on the same connection or pool: one task's "
        f"{WORKERS * per_worker} awaited incr() (async-incr), {WORKERS} tasks on one "
        f"AsyncConnectionPool (async-pool), {WORKERS} threads on one ConnectionPool "
        f"(sync-pool), {per_worker} increments per worker; and {WORKERS} threads with a "
        "connection each (sync-threads). Each increment its own transaction, "
        "synchronous_commit off; cpu_us: the process's CPU per call; load1: the load "
        "average at the run's start; paired: for pgcounters' side of a pair, the median "
        "over the rounds of psycopg's round time / pgcounters' (medians of the runs).",
        unit="increments",
        extra_aggregate="median",
    )
    scenario.headline = ("async-incr", "psycopg-execute")
    prepare(dsn)
    for _ in range(repeat):
        for pair in PAIRS:
            for variant, measurement in run_pair(dsn, pair, per_worker).items():
                scenario.add(variant, measurement)
        scenario.add("sync-threads", run_threads(dsn, per_worker))
    scenario.compare(COMPARISONS)
    return scenario
