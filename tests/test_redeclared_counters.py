"""A counter dropped and created again under its name while a long-lived client holds its
old declaration: the client's acknowledged increments reach the counter of that name now,
or fail at the call; its reads read the counter of that name now.

The increments used to go to the old id, be set aside by the drain, and the application
read 0 with nothing to tell it. Each way of dropping and creating it again is tried
(another client, plain SQL, the command line), and the first call after it is a write in
some tests and a read in others.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from pgcounters import (
    AsyncBatchingCounters,
    AsyncCounters,
    Bucket,
    Counters,
    CounterSpec,
    NamedTarget,
    cli,
    triggers,
)
from pgcounters.connection import Conn
from pgcounters.errors import UnknownCounter


def recreate_by_client(dsn: str, name: str, key: str | None, mode: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as other:
        pc = Counters(other)
        pc.drop_counter(name)
        pc.create_counter(name, key, mode)  # type: ignore[arg-type]


def recreate_by_sql(dsn: str, name: str, key: str | None, mode: str) -> None:
    """As a team working in psql would: the SQL functions, nothing of the client."""
    with psycopg.connect(dsn, autocommit=True) as other:
        other.execute("SELECT pgcounters.drop_counter(%s)", (name,))
        other.execute(
            "SELECT pgcounters.create_counter(%s, %s::text[], %s)",
            (name, [] if key is None else [key], mode),
        )


def recreate_by_cli(dsn: str, name: str, key: str | None, mode: str) -> None:
    assert cli.run(["--dsn", dsn, "drop", name]) == cli.EXIT_OK
    keys = [] if key is None else ["--key", key]
    assert cli.run(["--dsn", dsn, "create", name, *keys, "--mode", mode]) == cli.EXIT_OK


RECREATE: dict[str, Callable[[str, str, str | None, str], None]] = {
    "client": recreate_by_client,
    "sql": recreate_by_sql,
    "cli": recreate_by_cli,
}


def queued_rows(conn: Conn) -> tuple[int, int, int]:
    """Rows in the two queues and in the quarantine (plain counts)."""
    row = conn.execute(
        "SELECT (SELECT count(*) FROM pgcounters.queue),"
        " (SELECT count(*) FROM pgcounters.queue_unlogged),"
        " (SELECT count(*) FROM pgcounters.quarantine)"
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


def stored(conn: Conn, name: str, key: str) -> int:
    """The value of ``name`` at ``key`` after a drain, read by hand from the table."""
    row = conn.execute(
        "SELECT coalesce(sum(c.value), 0) FROM pgcounters.counters AS c"
        " JOIN pgcounters.targets AS t ON t.id = c.target_id"
        " WHERE t.name = %s AND c.key = %s::text[]",
        (name, key),
    ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("how", sorted(RECREATE))
@pytest.mark.parametrize("mode", ["queued", "unlogged", "direct"])
def test_a_long_lived_clients_increments_reach_the_counter_created_again(
    dsn: str, conn: Conn, pc: Counters, how: str, mode: str
) -> None:
    pc.create_counter("hits", key=int, mode=mode)  # type: ignore[arg-type]
    with psycopg.connect(dsn, autocommit=True) as own:
        old = Counters(own)
        old.incr("hits", 1, 2)  # caches the declaration
        RECREATE[how](dsn, "hits", "bigint", mode)
        for _ in range(5):
            old.incr("hits", 1)  # the first call after the drop is a write
        old.incr_many([("hits", 2, 3), ("hits", 1, 10)])
        assert old.get("hits", 1) == 15
        assert old.get_many("hits", [1, 2, 3]) == [15, 3, 0]
    pc.drain()
    assert queued_rows(conn) == (0, 0, 0)  # nothing set aside
    assert (stored(conn, "hits", "{1}"), stored(conn, "hits", "{2}")) == (15, 3)


@pytest.mark.parametrize("how", sorted(RECREATE))
def test_a_read_first_then_a_write_of_a_global_counter(
    dsn: str, conn: Conn, pc: Counters, how: str
) -> None:
    """The other order: the first call after the re-creation is a read, through the
    stale declaration, which must read the new counter (and the writes follow it)."""
    pc.create_counter("visits")
    with psycopg.connect(dsn, autocommit=True) as own:
        old = Counters(own)
        old.incr("visits", None, 40)
        RECREATE[how](dsn, "visits", None, "queued")
        pc.incr("visits", None, 7)
        assert old.get("visits") == 7
        old.incr("visits")
        assert old.get("visits", exact=True) == 8
    pc.drain()
    assert queued_rows(conn) == (0, 0, 0)
    assert stored(conn, "visits", "{}") == 8


def test_an_increment_of_a_dropped_counter_fails_at_the_call(
    dsn: str, conn: Conn, pc: Counters
) -> None:
    """Dropped and not created again: the call is refused, nothing is queued for the
    drain to set aside."""
    pc.create_counter("gone", key=int)
    pc.create_counter("kept", key=int)
    with psycopg.connect(dsn, autocommit=True) as own:
        old = Counters(own)
        old.incr_many([("gone", 1, 1), ("kept", 1, 1)])
        pc.drain()
        pc.drop_counter("gone")
        with pytest.raises(UnknownCounter):
            old.incr("gone", 1)
        with pytest.raises(UnknownCounter):
            old.incr_many([("kept", 1, 5), ("gone", 1, 1)])
        with pytest.raises(UnknownCounter):
            old.get("gone", 1)
    assert queued_rows(conn) == (0, 0, 0)
    assert stored(conn, "kept", "{1}") == 1  # incr_many wrote none of its items


def test_in_the_callers_transaction_the_increment_is_rolled_back_with_it(
    dsn: str, conn: Conn, pc: Counters
) -> None:
    """On a connection that is not in autocommit mode the write joins the caller's
    transaction, retried there (nothing was written by the refused statement)."""
    pc.create_counter("a", key=int)
    pc.create_counter("u", key=int, mode="unlogged")
    with psycopg.connect(dsn) as own:
        old = Counters(own)
        old.incr("a", 1)
        old.incr("u", 1)
        own.commit()
        recreate_by_sql(dsn, "a", "bigint", "queued")
        recreate_by_sql(dsn, "u", "bigint", "unlogged")
        old.incr("a", 1, 3)
        # two queues: several statements, in the transaction the first one opened
        old.incr_many([("a", 2, 4), ("u", 2, 5)])
        own.rollback()
        old.incr("a", 1, 6)
        old.incr_many([("a", 2, 7), ("u", 2, 8)])
        own.commit()
    pc.drain()
    assert queued_rows(conn) == (0, 0, 0)
    assert [stored(conn, "a", "{1}"), stored(conn, "a", "{2}"), stored(conn, "u", "{2}")] == [
        6,
        7,
        8,
    ]


def test_a_client_on_a_pool_follows_the_counter(dsn: str, conn: Conn, pc: Counters) -> None:
    pc.create_counter("p", key=int)
    with ConnectionPool(dsn, min_size=1, max_size=2, open=True) as pool:
        old = Counters(pool)
        old.incr("p", 1)
        recreate_by_cli(dsn, "p", "bigint", "queued")
        old.incr("p", 1, 4)
        old.incr_many([("p", 1, 5)])
        assert old.get("p", 1) == 9
    pc.drain()
    assert (queued_rows(conn), stored(conn, "p", "{1}")) == ((0, 0, 0), 9)


def test_the_async_client_follows_the_counter(dsn: str, conn: Conn, pc: Counters) -> None:
    pc.create_counter("q", key=int)
    pc.create_counter("gone")

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            old = AsyncCounters(aconn)
            await old.incr("q", 1)
            await old.incr("gone")
            recreate_by_sql(dsn, "q", "bigint", "queued")
            pc.drop_counter("gone")
            await old.incr("q", 1, 2)
            await old.incr_many([("q", 2, 3)])
            assert (await old.get("q", 1), await old.get_many("q", [2])) == (2, [3])
            with pytest.raises(UnknownCounter):
                await old.incr("gone")
            recreate_by_client(dsn, "q", "bigint", "queued")
            assert await old.get("q", 1) == 0  # a read first, then a write
            await old.incr("q", 1, 11)
        pool = AsyncConnectionPool(dsn, min_size=1, max_size=2, open=False)
        await pool.open(wait=True)
        async with pool:
            on_pool = AsyncCounters(pool)
            await on_pool.incr("q", 2, 1)
            recreate_by_cli(dsn, "q", "bigint", "queued")
            await on_pool.incr("q", 2, 13)
            await on_pool.incr_many([("q", 3, 17)])

    asyncio.run(main())
    pc.drain()
    assert queued_rows(conn) == (0, 0, 0)
    assert [stored(conn, "q", k) for k in ("{1}", "{2}", "{3}")] == [0, 13, 17]


def test_an_async_batcher_writes_to_the_counter_created_again(
    dsn: str, conn: Conn, pc: Counters
) -> None:
    pc.create_counter("b", key=int)

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            events = AsyncBatchingCounters(aconn, interval=None)
            await events.incr("b", 1, 1)
            await events.flush()
            recreate_by_sql(dsn, "b", "bigint", "queued")
            await events.incr("b", 1, 6)
            await events.flush()
            await events.aclose()

    asyncio.run(main())
    pc.drain()
    assert (queued_rows(conn), stored(conn, "b", "{1}")) == ((0, 0, 0), 6)


@pytest.mark.parametrize(
    "modes",
    [("queued",), ("unlogged",), ("direct",), ("queued", "unlogged", "direct")],
    ids=["queued", "unlogged", "direct", "three-kinds"],
)
def test_incr_many_as_the_first_call_after_the_re_creation(
    dsn: str, conn: Conn, pc: Counters, modes: tuple[str, ...]
) -> None:
    """One statement (one kind of counter), or several (each kind its own, checked
    first): all of them reach the counters created again."""
    names = [f"m_{mode}" for mode in modes]
    for name, mode in zip(names, modes, strict=True):
        pc.create_counter(name, key=int, mode=mode)  # type: ignore[arg-type]
    with psycopg.connect(dsn, autocommit=True) as own:
        old = Counters(own)
        old.incr_many([(name, 1, 100) for name in names])
        for name, mode in zip(names, modes, strict=True):
            recreate_by_sql(dsn, name, "bigint", mode)
        assert old.incr_many([(name, k, k) for name in names for k in (1, 2)]) == 2 * len(names)
    pc.drain()
    assert queued_rows(conn) == (0, 0, 0)
    assert [stored(conn, name, k) for name in names for k in ("{1}", "{2}")] == [1, 2] * len(names)


def test_range_reads_of_a_counter_per_period_declared_again(
    dsn: str, conn: Conn, pc: Counters
) -> None:
    """A counter per period uninstalled and installed again (a new id): a long-lived
    client's range reads read it, not 0 from the old id."""
    conn.execute(
        "CREATE TABLE visit (id bigserial PRIMARY KEY, page bigint, at timestamptz NOT NULL)"
    )
    spec = CounterSpec(
        name="visits_per_day",
        source="visit",
        keys=("page",),
        target=NamedTarget(("bigint",)),
        bucket=Bucket("at", "day", "Europe/Stockholm"),
    )
    triggers.install(conn, [spec])
    day = dt.date(2026, 5, 4)
    noon = dt.datetime(2026, 5, 4, 12, tzinfo=dt.UTC)
    visits = "INSERT INTO visit (page, at) VALUES (%s, %s)"
    conn.execute(visits, (1, noon))
    week = (day - dt.timedelta(days=6), day + dt.timedelta(days=1))
    with psycopg.connect(dsn, autocommit=True) as own:
        old, old_series = Counters(own), Counters(own)
        assert old.get_range("visits_per_day", 1, *week) == 1  # caches its id and periods
        assert old_series.get_series("visits_per_day", 1, day, day + dt.timedelta(days=1)) == [
            (day, 1)
        ]
        triggers.uninstall(conn, "visits_per_day", drop_values=True)
        triggers.install(conn, [spec])  # counts the visit written before (a backfill)
        for page in (1, 1, 2):
            conn.execute(visits, (page, noon))
        pc.drain()
        truth = conn.execute("SELECT page, count(*) FROM visit GROUP BY page ORDER BY page")
        assert truth.fetchall() == [(1, 3), (2, 1)]
        assert old.get_range("visits_per_day", 1, *week) == 3
        assert old_series.get_series("visits_per_day", 2, day, day + dt.timedelta(days=1)) == [
            (day, 1)
        ]
        assert old.top_range("visits_per_day", *week) == [((1,), 3), ((2,), 1)]
        triggers.uninstall(conn, "visits_per_day", drop_values=True)
        with pytest.raises(UnknownCounter):
            old.get_range("visits_per_day", 1, *week)
