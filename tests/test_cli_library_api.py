"""The library functions the command line calls: the wake-ups
(:func:`pgcounters.worker.enable_wakeups` and its siblings), the drain's statement timeout
(``Counters.drain(statement_timeout=...)``) and the choice of declared counters
(:func:`pgcounters.triggers.select_declared`)."""

from __future__ import annotations

import math
from typing import Any

import psycopg
import pytest

import blog_schema
from pgcounters import Counters, triggers
from pgcounters.connection import Conn
from pgcounters.errors import (
    ConfigurationError,
    DrainError,
    InvalidArgument,
    PgCountersError,
    SchemaError,
    UnknownCounter,
)
from pgcounters.worker import disable_wakeups, enable_wakeups, wakeup_interval


def test_wakeups_on_change_and_off(dsn: str, conn: Conn) -> None:
    assert wakeup_interval(conn) is None
    enable_wakeups(conn, 0.25)
    assert wakeup_interval(conn) == 0.25
    enable_wakeups(conn)  # again: the interval changes, 0.1 s by default
    assert wakeup_interval(conn) == 0.1
    with psycopg.connect(dsn, autocommit=True) as other:  # committed, seen by SQL
        assert other.execute("SELECT pgcounters.wakeup_interval_ms()").fetchone() == (100,)
    assert disable_wakeups(conn) is True
    assert wakeup_interval(conn) is None
    assert disable_wakeups(conn) is False


def test_wakeups_commit_their_own_transaction_or_join_the_caller_s(dsn: str) -> None:
    with (
        psycopg.connect(dsn) as conn,  # not autocommit
        psycopg.connect(dsn, autocommit=True) as other,
    ):
        enable_wakeups(conn, 2)
        assert wakeup_interval(other) == 2
        with conn.transaction():
            assert disable_wakeups(conn) is True
            assert wakeup_interval(other) == 2  # not before the caller commits
        assert wakeup_interval(other) is None


@pytest.mark.parametrize("bad", [0, -1, True, "1", math.nan, None])
def test_a_bad_interval_is_refused_and_changes_nothing(conn: Conn, bad: Any) -> None:
    enable_wakeups(conn, 0.5)
    with pytest.raises(ConfigurationError, match="must be positive"):
        enable_wakeups(conn, bad)
    assert wakeup_interval(conn) == 0.5


def test_an_interval_past_an_hour_is_the_database_s_error(conn: Conn) -> None:
    with pytest.raises(PgCountersError, match="between 1 ms and 1 hour"):
        enable_wakeups(conn, 7200)
    assert wakeup_interval(conn) is None


def test_wakeups_need_the_schema(empty_dsn: str) -> None:
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        for call in (lambda: enable_wakeups(conn), lambda: disable_wakeups(conn)):
            with pytest.raises(SchemaError):
                call()
        with pytest.raises(SchemaError):
            wakeup_interval(conn)


def _timeout(conn: Conn) -> str:
    row = conn.execute("SHOW statement_timeout").fetchone()
    assert row is not None
    return str(row[0])


def test_the_drain_s_statement_timeout_cancels_a_stuck_batch_and_is_put_back(
    dsn: str, conn: Conn, pc: Counters
) -> None:
    pc.create_counter("c", int)
    pc.incr("c", 1, 3)
    conn.execute("SET statement_timeout = '7s'")
    with psycopg.connect(dsn) as blocker:
        # a lock on the queue (an operator's LOCK TABLE) makes the batch wait
        blocker.execute("LOCK TABLE pgcounters.queue IN SHARE MODE")
        with pytest.raises(DrainError, match="cancelled by the statement timeout") as info:
            pc.drain(statement_timeout=0.2)
    assert isinstance(info.value.__cause__, psycopg.errors.QueryCanceled)
    assert pc.pending() == (1, 0)  # rolled back: the delta stays queued
    assert _timeout(conn) == "7s"  # the session's own setting again
    result = pc.drain(statement_timeout=30)
    assert (result.deltas, pc.get("c", 1, exact=False)) == (1, 3)
    assert _timeout(conn) == "7s"


def test_the_drain_s_statement_timeout_is_checked(conn: Conn, pc: Counters) -> None:
    pc.create_counter("c", int)
    pc.incr("c", 1)
    for bad in (-1, math.inf, math.nan, True, "5", 2_147_484):
        with pytest.raises(InvalidArgument, match="statement_timeout"):
            pc.drain(statement_timeout=bad)  # type: ignore[arg-type]
    assert pc.pending() == (1, 0)
    assert _timeout(conn) == "0"
    assert pc.drain(statement_timeout=0).deltas == 1  # 0: no limit
    assert _timeout(conn) == "0"


def test_select_declared_picks_named_counters_in_order_once(conn: Conn) -> None:
    assert triggers.select_declared(conn) == []
    with pytest.raises(UnknownCounter, match=r"named nope is recorded in this database$"):
        triggers.select_declared(conn, ["nope"])
    blog_schema.create(conn)
    specs = blog_schema.specs()
    triggers.install(conn, specs)
    every = triggers.select_declared(conn)
    assert [s.name for s in every] == sorted(s.name for s in specs)
    first, second = every[1].name, every[0].name
    chosen = triggers.select_declared(conn, [first, second, first])
    assert [s.name for s in chosen] == [first, second]
    with pytest.raises(UnknownCounter, match=r"named nope, nada .*\(declared: ") as info:
        triggers.select_declared(conn, [first, "nope", "nada"])
    assert second in str(info.value)
