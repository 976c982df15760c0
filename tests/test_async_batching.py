"""The async batching incrementer, in an event loop, on a real PostgreSQL."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from pgcounters import AsyncBatchingCounters, Counters
from pgcounters.connection import Conn
from pgcounters.errors import (
    BufferClosed,
    BufferFlushFailed,
    BufferFull,
    ConfigurationError,
    InvalidDelta,
    InvalidKey,
    UnknownCounter,
)
from test_batching import block_queue_writes, unblock_queue_writes

TASKS = 20
EACH = 250


def test_tasks_incrementing_are_counted_exactly(dsn: str, pc: Counters) -> None:
    pc.create_counter("views", key=int)
    pc.create_counter("shown", key=int, mode="unlogged")
    pc.create_counter("likes", key=int, mode="direct")

    async def main() -> None:
        async with (
            AsyncConnectionPool(dsn, max_size=4, open=False) as pool,
            AsyncBatchingCounters(pool, max_pending=300, interval=0.05) as events,
        ):

            async def task(t: int) -> None:
                for i in range(EACH):
                    await events.incr("views", i % 5)
                    if i % 10 == 0:
                        await events.incr_many([("shown", t, 1), ("likes", 1, 2)])
                    if i % 50 == 0:
                        await asyncio.sleep(0)

            await asyncio.gather(*(task(t) for t in range(TASKS)))
            # exact reads: the database's part plus what this process has not written
            assert await events.get("views", 0) == TASKS * EACH // 5
            assert await events.get("likes", 1) == TASKS * (EACH // 10) * 2
        assert events.pending() == 0

    asyncio.run(main())
    assert [pc.get("views", k) for k in range(5)] == [TASKS * EACH // 5] * 5
    assert pc.get("shown", 3) == EACH // 10
    assert pc.get("likes", 1) == TASKS * (EACH // 10) * 2
    assert pc.drain().deltas > 0  # what the buffer wrote went through the queues


def test_a_failed_write_keeps_the_deltas_and_bad_input_is_refused(
    dsn: str, pc: Counters, conn: Conn
) -> None:
    pc.create_counter("c", key=int)
    errors: list[BaseException] = []

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            events = AsyncBatchingCounters(
                aconn, interval=None, max_pending=5, max_buffered=3, on_error=errors.append
            )
            with pytest.raises(UnknownCounter):
                await events.incr("nope", 1)
            with pytest.raises(InvalidKey):
                await events.incr("c", "x")
            with pytest.raises(InvalidDelta):
                await events.incr("c", 1, 2**63)
            assert events.pending() == 0
            block_queue_writes(conn)
            await events.incr_many([("c", 1, 2), ("c", 2, 3)])
            with pytest.raises(BufferFlushFailed, match="they are kept"):
                await events.flush()
            for _ in range(5):  # reaching max_pending tries a write, which fails, reported
                await events.incr("c", 1)
            assert isinstance(errors[-1], BufferFlushFailed)
            assert events.last_error is errors[-1]
            assert events.pending() == 7
            with pytest.raises(BufferFull):
                await events.incr_many([("c", 3, 1), ("c", 4, 1)])
            assert await events.get("c", 1) == 7  # nothing written, all of it buffered
            unblock_queue_writes(conn)
            stats = await events.flush()
            assert (stats.batches, stats.increments) == (2, 7)
            await events.aclose()
            with pytest.raises(BufferClosed):
                await events.incr("c", 1)

    asyncio.run(main())
    assert (pc.get("c", 1), pc.get("c", 2)) == (7, 3)
    rows = conn.execute("SELECT count(*) FROM pgcounters.buffer_flushes").fetchone()
    assert rows == (2,)  # each batch recorded once in the flush log


def test_a_batch_in_doubt_is_looked_up_not_written_twice(dsn: str, pc: Counters) -> None:
    """A write whose outcome is unknown (its connection broke at COMMIT) is kept in doubt;
    the next flush finds its id recorded and does not write it again."""
    pc.create_counter("c", key=int)

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            events = AsyncBatchingCounters(aconn, interval=None)
            await events.incr("c", 1, 5)
            batch = events._pending.cut()[0]
            # the batch was committed, and its writer believes it failed
            await events.client._run(
                _write_plan(events, batch.flush_id, [(await events.counter("c"), ("1",), 5)])
            )
            batch.in_doubt = True
            assert await events.get("c", 1) == 5  # counted once: the database's part
            stats = await events.flush()
            assert (stats.batches, stats.keys, stats.increments) == (1, 1, 1)
            assert await events.get("c", 1) == 5

    asyncio.run(main())
    assert pc.get("c", 1) == 5


def _write_plan(events: AsyncBatchingCounters, flush_id: str, rows: Any) -> Any:
    from pgcounters.flushlog import write_flush_plan

    return write_flush_plan(events.client, flush_id, events.buffer, rows)


def test_increments_in_an_async_transaction_count_only_if_it_commits(
    dsn: str, pc: Counters
) -> None:
    """The async IncrementGroup: held back until the transaction commits, validated at once,
    committed once; tasks committing and rolling back side by side count exactly."""
    pc.create_counter("c")
    pc.create_counter("per_page", key=int)
    pc.conn.execute("CREATE TABLE page (id int)")

    async def main() -> None:
        conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        async with conn, AsyncBatchingCounters(conn, interval=None) as events:

            async def failing_request() -> None:
                async with events.transaction(conn) as group:
                    await conn.execute("INSERT INTO page VALUES (1)")
                    await group.incr("c")
                    raise RuntimeError("the request failed")

            with pytest.raises(RuntimeError, match="the request failed"):
                await failing_request()
            async with events.transaction(conn) as group:
                await group.incr("c")
                raise psycopg.Rollback()
            assert events.pending() == 0
            async with events.transaction(conn) as group:
                await conn.execute("INSERT INTO page VALUES (2)")
                await group.incr("c", delta=5)
                await group.incr("c", delta=2)
                # bad input is refused when it is added, and the group goes on
                with pytest.raises(InvalidKey):
                    await group.incr("c", 3)
                with pytest.raises(UnknownCounter):
                    await group.incr("nope")
                assert events.pending() == 0  # not before COMMIT
            assert events.pending() == 2
            assert group.done
            with pytest.raises(BufferClosed):
                await group.incr("c")
            await group.commit()  # a second commit buffers nothing more
            assert events.pending() == 2
            async with conn.transaction():
                with pytest.raises(ConfigurationError, match="outermost"):
                    async with events.transaction(conn):
                        pass
            assert await events.get("c") == 7

    asyncio.run(main())
    assert pc.get("c") == 7
    assert pc.conn.execute("SELECT array_agg(id) FROM page").fetchone() == ([2],)

    async def requests() -> None:
        # every connection of the pool held by a request: the declaration is read on the
        # transaction's own connection, not on one of the pool's
        async with (
            AsyncConnectionPool(dsn, min_size=4, max_size=4, open=False) as pool,
            AsyncBatchingCounters(pool, max_pending=50, interval=0.05) as events,
        ):

            async def request(r: int) -> None:
                async with pool.connection() as conn:
                    await conn.set_autocommit(True)
                    async with events.transaction(conn) as group:
                        await conn.execute("INSERT INTO page VALUES (%s)", (100 + r,))
                        for i in range(10):
                            await group.incr("per_page", i % 3)
                        await asyncio.sleep(0)
                        if r % 3 == 0:
                            raise psycopg.Rollback()

            await asyncio.gather(*(request(r) for r in range(60)))

    asyncio.run(requests())
    row = pc.conn.execute("SELECT count(*) FROM page WHERE id >= 100").fetchone()
    assert row == (40,)
    # 40 committed requests, 10 increments each over keys 0, 1, 2 (4, 3, 3 of them)
    assert [pc.get("per_page", k) for k in range(3)] == [160, 120, 120]


def test_a_dropped_counter_holds_back_only_its_own_increments(dsn: str, pc: Counters) -> None:
    pc.create_counter("a", key=int)
    pc.create_counter("b", key=int)

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            events = AsyncBatchingCounters(aconn, interval=None)
            await events.incr("a", 1, 3)
            await events.incr("b", 1, 4)
            pc.drop_counter("b")
            with pytest.raises(BufferFlushFailed, match="'b' was dropped"):
                await events.flush()
            assert pc.get("a", 1) == 3  # the other counter's increment is written
            assert events.pending() == 1
            pc.create_counter("b", key=int)
            await events.flush()
            assert events.pending() == 0
            await events.aclose()

    asyncio.run(main())
    assert pc.get("b", 1) == 4
