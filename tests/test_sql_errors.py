"""The SQL entry points refuse bad input with pgcounters' own SQLSTATEs (class PC), which
the Python package turns into its own exceptions, and write nothing: a bad counter name,
key type or mode; a direct counter's value leaving the bigint range (the error names the
counter and the key); a negative count."""

from __future__ import annotations

import psycopg
import pytest

from pgcounters import (
    Bucket,
    CounterOverflow,
    Counters,
    CounterSpec,
    InvalidArgument,
    InvalidCounterDefinition,
    InvalidCounterName,
    InvalidDelta,
    NamedTarget,
    PgCountersError,
    triggers,
)
from pgcounters.connection import Conn
from pgcounters.dberrors import translate

BIGINT_MAX = 2**63 - 1


def _refused(conn: Conn, statement: str, params: tuple[object, ...] = ()) -> psycopg.Error:
    with pytest.raises(psycopg.Error) as refused:
        conn.execute(statement, params)
    return refused.value


def _counters(conn: Conn) -> list[tuple[str, list[str], str]]:
    return conn.execute("SELECT name, key_types, mode FROM pgcounters.targets").fetchall()


@pytest.mark.parametrize(
    ("name", "key_types", "mode", "sqlstate", "error"),
    [
        ("bad name", [], "queued", "PC007", InvalidCounterName),
        ("1st", [], "queued", "PC007", InvalidCounterName),
        ("x" * 201, [], "queued", "PC007", InvalidCounterName),
        (None, [], "queued", "PC007", InvalidCounterName),
        ("c", ["int"], "queued", "PC002", InvalidCounterDefinition),
        ("c", ["bigint", None], "queued", "PC002", InvalidCounterDefinition),
        ("c", ["bigint"] * 9, "queued", "PC002", InvalidCounterDefinition),
        ("c", [["bigint"], ["text"]], "queued", "PC002", InvalidCounterDefinition),
        ("c", None, "queued", "PC002", InvalidCounterDefinition),
        ("c", ["bigint"], "fast", "PC002", InvalidCounterDefinition),
        ("c", ["bigint"], None, "PC002", InvalidCounterDefinition),
    ],
)
def test_create_counter_refuses_a_bad_definition_with_its_own_code(
    conn: Conn,
    name: str | None,
    key_types: list[object] | None,
    mode: str | None,
    sqlstate: str,
    error: type[PgCountersError],
) -> None:
    refused = _refused(
        conn, "SELECT pgcounters.create_counter(%s, %s::text[], %s)", (name, key_types, mode)
    )
    assert refused.sqlstate == sqlstate
    assert type(translate(refused)) is error
    assert _counters(conn) == []


def test_create_column_counter_refuses_a_bad_name_or_mode_with_its_own_code(conn: Conn) -> None:
    conn.execute("CREATE TABLE post (id bigint PRIMARY KEY, likes bigint NOT NULL DEFAULT 0)")
    for name, mode, sqlstate in (
        ("post likes", "queued", "PC007"),
        ("post.likes", "sometimes", "PC002"),
        ("post.likes", None, "PC002"),
    ):
        refused = _refused(
            conn,
            "SELECT pgcounters.create_column_counter(%s, 'post', 'likes', 'id', %s)",
            (name, mode),
        )
        assert refused.sqlstate == sqlstate, (name, mode)
    refused = _refused(conn, "SELECT pgcounters.create_column_counter('p', NULL, 'likes')")
    assert refused.sqlstate == "PC002"
    # a table that does not exist fails at the cast of the argument, before the call
    refused = _refused(conn, "SELECT pgcounters.create_column_counter('p', 'nosuch', 'likes')")
    assert refused.sqlstate == "42P01"
    assert type(translate(refused)) is InvalidCounterDefinition
    assert _counters(conn) == []
    # a good one is made
    conn.execute("SELECT pgcounters.create_column_counter('post.likes', 'post', 'likes')")
    assert _counters(conn) == [("post.likes", ["bigint"], "queued")]


@pytest.mark.parametrize(
    ("key_types", "key"),
    [(["bigint"], ["7"]), (["text"], ["seven"]), ([], [])],
)
def test_a_direct_counters_overflow_names_the_counter(
    conn: Conn, key_types: list[str], key: list[str]
) -> None:
    conn.execute("SELECT pgcounters.create_counter('d', %s::text[], 'direct')", (key_types,))
    conn.execute("SELECT pgcounters.incr('d', %s, %s)", (key, BIGINT_MAX - 1))
    for delta in (2, BIGINT_MAX):
        refused = _refused(conn, "SELECT pgcounters.incr('d', %s, %s)", (key, delta))
        assert refused.sqlstate == "PC008"
        message = refused.diag.message_primary or ""
        assert message.startswith("counter d key {" + ",".join(key) + "}: "), message
        assert type(translate(refused)) is CounterOverflow
    # below the range too; one increment less fits
    conn.execute("SELECT pgcounters.incr('d', %s, %s)", (key, -BIGINT_MAX + 1))
    assert conn.execute("SELECT pgcounters.get('d', %s)", (key,)).fetchone() == (0,)
    conn.execute("SELECT pgcounters.incr('d', %s, %s)", (key, -BIGINT_MAX))
    conn.execute("SELECT pgcounters.incr('d', %s, -1)", (key,))  # the least bigint
    refused = _refused(conn, "SELECT pgcounters.incr('d', %s, -1)", (key,))
    assert refused.sqlstate == "PC008"
    conn.execute("SELECT pgcounters.incr('d', %s, 1)", (key,))
    assert conn.execute("SELECT pgcounters.get('d', %s)", (key,)).fetchone() == (-BIGINT_MAX,)


def test_add_direct_of_several_counters_names_the_one_that_overflows(conn: Conn) -> None:
    a = conn.execute("SELECT pgcounters.create_counter('a', '{bigint}', 'direct')").fetchone()
    b = conn.execute("SELECT pgcounters.create_counter('b', '{bigint}', 'direct')").fetchone()
    assert a is not None
    assert b is not None
    conn.execute("SELECT pgcounters.incr('b', '{2}', %s)", (BIGINT_MAX,))
    refused = _refused(
        conn,
        "SELECT pgcounters.add_direct(%s, %s, %s)",
        ([a[0], b[0]], ["{1}", "{2}"], [5, 1]),
    )
    assert refused.sqlstate == "PC008"
    assert (refused.diag.message_primary or "").startswith("counter b key {2}:")
    # nothing written: the whole call failed
    rows = conn.execute("SELECT key, value FROM pgcounters.counters ORDER BY 1").fetchall()
    assert rows == [(["2"], BIGINT_MAX)]


def test_the_python_client_names_a_direct_counter_that_overflows(conn: Conn) -> None:
    pc = Counters(conn)
    pc.create_counter("d", int, mode="direct")
    pc.incr("d", 7, BIGINT_MAX)
    with pytest.raises(CounterOverflow, match=r"^counter d key \{7\}: a change of 1 leaves"):
        pc.incr("d", 7, 1)
    assert pc.get("d", 7) == BIGINT_MAX


def test_a_negative_or_missing_count_is_refused_with_pct01(conn: Conn) -> None:
    conn.execute("CREATE TABLE visit (id bigserial PRIMARY KEY, page bigint, at timestamptz)")
    spec = CounterSpec(
        name="c",
        source="visit",
        keys=("page",),
        target=NamedTarget(("bigint",)),
        bucket=Bucket("at", "day", "UTC"),
    )
    triggers.install(conn, [spec])
    for statement in (
        "SELECT * FROM pgcounters.top('c', -1)",
        "SELECT * FROM pgcounters.top('c', NULL)",
        "SELECT * FROM pgcounters.top_range('c', '2026-11-01 UTC', '2026-11-02 UTC', -1)",
        "SELECT * FROM pgcounters.top_range('c', '2026-11-01 UTC', '2026-11-02 UTC', NULL)",
        "SELECT pgcounters.drop_expired_buckets(0)",
        "SELECT pgcounters.drop_expired_buckets(NULL)",
    ):
        refused = _refused(conn, statement)
        assert refused.sqlstate == "PCT01", statement
        assert type(translate(refused)) is InvalidArgument


def test_a_decimal_with_too_many_places_is_refused_with_pc021(conn: Conn) -> None:
    conn.execute("SELECT pgcounters.ensure_decimal_target(2, 'price', '{bigint}', 'queued')")
    refused = _refused(conn, "SELECT pgcounters.incr_decimal('price', '{1}', 1.005)")
    assert refused.sqlstate == "PC021"
    assert type(translate(refused)) is InvalidDelta
    assert conn.execute("SELECT count(*) FROM pgcounters.queue").fetchone() == (0,)
