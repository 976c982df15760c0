"""``pgcounters.incr`` queues a key already in canonical form after one lookup: the key it
stores is the one the canonical function makes of it, whatever path the call takes."""

from __future__ import annotations

import uuid

import pytest

from pgcounters import Counters
from pgcounters.client import Mode
from pgcounters.connection import Conn
from pgcounters.dberrors import translated
from pgcounters.errors import InvalidArgument, InvalidKey, UnknownCounter

U = uuid.UUID("6f1c2b7e-8a9d-4c3b-9e2f-0a1b2c3d4e5f")

# spellings at the edges of the canonical form of each key type
BIGINTS = ["0", "-0", "+0", "00", "7", "-7", "007", " 7", "7 ", "+7", "-007",
           "999999999999999999", "-999999999999999999", "9223372036854775807",
           "-9223372036854775808", "1000000000000000000"]  # fmt: skip
UUIDS = [str(U), str(U).upper(), U.hex, "{" + str(U) + "}", " " + str(U)]
TEXTS = ["", "a", "a b", " a ", "a,b", 'a"b', "{x}", "NULL", "é", "x" * 1000]


def _queued_key(conn: Conn, name: str, key: list[str]) -> tuple[str, str]:
    """(the key incr queued, the key the canonical function makes of the same input)."""
    conn.execute("DELETE FROM pgcounters.queue; DELETE FROM pgcounters.queue_unlogged")
    with translated():
        conn.execute("SELECT pgcounters.incr(%s, %s::text[], 1)", (name, key))
    row = conn.execute(
        "SELECT q.key, pgcounters._canonical_key(t, %s::text[])::text"
        "  FROM (SELECT key, target_id FROM pgcounters.queue"
        "        UNION ALL SELECT key, target_id FROM pgcounters.queue_unlogged) AS q"
        "  JOIN pgcounters.targets AS t ON t.id = q.target_id",
        (key,),
    ).fetchone()
    assert row is not None
    return str(row[0]), str(row[1])


@pytest.mark.parametrize("mode", ["queued", "unlogged"])
def test_every_spelling_is_queued_in_canonical_form(conn: Conn, pc: Counters, mode: Mode) -> None:
    pc.create_counter("b", key=int, mode=mode)
    pc.create_counter("u", key=uuid.UUID, mode=mode)
    pc.create_counter("t", key=str, mode=mode)
    pc.create_counter("three", key=(int, str, uuid.UUID), mode=mode)
    pc.create_counter("none", mode=mode)
    cases = (
        [("b", [k]) for k in BIGINTS]
        + [("u", [k]) for k in UUIDS]
        + [("t", [k]) for k in TEXTS]
        + [("three", [b, t, u]) for b in BIGINTS[:6] for t in TEXTS[:3] for u in UUIDS[:3]]
        + [("none", [])]
    )
    for name, key in cases:
        stored, canonical = _queued_key(conn, name, key)
        assert stored == canonical, (name, key)


@pytest.mark.parametrize("mode", ["queued", "unlogged"])
def test_a_queued_call_counts_once_and_bad_calls_fail_as_before(
    conn: Conn, pc: Counters, mode: Mode
) -> None:
    pc.create_counter("b", key=int, mode=mode)
    with translated():
        for key in (["5"], ["05"], ["+5"]):
            conn.execute("SELECT pgcounters.incr('b', %s::text[], 2)", (key,))
    pc.drain()
    assert pc.get("b", 5) == 6
    with pytest.raises(UnknownCounter), translated():
        conn.execute("SELECT pgcounters.incr('nope', ARRAY['5'])")
    for key in (["abc"], [], ["1", "2"], ["99999999999999999999"]):
        with pytest.raises(InvalidKey), translated():
            conn.execute("SELECT pgcounters.incr('b', %s::text[])", (key,))
    with pytest.raises(InvalidKey), translated():
        conn.execute("SELECT pgcounters.incr('b', ARRAY[NULL]::text[])")
    with pytest.raises(InvalidArgument), translated():
        conn.execute("SELECT pgcounters.incr('b', ARRAY['1'], NULL)")


def test_a_null_delta_is_refused_and_changes_nothing(conn: Conn, pc: Counters) -> None:
    conn.execute("CREATE TABLE post (id bigint PRIMARY KEY, hits bigint DEFAULT 0)")
    conn.execute("INSERT INTO post VALUES (1, 0)")
    pc.create_counter("views.queued", int)
    pc.create_counter("views.unlogged", int, mode="unlogged")
    pc.create_counter("views.direct", int, mode="direct")
    pc.create_column_counter("post.hits", "post", "hits", mode="direct")
    names = ("views.queued", "views.unlogged", "views.direct", "post.hits")
    for name in names:
        conn.execute("SELECT pgcounters.incr(%s, '{1}', 5)", (name,))
    for name in names:
        with pytest.raises(InvalidArgument, match="needs a delta"), translated():
            conn.execute("SELECT pgcounters.incr(%s, '{1}', NULL)", (name,))
    # a nullable counter column kept its count (it became NULL, the count lost, before)
    assert conn.execute("SELECT hits FROM post").fetchall() == [(5,)]
    for name in names:
        assert pc.get(name, 1) == 5
    row = conn.execute(
        "SELECT (SELECT count(*) FROM pgcounters.queue)"
        " + (SELECT count(*) FROM pgcounters.queue_unlogged)"
    ).fetchone()
    assert row == (2,)  # the two queued increments of 5, nothing more


def test_a_key_of_several_dimensions_gets_the_invalid_key_error(conn: Conn, pc: Counters) -> None:
    pc.create_counter("views", int)
    for statement in (
        "SELECT pgcounters.incr('views', '{{7}}')",
        "SELECT pgcounters.get('views', '{{7}}')",
        "SELECT pgcounters.incr('views', '{{7},{8}}')",
    ):
        with pytest.raises(InvalidKey, match="takes a key of"), translated():
            conn.execute(statement)
    row = conn.execute("SELECT count(*) FROM pgcounters.queue").fetchone()
    assert row == (0,)
