"""Queues keep keys as their array's text (schema version 7): every writer must produce
PostgreSQL's own text of the array, or exact reads and drains would split one key in two."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgcounters import Counters
from pgcounters.client import array_literal
from pgcounters.connection import Conn

# text PostgreSQL can hold: no NUL, no surrogates
PART = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="\x00"),
    max_size=12,
) | st.sampled_from(["", "NULL", "null", " a", "a,b", '"', "\\", "{}", "\t", "\x0b", "\x0c"])


@settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],  # a read-only query
)
@given(parts=st.lists(PART, max_size=4))
def test_the_client_writes_the_text_postgresql_gives_the_array(
    conn: Conn, parts: list[str]
) -> None:
    row = conn.execute("SELECT %s::text[]::text", [parts]).fetchone()
    assert row == (array_literal(parts),)


def test_keys_written_by_insert_copy_and_sql_are_one_key(conn: Conn, pc: Counters) -> None:
    pc.create_counter("k", key=(str, str))
    key = ("a b", 'x"y')
    pc.incr("k", key)  # INSERT with a text[] parameter
    pc.incr_many([("k", key, 2)])  # multi-row INSERT
    conn.execute("SELECT pgcounters.incr('k', ARRAY['a b', 'x\"y'], 3)")  # SQL function
    target = pc.counter("k").id
    with (
        conn.cursor() as cur,
        cur.copy("COPY pgcounters.queue (target_id, key, delta) FROM STDIN") as copy,
    ):
        copy.write_row((target, array_literal(list(key)), 4))  # COPY, as the buffers write
    keys = conn.execute("SELECT DISTINCT key FROM pgcounters.queue").fetchall()
    assert keys == [('{"a b","x\\"y"}',)]
    assert pc.get("k", key) == 10
    assert conn.execute("SELECT pgcounters.get('k', ARRAY['a b', 'x\"y'])").fetchone() == (10,)
    pc.drain()
    assert pc.get("k", key, exact=False) == 10
