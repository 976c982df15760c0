"""Bad input gets a clear error from the PgCountersError hierarchy and leaves no partial state."""

from __future__ import annotations

import datetime as dt
from typing import Any

import psycopg
import pytest

from pgcounters import (
    ConnectionFailed,
    CounterDefinitionConflict,
    CounterOverflow,
    Counters,
    DrainError,
    InvalidArgument,
    InvalidCounterDefinition,
    InvalidCounterName,
    InvalidDelta,
    InvalidKey,
    PgCountersError,
    UnknownCounter,
)
from pgcounters.config import connect
from pgcounters.connection import Conn

BIG = 2**63 - 1


@pytest.mark.parametrize(
    "name", ["", "1abc", "has space", "semi;colon", "quote'", "x" * 201, "é", None, 42]
)
def test_invalid_counter_names(pc: Counters, name: Any) -> None:
    with pytest.raises(InvalidCounterName):
        pc.create_counter(name)
    with pytest.raises(InvalidCounterName):
        pc.incr(name)
    assert pc.counters() == []


def test_the_database_enforces_names_too(conn: Conn, pc: Counters) -> None:
    # the SQL entry point refuses it with pgcounters' own code, the table's check stays
    with pytest.raises(psycopg.Error) as refused:
        conn.execute("SELECT pgcounters.create_counter('bad name')")
    assert refused.value.sqlstate == "PC007"
    with pytest.raises(psycopg.errors.CheckViolation):
        conn.execute("INSERT INTO pgcounters.targets (name) VALUES ('bad name')")
    assert pc.counters() == []


@pytest.mark.parametrize(
    ("key_types", "key"),
    [
        (int, "42"),
        (int, True),
        (int, 4.0),
        (int, 2**63),
        (int, None),
        ("uuid", "not-a-uuid"),
        ("uuid", 12),
        (dt.date, "2026-01-01"),
        (dt.date, dt.datetime(2026, 1, 1)),
        (str, 5),
        (str, "nul\x00byte"),
        (str, "x" * 1001),
        ((int, dt.date), 5),
        ((int, dt.date), (5,)),
        ((int, dt.date), (5, dt.date.today(), 1)),
        (None, 5),
    ],
)
def test_keys_of_the_wrong_type(pc: Counters, key_types: Any, key: Any) -> None:
    pc.create_counter("c", key_types)
    with pytest.raises(InvalidKey):
        pc.incr("c", key)
    with pytest.raises(InvalidKey):
        pc.get("c", key)
    assert pc.pending() == (0, 0)


def test_unknown_key_type_in_a_declaration(pc: Counters) -> None:
    with pytest.raises(InvalidKey, match="unknown key type"):
        pc.create_counter("c", float)
    with pytest.raises(InvalidKey):
        pc.create_counter("c", tuple([int] * 9))
    assert pc.counters() == []


@pytest.mark.parametrize("delta", [2**63, -(2**63) - 1, 1.5, "1", True, None])
def test_invalid_deltas(pc: Counters, delta: Any) -> None:
    pc.create_counter("c", int)
    with pytest.raises(InvalidDelta):
        pc.incr("c", 1, delta)
    with pytest.raises(InvalidDelta):
        pc.incr_many([("c", 1, 1), ("c", 2, delta)])
    assert pc.pending() == (0, 0)


def test_incr_many_whose_sum_overflows_writes_nothing(pc: Counters) -> None:
    pc.create_counter("c", int)
    with pytest.raises(InvalidDelta):
        pc.incr_many([("c", 1, BIG), ("c", 1, 1)])
    assert pc.pending() == (0, 0)


def test_incr_many_with_one_bad_item_writes_nothing(pc: Counters) -> None:
    pc.create_counter("c", int)
    with pytest.raises(InvalidKey):
        pc.incr_many([("c", 1, 1), ("c", "two", 1)])
    with pytest.raises(UnknownCounter):
        pc.incr_many([("c", 1, 1), ("nope", 1, 1)])
    assert pc.pending() == (0, 0)


def test_overflow_in_a_direct_counter(pc: Counters) -> None:
    pc.create_counter("d", int, mode="direct")
    pc.incr("d", 1, BIG)
    with pytest.raises(CounterOverflow):
        pc.incr("d", 1, 1)
    assert pc.get("d", 1) == BIG


def test_overflow_when_draining_sets_the_delta_aside_and_drains_the_rest(
    conn: Conn, pc: Counters
) -> None:
    pc.create_counter("q", int)
    pc.incr("q", 1, BIG)
    pc.drain()
    pc.incr("q", 1, 1)
    pc.incr("q", 2, 1)
    result = pc.drain()
    # the delta that would overflow is set aside with its error; the other is applied
    assert (result.deltas, result.quarantined) == (1, 1)
    assert pc.pending() == (0, 0)
    assert pc.get("q", 1, exact=False) == BIG
    assert pc.get("q", 2, exact=False) == 1
    assert conn.execute("SELECT key, delta, sqlstate FROM pgcounters.quarantine").fetchall() == [
        ("{1}", 1, "22003")
    ]


def test_unknown_counter(pc: Counters) -> None:
    with pytest.raises(UnknownCounter, match="nope"):
        pc.incr("nope")
    with pytest.raises(UnknownCounter):
        pc.get("nope")


def test_conflicting_definitions(pc: Counters) -> None:
    pc.create_counter("c", int)
    with pytest.raises(CounterDefinitionConflict):
        pc.create_counter("c", str)
    with pytest.raises(CounterDefinitionConflict):
        pc.create_counter("c", int, mode="direct")
    assert [(c.name, c.key_types, c.mode) for c in pc.counters()] == [("c", ("bigint",), "queued")]


def test_bad_modes_and_column_targets(pc: Counters, conn: Conn) -> None:
    with pytest.raises(InvalidCounterDefinition):
        pc.create_counter("c", int, mode="fast")  # type: ignore[arg-type]
    with pytest.raises(InvalidCounterDefinition):
        pc.create_column_counter("c", "no_such_table", "n")
    conn.execute("CREATE TABLE t (id int PRIMARY KEY, n int, label text)")
    with pytest.raises(InvalidCounterDefinition, match="does not exist"):
        pc.create_column_counter("c", "t", "missing")
    with pytest.raises(InvalidCounterDefinition, match="integer type"):
        pc.create_column_counter("c", "t", "label")
    with pytest.raises(InvalidCounterDefinition, match="key column"):
        pc.create_column_counter("c", "t", "n", key_column="nope")
    assert pc.counters() == []


def test_a_dsn_that_does_not_connect() -> None:
    with pytest.raises(ConnectionFailed, match=r"\*\*\*") as info:
        connect("host=127.0.0.1 port=1 user=x password=secret dbname=x connect_timeout=2")
    assert "secret" not in str(info.value)
    with pytest.raises(ConnectionFailed):
        connect("this is not a dsn")


def test_drain_inside_a_transaction_is_refused(dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        pc = Counters(conn)
        pc.create_counter("c")
        pc.incr("c")
        with pytest.raises(DrainError, match="outside a transaction"):
            pc.drain()
        conn.rollback()
        with pytest.raises(InvalidArgument, match="positive"):
            pc.drain(0)


@pytest.mark.parametrize(
    "bound",
    [
        {"max_batches": -1},
        {"max_batches": "2"},
        {"max_batches": 1.5},
        {"time_limit": float("nan")},
        {"time_limit": -0.5},
        {"time_limit": "1"},
        {"max_batch_size": 0},
        {"max_batch_size": 2**31},
        {"max_batch_size": True},
    ],
)
def test_bad_drain_bounds_are_refused_before_any_batch(pc: Counters, bound: Any) -> None:
    pc.create_counter("c")
    pc.incr("c")
    with pytest.raises(InvalidArgument, match=next(iter(bound))):
        pc.drain(**bound)
    assert pc.pending() == (1, 0)


@pytest.mark.parametrize("timeout", [float("nan"), float("inf"), -1, "5", None, True])
def test_a_bad_replay_timeout_is_refused_even_on_a_primary(pc: Counters, timeout: Any) -> None:
    position = pc.wal_position()
    with pytest.raises(InvalidArgument, match="timeout"):
        pc.wait_for_replay(position, timeout=timeout)
    assert pc.wait_for_replay(position, timeout=0) >= 0


def test_every_error_is_a_pgcounters_error() -> None:
    for cls in (ConnectionFailed, CounterOverflow, InvalidKey, UnknownCounter, DrainError):
        assert issubclass(cls, PgCountersError)
        assert str(cls())  # the docstring is the default message


def test_every_error_of_the_hierarchy_is_exported_by_the_package() -> None:
    import inspect

    import pgcounters
    from pgcounters import errors

    classes = {
        name
        for name, value in inspect.getmembers(errors, inspect.isclass)
        if issubclass(value, errors.PgCountersError) and value.__module__ == errors.__name__
    }
    assert classes <= set(pgcounters.__all__)
    assert all(getattr(pgcounters, name) is getattr(errors, name) for name in classes)
