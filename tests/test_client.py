from __future__ import annotations

import datetime as dt
import uuid

import psycopg
import pytest

from pgcounters import Counters
from pgcounters.connection import Conn

pytestmark = pytest.mark.fast


def test_global_counter_queued(pc: Counters) -> None:
    pc.create_counter("users.total")
    assert pc.incr("users.total") is None
    pc.incr("users.total", delta=4)
    assert pc.get("users.total") == 5
    assert pc.get("users.total", exact=False) == 0
    result = pc.drain()
    assert (result.deltas, result.keys) == (2, 1)
    assert pc.get("users.total", exact=False) == 5
    assert pc.get("users.total") == 5
    assert pc.pending() == (0, 0)


def test_each_key_type_round_trips(pc: Counters) -> None:
    day = dt.date(2026, 3, 29)
    uid = uuid.UUID("12345678-1234-5678-1234-567812345678")
    pc.create_counter("by.int", int)
    pc.create_counter("by.uuid", "uuid")
    pc.create_counter("by.text", str)
    pc.create_counter("by.composite", (int, dt.date))
    pc.incr("by.int", -7, 3)
    pc.incr("by.uuid", uid)
    pc.incr("by.uuid", str(uid).upper())  # the same UUID in another spelling
    pc.incr("by.text", "it's; a \\ key é")
    pc.incr("by.composite", (42, day), 2)
    assert pc.get("by.uuid", uid) == 2
    pc.drain()
    assert pc.top("by.int") == [((-7,), 3)]
    assert pc.top("by.uuid") == [((uid,), 2)]
    assert pc.top("by.text") == [(("it's; a \\ key é",), 1)]
    assert pc.top("by.composite") == [((42, day), 2)]
    assert pc.get("by.composite", (42, day)) == 2
    assert pc.get("by.composite", (42, day + dt.timedelta(days=1))) == 0


def test_keys_match_postgresql_casts(pc: Counters, conn: Conn) -> None:
    """Triggers build keys with SQL casts; the client must produce the same text."""
    pc.create_counter("k", ("bigint", "uuid", "date"))
    uid = uuid.uuid4()
    pc.incr("k", (12, uid, dt.date(2024, 2, 29)))
    row = conn.execute(
        "SELECT key::text[] = ARRAY[%s::bigint::text, %s::uuid::text,"
        " to_char(%s::date, 'YYYY-MM-DD')] FROM pgcounters.queue",
        (12, str(uid).upper(), "2024-02-29"),
    ).fetchone()
    assert row == (True,)


def test_unlogged_counter(pc: Counters, conn: Conn) -> None:
    pc.create_counter("views", int, mode="unlogged")
    for _ in range(3):
        pc.incr("views", 1)
    assert pc.pending() == (0, 3)
    assert pc.get("views", 1) == 3
    assert pc.drain().deltas == 3
    assert pc.get("views", 1, exact=False) == 3


def test_direct_counter_reads_its_own_write(pc: Counters) -> None:
    pc.create_counter("balance", int, mode="direct")
    assert pc.incr("balance", 1, 10) == 10
    assert pc.incr("balance", 1, -3) == 7
    assert pc.get("balance", 1, exact=False) == 7
    assert pc.pending() == (0, 0)


def test_incr_many_nets_per_key_and_mixes_modes(pc: Counters) -> None:
    pc.create_counter("a", int)
    pc.create_counter("b", int, mode="unlogged")
    pc.create_counter("c", None, mode="direct")
    written = pc.incr_many(
        [("a", 1, 1), ("a", 1, 1), ("a", 2, 5), ("a", 2, -5), ("b", 9, 2), ("c", None, 4)]
    )
    assert written == 3  # a/1, b/9 and c; a/2 nets to zero
    assert pc.pending() == (1, 1)
    assert [pc.get("a", 1), pc.get("a", 2), pc.get("b", 9), pc.get("c")] == [2, 0, 2, 4]


def test_get_many_keeps_the_order_given(pc: Counters) -> None:
    pc.create_counter("pages", int)
    pc.incr_many([("pages", k, k * 10) for k in range(1, 6)])
    pc.drain()
    pc.incr("pages", 3, 1)
    assert pc.get_many("pages", [5, 3, 99, 1]) == [50, 31, 0, 10]
    assert pc.get_many("pages", [5, 3, 99, 1], exact=False) == [50, 30, 0, 10]
    assert pc.get_many("pages", []) == []


def test_top_ranks_by_stored_value(pc: Counters) -> None:
    pc.create_counter("score", int)
    pc.incr_many([("score", k, (k * 37) % 11) for k in range(1, 21)])
    pc.drain()
    top = pc.top("score", 3)
    values = [v for _, v in top]
    assert values == sorted(values, reverse=True)
    assert values[0] == 10
    assert len(top) == 3


def test_rollback_leaves_no_delta(dsn: str) -> None:
    with psycopg.connect(dsn) as conn:  # not autocommit: calls join the transaction
        pc = Counters(conn)
        pc.create_counter("rb", int)
        conn.commit()
        pc.incr("rb", 1)
        pc.incr_many([("rb", 2, 5)])
        assert pc.get("rb", 1) == 1  # visible inside the transaction
        conn.rollback()
        assert pc.get("rb", 1) == 0
        assert pc.get("rb", 2) == 0
        assert pc.pending() == (0, 0)


def test_incr_many_joins_the_callers_transaction(dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        pc = Counters(conn)
        pc.create_counter("j", int)
        conn.commit()
        pc.incr_many([("j", 1, 1), ("j", 2, 1)])  # first statement of a new transaction
        conn.rollback()
        assert pc.get_many("j", [1, 2]) == [0, 0]


def test_uncommitted_deltas_are_invisible_to_others(dsn: str) -> None:
    with psycopg.connect(dsn) as writer, psycopg.connect(dsn, autocommit=True) as reader:
        Counters(reader).create_counter("c", int)
        Counters(writer).incr("c", 1, 5)
        assert Counters(reader).get("c", 1) == 0
        writer.commit()
        assert Counters(reader).get("c", 1) == 5


def test_column_counter(pc: Counters, conn: Conn) -> None:
    conn.execute(
        'CREATE TABLE "Blog Article" (id serial PRIMARY KEY, "public comments" int NOT NULL '
        "DEFAULT 0)"
    )
    conn.execute(
        'INSERT INTO "Blog Article" DEFAULT VALUES; INSERT INTO "Blog Article" DEFAULT VALUES'
    )
    counter = pc.create_column_counter("article.comments", '"Blog Article"', "public comments")
    assert counter.key_types == ("bigint",)
    pc.incr("article.comments", 1, 3)
    pc.incr("article.comments", 2)
    pc.incr("article.comments", 404)  # no such row: discarded when drained
    assert pc.get("article.comments", 1) == 3
    assert pc.get("article.comments", 1, exact=False) == 0
    result = pc.drain()
    assert (result.deltas, result.keys) == (3, 2)
    rows = conn.execute('SELECT id, "public comments" FROM "Blog Article" ORDER BY id').fetchall()
    assert rows == [(1, 3), (2, 1)]
    assert pc.top("article.comments") == [((1,), 3), ((2,), 1)]
    assert pc.get_many("article.comments", [2, 1]) == [1, 3]


def test_direct_column_counter(pc: Counters, conn: Conn) -> None:
    conn.execute("CREATE TABLE art (id bigint PRIMARY KEY, n bigint NOT NULL DEFAULT 0)")
    conn.execute("INSERT INTO art (id) VALUES (1)")
    pc.create_column_counter("art.n", "art", "n", mode="direct")
    assert pc.incr("art.n", 1, 2) == 2
    assert pc.incr("art.n", 7) is None  # no such row
    pc.incr_many([("art.n", 1, 3)])
    assert pc.get("art.n", 1) == 5


def test_create_counter_is_idempotent_and_drop_forgets(pc: Counters) -> None:
    first = pc.create_counter("x", int)
    assert pc.create_counter("x", "bigint") == first
    pc.incr("x", 1)
    assert pc.drop_counter("x") is True
    assert pc.drop_counter("x") is False
    assert pc.pending() == (0, 0)
    assert [c.name for c in pc.counters()] == []


def test_sql_functions_for_plain_sql_users(pc: Counters, conn: Conn) -> None:
    pc.create_counter("s", int)
    pc.create_counter("d", None, mode="direct")
    conn.execute("SELECT pgcounters.incr('s', ARRAY['5'], 2)")
    assert conn.execute("SELECT pgcounters.incr('d', '{}', 3)").fetchone() == (3,)
    assert conn.execute("SELECT pgcounters.get('s', ARRAY['5'])").fetchone() == (2,)
    assert conn.execute("SELECT * FROM pgcounters.drain_batch(100)").fetchone() == (1, 1)
    assert pc.get("s", 5, exact=False) == 2


@pytest.mark.parametrize(
    "text", ['"', "\\", '\\"', "{a,b}", "NULL", "", " spaced ", "x'); DROP TABLE t; --", "日本"]
)
def test_hostile_text_keys_are_stored_verbatim(pc: Counters, text: str) -> None:
    pc.create_counter("t", (str, str))
    pc.incr("t", (text, "other"))
    pc.incr_many([("t", (text, "other"), 2)])
    assert pc.get("t", (text, "other")) == 3
    pc.drain()
    assert pc.top("t") == [((text, "other"), 3)]
