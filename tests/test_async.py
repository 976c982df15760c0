"""The async clients (AsyncCounters, AsyncQuotas) and the sync clients on a pool.

Every test talks to a real PostgreSQL; the async ones run their own event loop.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import inspect
import threading
from collections import Counter as Tally
from collections.abc import Awaitable, Callable
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from pgcounters import (
    AsyncCounters,
    AsyncQuotas,
    Counters,
    CounterSpec,
    NamedTarget,
    Quotas,
    triggers,
)
from pgcounters.connection import Conn
from pgcounters.errors import (
    ConfigurationError,
    CounterOverflow,
    DrainError,
    InvalidArgument,
    InvalidCost,
    InvalidCounterDefinition,
    InvalidDelta,
    InvalidKey,
    InvalidSubject,
    PgCountersError,
    UnknownCounter,
    UnknownQuota,
)
from pgcounters.sqlfiles import query
from support import lock_waiters

T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)


def _public_methods(cls: type) -> dict[str, Any]:
    return {
        name: member
        for name, member in inspect.getmembers(cls)
        if not name.startswith("_") and inspect.isfunction(member)
    }


@pytest.mark.parametrize(("sync", "twin"), [(Counters, AsyncCounters), (Quotas, AsyncQuotas)])
def test_every_public_method_has_an_async_twin_with_the_same_signature(
    sync: type, twin: type
) -> None:
    sync_methods = _public_methods(sync)
    async_methods = _public_methods(twin)
    assert sorted(sync_methods) == sorted(async_methods)
    assert len(sync_methods) >= 14
    for name, method in sync_methods.items():
        other = async_methods[name]
        assert inspect.signature(method) == inspect.signature(other), name
        # a method that reads or writes the database is awaited; the others are not
        assert inspect.iscoroutinefunction(other) != (name == "commits_asynchronously"), name
        assert other.__doc__, name
        assert other.__doc__ == method.__doc__, name
    for prop in ("conn", "pool"):
        assert isinstance(getattr(sync, prop), property)
        assert isinstance(getattr(twin, prop), property)


def test_each_client_refuses_the_other_kind_of_connection(dsn: str, conn: Conn) -> None:
    with pytest.raises(ConfigurationError, match="use Counters"):
        AsyncCounters(conn)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="use Quotas"):
        AsyncQuotas(conn)  # type: ignore[arg-type]

    async def main() -> None:
        aconn = await psycopg.AsyncConnection.connect(dsn)
        async with aconn:
            with pytest.raises(ConfigurationError, match="use AsyncCounters"):
                Counters(aconn)  # type: ignore[arg-type]
            with pytest.raises(ConfigurationError, match="use AsyncQuotas"):
                Quotas(aconn)  # type: ignore[arg-type]

    asyncio.run(main())


def test_async_counters_declare_increment_read_rank_and_drain(dsn: str, conn: Conn) -> None:
    async def main() -> None:
        aconn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        async with aconn:
            pc = AsyncCounters(aconn)
            views = await pc.create_counter("views", int)
            likes = await pc.create_counter("likes", int, mode="direct")
            assert (await pc.counter("views")) == views
            assert [c.name for c in await pc.counters()] == ["likes", "views"]
            for article in (1, 2, 2, 3, 3, 3):
                assert await pc.incr("views", article) is None
            assert await pc.incr("likes", 7, 5) == 5
            assert await pc.incr("likes", 7) == 6
            assert await pc.incr_many([("views", 1, 10), ("likes", 8, 2), ("likes", 7, -1)]) == 3
            assert await pc.pending() == (7, 0)
            assert await pc.get("views", 1) == 11
            assert await pc.get("views", 1, exact=False) == 0
            assert await pc.get_many("views", [3, 1, 99]) == [3, 11, 0]
            drained = await pc.drain()
            assert drained.deltas == 7
            assert await pc.pending() == (0, 0)
            assert await pc.top("views", 2) == [((1,), 11), ((3,), 3)]
            assert await pc.top("likes") == [((7,), 5), ((8,), 2)]
            assert await pc.drain_batch() == (0, 0)
            assert (await pc.drain_queue_batch()).done
            assert isinstance(await pc.wal_position(), str)
            assert await pc.wait_for_replay(await pc.wal_position()) >= 0
            assert await pc.drop_counter("likes") is True
            assert await pc.drop_counter("likes") is False
            assert likes.mode == "direct"

    asyncio.run(main())
    # the sync client on another connection sees the same state
    sync = Counters(conn)
    assert sync.get_many("views", [1, 2, 3]) == [11, 2, 3]
    assert [c.name for c in sync.counters()] == ["views"]


def test_async_calls_join_the_callers_transaction_and_roll_back_with_it(
    dsn: str, conn: Conn
) -> None:
    sync = Counters(conn)
    sync.create_counter("views", int)
    sync.create_counter("likes", int, mode="direct")
    Quotas(conn).define_quota("api", 5)

    async def main() -> None:
        aconn = await psycopg.AsyncConnection.connect(dsn)
        async with aconn:
            pc = AsyncCounters(aconn)
            quotas = AsyncQuotas(aconn)

            async def abandoned() -> None:
                async with aconn.transaction():
                    await pc.incr("views", 1, 3)
                    assert await pc.incr("likes", 1, 4) == 4
                    await pc.incr_many([("views", 2, 1), ("likes", 2, 1)])
                    assert (await quotas.register_call("api", "alice")).used == 1
                    # the transaction sees its own writes
                    assert await pc.get("views", 1) == 3
                    raise RuntimeError("abandon")

            with pytest.raises(RuntimeError, match="abandon"):
                await abandoned()
            # outside an explicit block the calls open a transaction the caller commits
            await pc.incr("views", 1, 1)
            assert aconn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
            await aconn.rollback()

    asyncio.run(main())
    assert sync.get_many("views", [1, 2]) == [0, 0]
    assert sync.get_many("likes", [1, 2]) == [0, 0]
    assert sync.pending() == (0, 0)
    assert Quotas(conn).status("api", "alice").used == 0


def _sync_and_async_errors(
    dsn: str, conn: Conn, calls: list[tuple[str, Callable[[Any], Any]]], make: str
) -> list[tuple[str, type[BaseException], str, type[BaseException], str]]:
    """Each call made on the sync client and on the async one: the errors raised."""
    sync_client: Any = Counters(conn) if make == "counters" else Quotas(conn)
    raised: list[tuple[str, type[BaseException], str]] = []
    for label, call in calls:
        try:
            call(sync_client)
        except Exception as exc:
            raised.append((label, type(exc), str(exc)))
        else:
            raise AssertionError(f"{label}: no error from the sync client")
        conn.rollback()

    async def main() -> list[tuple[type[BaseException], str]]:
        got: list[tuple[type[BaseException], str]] = []
        aconn = await psycopg.AsyncConnection.connect(dsn)
        async with aconn:
            client: Any = AsyncCounters(aconn) if make == "counters" else AsyncQuotas(aconn)
            for label, call in calls:
                try:
                    await call(client)
                except Exception as exc:
                    got.append((type(exc), str(exc)))
                else:
                    raise AssertionError(f"{label}: no error from the async client")
                await aconn.rollback()
        return got

    async_raised = asyncio.run(main())
    return [(a[0], a[1], a[2], b[0], b[1]) for a, b in zip(raised, async_raised, strict=True)]


def test_async_counters_raise_the_sync_clients_errors(dsn: str, conn: Conn) -> None:
    setup = Counters(conn)
    setup.create_counter("views", int)
    setup.create_counter("likes", int, mode="direct")
    setup.incr("likes", 1, 2**63 - 1)
    conn.commit()

    def in_transaction(client: Any) -> Any:
        if isinstance(client, Counters):
            with client.conn.transaction():
                return client.drain()

        async def go() -> Any:
            async with client.conn.transaction():
                return await client.drain()

        return go()

    calls: list[tuple[str, Callable[[Any], Any]]] = [
        ("unknown counter", lambda c: c.incr("nope", 1)),
        ("bad key", lambda c: c.incr("views", "not an int")),
        ("bad delta", lambda c: c.incr("views", 1, 1.5)),
        ("missing table", lambda c: c.create_column_counter("x", "no_such_table", "n")),
        ("bad mode", lambda c: c.create_counter("y", int, mode="sometimes")),
        ("overflow", lambda c: c.incr("likes", 1)),
        ("bad n", lambda c: c.top("views", -1)),
        ("bad item", lambda c: c.incr_many([("views", 1)])),
        ("drain in a transaction", in_transaction),
        ("bad batch size", lambda c: c.drain_batch(0)),
    ]
    results = _sync_and_async_errors(dsn, conn, calls, "counters")
    expected = {
        "unknown counter": UnknownCounter,
        "bad key": InvalidKey,
        "bad delta": PgCountersError,
        "missing table": InvalidCounterDefinition,
        "bad mode": InvalidCounterDefinition,
        "overflow": CounterOverflow,
        "bad n": InvalidArgument,
        "bad item": InvalidArgument,
        "drain in a transaction": DrainError,
        "bad batch size": InvalidArgument,
    }
    for label, sync_type, sync_text, async_type, async_text in results:
        assert sync_type is async_type, label
        assert sync_text == async_text, label
        assert issubclass(sync_type, expected[label]), label


def test_async_quotas_raise_the_sync_clients_errors(dsn: str, conn: Conn) -> None:
    Quotas(conn).define_quota("api", 5)
    conn.commit()
    calls: list[tuple[str, Callable[[Any], Any]]] = [
        ("unknown quota", lambda q: q.register_call("nope", "alice")),
        ("blank subject", lambda q: q.register_call("api", " ")),
        ("bad cost", lambda q: q.register_call("api", "alice", 0)),
        ("unknown quota status", lambda q: q.status("nope", "alice")),
    ]
    expected = {
        "unknown quota": UnknownQuota,
        "blank subject": InvalidSubject,
        "bad cost": InvalidCost,
        "unknown quota status": UnknownQuota,
    }
    for label, sync_type, sync_text, async_type, async_text in _sync_and_async_errors(
        dsn, conn, calls, "quotas"
    ):
        assert (sync_type, sync_text) == (async_type, async_text), label
        assert sync_type is expected[label], label


async def _gather(tasks: int, work: Callable[[int], Awaitable[None]]) -> None:
    await asyncio.gather(*(work(t) for t in range(tasks)))


def test_many_tasks_incrementing_through_an_async_pool_are_exact(dsn: str, conn: Conn) -> None:
    tasks, per_task = 24, 40
    truth: Tally[int] = Tally()
    returned: dict[int, list[int]] = {k: [] for k in range(5)}

    async def main() -> None:
        pool = AsyncConnectionPool(dsn, min_size=4, max_size=8, open=False)
        await pool.open()
        async with pool:
            pc = AsyncCounters(pool)
            await pc.create_counter("views", int)
            await pc.create_counter("likes", int, mode="direct")

            async def work(task: int) -> None:
                for i in range(per_task):
                    key = (task + i) % 5
                    await pc.incr("views", key, 1 + i % 3)
                    truth[key] += 1 + i % 3
                    value = await pc.incr("likes", key)
                    assert value is not None
                    returned[key].append(value)

            await _gather(tasks, work)
            # a drain from the pool too, while nothing writes
            assert (await pc.drain()).deltas == tasks * per_task
            assert await pc.get_many("views", range(5)) == [truth[k] for k in range(5)]

    asyncio.run(main())
    sync = Counters(conn)
    assert sync.get_many("views", range(5), exact=False) == [truth[k] for k in range(5)]
    # every direct increment got its own value back: 1, 2, ... n per key, none twice
    for key, values in returned.items():
        assert sorted(values) == list(range(1, len(values) + 1)), key
    assert sum(len(v) for v in returned.values()) == tasks * per_task


def test_tasks_sharing_one_async_connection_are_exact(dsn: str, conn: Conn) -> None:
    async def main() -> None:
        aconn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        async with aconn:
            pc = AsyncCounters(aconn)
            await pc.create_counter("views", int)

            async def work(task: int) -> None:
                for _ in range(25):
                    await pc.incr("views", task % 3)
                    assert await pc.get("views", task % 3) >= 1

            await _gather(12, work)

    asyncio.run(main())
    assert Counters(conn).get_many("views", [0, 1, 2]) == [100, 100, 100]


def test_async_quotas_never_grant_one_call_over_the_limit(dsn: str, conn: Conn) -> None:
    limit, callers = 25, 60
    decisions: list[bool] = []

    async def main() -> None:
        pool = AsyncConnectionPool(dsn, min_size=4, max_size=8, open=False)
        await pool.open()
        async with pool:
            quotas = AsyncQuotas(pool, clock=lambda: T0)
            await quotas.define_quota("api", limit, window="hour")
            assert [q.name for q in await quotas.quotas()] == ["api"]
            await quotas.set_limit("api", "vip", 100)
            assert [lim.limit for lim in await quotas.limits("api")] == [100]

            async def call(i: int) -> None:
                decisions.append((await quotas.register_call("api", "alice")).allowed)

            await _gather(callers, call)
            status = await quotas.status("api", "alice")
            assert (status.used, status.attempts, status.rejected) == (limit, callers, 35)
            [usage] = await quotas.report("api")
            assert (usage.subject, usage.used, usage.rejected) == ("alice", limit, 35)
            [worst] = await quotas.top_rejected("api")
            assert (worst.subject, worst.rejected) == ("alice", 35)
            assert await quotas.logged_calls("api") == []
            assert await quotas.remove_limits("api", "vip") == 1
            purged = await quotas.purge(T0 + dt.timedelta(days=1))
            assert purged.windows == 1
            assert await quotas.drop_quota("api") is True
            assert not quotas.commits_asynchronously()

    asyncio.run(main())
    assert decisions.count(True) == limit
    assert len(decisions) == callers


def test_sync_counters_on_a_connection_pool_from_many_threads(dsn: str, conn: Conn) -> None:
    threads, per_thread = 8, 50
    truth: Tally[int] = Tally()
    lock = threading.Lock()
    with ConnectionPool(dsn, min_size=2, max_size=4, open=True) as pool:
        pc = Counters(pool)
        assert pc.pool is pool
        with pytest.raises(ConfigurationError, match="pool"):
            _ = pc.conn
        pc.create_counter("views", int)
        pc.create_counter("likes", int, mode="direct")
        errors: list[BaseException] = []

        def work(t: int) -> None:
            try:
                for i in range(per_thread):
                    key = (t * 7 + i) % 4
                    pc.incr("views", key)
                    pc.incr("likes", key, 2)
                    with lock:
                        truth[key] += 1
            except BaseException as exc:  # pragma: no cover - shown by the assertion
                errors.append(exc)

        workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        assert errors == []
        # each call committed on its own: another connection sees everything
        assert Counters(conn).get_many("views", range(4)) == [truth[k] for k in range(4)]
        assert Counters(conn).get_many("likes", range(4)) == [2 * truth[k] for k in range(4)]
        quotas = Quotas(pool, clock=lambda: T0)
        quotas.define_quota("api", 3)
        assert [quotas.register_call("api", "bob").allowed for _ in range(4)] == [
            True,
            True,
            True,
            False,
        ]
        assert pc.drain().deltas == threads * per_thread
    assert sum(truth.values()) == threads * per_thread


def test_asynchronous_commit_on_a_pool_follows_its_connections_autocommit(
    dsn: str, conn: Conn
) -> None:
    Quotas(conn).define_quota("api", 10)
    with ConnectionPool(dsn, min_size=1, max_size=2, kwargs={"autocommit": True}) as pool:
        assert Quotas(pool, synchronous_commit=False).commits_asynchronously()
        assert not Quotas(pool).commits_asynchronously()
        assert Quotas(pool, synchronous_commit=False).register_call("api", "ann").allowed
    with ConnectionPool(dsn, min_size=1, max_size=2) as pool:
        assert not Quotas(pool, synchronous_commit=False).commits_asynchronously()
        # each call is committed by the pool's connection block all the same
        assert Quotas(pool, synchronous_commit=False).register_call("api", "ann").used == 2
    assert Quotas(conn).status("api", "ann").used == 2

    async def main() -> None:
        pool = AsyncConnectionPool(dsn, kwargs={"autocommit": True}, open=False)
        await pool.open()
        async with pool:
            quotas = AsyncQuotas(pool, synchronous_commit=False)
            assert quotas.commits_asynchronously()
            assert (await quotas.register_call("api", "ann")).used == 3

    asyncio.run(main())


def test_async_decimal_twins_and_the_drains_statement_timeout(dsn: str, conn: Conn) -> None:
    conn.execute(
        "CREATE TABLE shop_line (id bigserial PRIMARY KEY,"
        " day date NOT NULL DEFAULT '2026-11-21', amount numeric(10, 2))"
    )
    spec = CounterSpec(
        name="shop.per_day",
        source="shop_line",
        keys=("day",),
        target=NamedTarget(("date",)),
        sum="amount",
        scale=2,
    )
    triggers.install(conn, [spec])
    conn.execute("INSERT INTO shop_line (amount) VALUES (1.25), (2.50)")
    day, other = dt.date(2026, 11, 21), dt.date(2026, 11, 22)

    async def timeout(aconn: psycopg.AsyncConnection[Any]) -> object:
        cur = await aconn.execute("SHOW statement_timeout")
        row = await cur.fetchone()
        return None if row is None else row[0]

    async def main() -> None:
        aconn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        async with aconn:
            pc = AsyncCounters(aconn)
            assert await pc.incr_decimal("shop.per_day", day, Decimal("0.05")) is None
            with pytest.raises(InvalidDelta, match="2 decimal places"):
                await pc.incr_decimal("shop.per_day", day, Decimal("0.001"))
            assert await pc.get_decimal("shop.per_day", day) == Decimal("3.80")
            assert await pc.get_many_decimal("shop.per_day", [day, other]) == [
                Decimal("3.80"),
                Decimal("0.00"),
            ]
            with pytest.raises(InvalidCounterDefinition, match="get_decimal"):
                await pc.get("shop.per_day", day)
            await aconn.execute("SET statement_timeout = '7s'")
            for bad in (-1, True, 2_147_484):
                with pytest.raises(InvalidArgument, match="statement_timeout"):
                    await pc.drain(statement_timeout=bad)
            with psycopg.connect(dsn) as blocker:
                # a lock on the queue makes the batch wait until the timeout cancels it
                blocker.execute("LOCK TABLE pgcounters.queue IN SHARE MODE")
                with pytest.raises(DrainError, match="cancelled by the statement timeout"):
                    await pc.drain(statement_timeout=0.2)
            # rolled back: the deltas stay queued (the INSERT's one per key, the increment)
            assert await pc.pending() == (2, 0)
            assert await timeout(aconn) == "7s"  # the session's own setting again
            assert (await pc.drain(statement_timeout=30)).deltas == 2
            assert await timeout(aconn) == "7s"
            ranked = await pc.top_decimal("shop.per_day")
            assert [(k[0], str(v)) for k, v in ranked] == [(day, "3.80")]

    asyncio.run(main())


def test_a_cancelled_or_failed_async_drain_puts_the_statement_timeout_back(
    dsn: str, conn: Conn
) -> None:
    """On a pool of one connection: a drain cancelled while its batch waits for a lock, then
    a drain whose stop callback raises, leave the connection's statement_timeout as it was."""
    Counters(conn).create_counter("views", int)
    Counters(conn).incr("views", 1)

    async def timeout_of(pool: AsyncConnectionPool[Any]) -> object:
        async with pool.connection() as aconn:
            cur = await aconn.execute("SHOW statement_timeout")
            row = await cur.fetchone()
            return None if row is None else row[0]

    def failing_stop() -> bool:
        raise RuntimeError("the stop callback broke")

    async def main() -> None:
        async with AsyncConnectionPool(dsn, min_size=1, max_size=1, open=False) as pool:
            counters = AsyncCounters(pool)
            assert await timeout_of(pool) == "0"
            with psycopg.connect(dsn) as blocker:
                blocker.execute("LOCK TABLE pgcounters.queue IN SHARE MODE")
                task = asyncio.create_task(counters.drain(statement_timeout=30))
                while lock_waiters(conn) == 0:  # the batch waits for the lock
                    await asyncio.sleep(0.01)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                blocker.rollback()
            assert await timeout_of(pool) == "0"
            assert await counters.pending() == (1, 0)  # the cancelled batch rolled back
            with pytest.raises(RuntimeError, match="stop callback"):
                await counters.drain(statement_timeout=30, stop=failing_stop)
            assert await timeout_of(pool) == "0"
            assert (await counters.drain(statement_timeout=30)).deltas == 1
            assert await timeout_of(pool) == "0"

    asyncio.run(main())


def test_a_first_drain_outside_autocommit_commits_its_batches(dsn: str, conn: Conn) -> None:
    """The schema check of a new client's first drain runs in a transaction of its own: on a
    connection outside autocommit it used to open one, in which every batch was only a
    savepoint, committed by nobody."""
    Counters(conn).create_counter("views", int)
    Counters(conn).incr("views", 1)

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(dsn) as aconn:
            assert not aconn.autocommit
            assert (await AsyncCounters(aconn).drain()).deltas == 1
            assert aconn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE

    asyncio.run(main())
    with psycopg.connect(dsn) as sync_conn:
        Counters(conn).incr("views", 1)
        assert Counters(sync_conn).drain().deltas == 1
        assert sync_conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert Counters(conn).get("views", 1, exact=False) == 2


def _traced(pgconn: psycopg.pq.abc.PGconn, path: Any) -> Any:
    """Start libpq's trace of ``pgconn``'s protocol messages into the file at ``path``."""
    handle = open(path, "w")  # noqa: SIM115 (closed by the caller)
    pgconn.trace(handle.fileno())
    pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS | psycopg.pq.Trace.REGRESS_MODE)
    return handle


def _sent(path: Any) -> list[str]:
    """The messages the client sent (``F``), as libpq's trace writes them."""
    lines = path.read_text().splitlines()
    return [line.split("\t", 1)[1] for line in lines if line.startswith("F\t")]


def test_incr_sends_what_psycopgs_own_execute_sends(dsn: str, pc: Counters, tmp_path: Any) -> None:
    """On the wire (libpq's trace), an awaited incr() of a queued counter is psycopg's own
    ``await conn.execute()`` of the same statement: the same messages, no more round trips,
    on a connection and through a pool; the sync client's too."""
    counter = pc.create_counter("wire", key=int)
    statement = query("enqueue")  # an INSERT of one delta, written while its counter exists
    params = (counter.id, "{7}", 1)

    async def on_connection(conn: psycopg.AsyncConnection[Any]) -> tuple[list[str], list[str]]:
        apc = AsyncCounters(conn)
        for _ in range(6):  # past psycopg's prepare threshold, and the declaration cached
            await apc.incr("wire", 7)
        sides = []
        for side in ("ours", "psycopg"):
            handle = _traced(conn.pgconn, tmp_path / side)
            if side == "ours":
                await apc.incr("wire", 7)
            else:
                await conn.execute(statement, params)
            conn.pgconn.untrace()
            handle.close()
            sides.append(_sent(tmp_path / side))
        return sides[0], sides[1]

    async def main() -> None:
        aconn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        async with aconn:
            ours, theirs = await on_connection(aconn)
            assert ours == theirs
            assert [m.split("\t")[1] for m in ours] == ["Bind", "Describe", "Execute", "Sync"]
        async with AsyncConnectionPool(
            dsn, min_size=1, max_size=1, kwargs={"autocommit": True}, open=False
        ) as pool:
            apc = AsyncCounters(pool)
            for _ in range(6):
                await apc.incr("wire", 7)
            async with pool.connection() as conn:
                handle = _traced(conn.pgconn, tmp_path / "pool")
            await apc.incr("wire", 7)
            async with pool.connection() as conn:
                conn.pgconn.untrace()
                handle.close()
                await conn.execute(statement, params)
            assert _sent(tmp_path / "pool") == ours  # the pool's check-out and return: nothing

    asyncio.run(main())
    with psycopg.connect(dsn, autocommit=True) as conn:
        spc = Counters(conn)
        for _ in range(6):
            spc.incr("wire", 7)
        handle = _traced(conn.pgconn, tmp_path / "sync")
        spc.incr("wire", 7)
        conn.pgconn.untrace()
        handle.close()
        assert [m.split("\t")[1] for m in _sent(tmp_path / "sync")] == [
            "Bind",
            "Describe",
            "Execute",
            "Sync",
        ]
    assert pc.get("wire", 7) == 6 + 1 + 1 + 6 + 1 + 1 + 6 + 1
