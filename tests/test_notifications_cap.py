"""Change notes capped in the drain: a counter of more keys than a report lists is noted
once, as many keys, and the keys of one report add up over its batches."""

from __future__ import annotations

import json

import pytest

from pgcounters import Counters
from pgcounters.connection import Conn
from pgcounters.notifications import decode_noted, statement


def _noted(conn: Conn, max_keys: str, batches: int = 1, limit: int = 100) -> list[object]:
    """The notes of ``batches`` drain batches in one transaction, as the drain wrote them."""
    with conn.transaction():
        conn.execute(statement("note_changes"), {"max_keys": max_keys})
        for _ in range(batches):
            conn.execute("SELECT * FROM pgcounters.drain_queue(%s, false)", [limit])
        row = conn.execute(statement("noted_changes")).fetchone()
    assert row is not None
    noted: list[object] = json.loads(row[0])
    return noted


def _sorted(noted: list[object]) -> list[str]:
    return sorted(json.dumps(item) for item in noted)


def test_a_counter_over_the_cap_is_noted_once_without_its_keys(conn: Conn, pc: Counters) -> None:
    pc.create_counter("views", int)
    pc.create_counter("likes", int)
    for k in range(3):
        pc.incr("views", k)
    pc.incr("likes", 1)
    noted = _noted(conn, "2")
    # no element per key of views: one [name, null]
    assert _sorted(noted) == _sorted([["views", None], ["likes", ["1"]]])


def test_a_counter_at_the_cap_is_listed_and_no_cap_lists_every_key(
    conn: Conn, pc: Counters
) -> None:
    pc.create_counter("views", int)
    for k in range(3):
        pc.incr("views", k)
    assert _sorted(_noted(conn, "3")) == _sorted([["views", [str(k)]] for k in range(3)])
    for k in range(3):
        pc.incr("views", k)
    assert _sorted(_noted(conn, "")) == _sorted([["views", [str(k)]] for k in range(3)])


def test_an_unlogged_counter_over_the_cap_is_noted_once(conn: Conn, pc: Counters) -> None:
    pc.create_counter("fast", int, mode="unlogged")
    for k in range(3):
        pc.incr("fast", k)
    with conn.transaction():
        conn.execute(statement("note_changes"), {"max_keys": "1"})
        conn.execute("SELECT * FROM pgcounters.drain_queue(100, true)")
        row = conn.execute(statement("noted_changes")).fetchone()
    assert row is not None
    assert json.loads(row[0]) == [["fast", None]]


def test_the_keys_of_one_report_add_up_over_its_batches(conn: Conn, pc: Counters) -> None:
    pc.create_counter("views", int)
    for k in range(4):
        pc.incr("views", k)
    # two batches of two keys, each at the cap of 3: listed by each batch, and the
    # report of both (four keys) is many keys
    with conn.transaction():
        conn.execute(statement("note_changes"), {"max_keys": "3"})
        conn.execute("SELECT * FROM pgcounters.drain_queue(2, false)")
        conn.execute("SELECT * FROM pgcounters.drain_queue(2, false)")
        row = conn.execute(statement("noted_changes")).fetchone()
    assert row is not None
    assert len(json.loads(row[0])) == 4
    assert decode_noted(row, 3) == {"views": None}
    assert decode_noted(row, 4) == {"views": {(k,) for k in range(4)}}
    # a batch over the cap, then one under it: many keys, whatever the order
    for k in range(4):
        pc.incr("views", k)
    pc.incr("views", 9)
    with conn.transaction():
        conn.execute(statement("note_changes"), {"max_keys": "3"})
        conn.execute("SELECT * FROM pgcounters.drain_queue(4, false)")
        conn.execute("SELECT * FROM pgcounters.drain_queue(4, false)")
        row = conn.execute(statement("noted_changes")).fetchone()
    assert row is not None
    assert json.loads(row[0]) == [["views", None], ["views", ["9"]]]
    assert decode_noted(row, 3) == {"views": None}
    reversed_row = (json.dumps(list(reversed(json.loads(row[0])))), row[1])
    assert decode_noted(reversed_row, 3) == {"views": None}


def test_a_worker_batch_lists_no_keys_of_a_counter_over_its_cap(pc: Counters) -> None:
    pc.create_counter("views", int)
    pc.create_counter("likes", int)
    for k in range(5):
        pc.incr("views", k)
    pc.incr("likes", 1)
    assert pc.drain_queue_batch(changes=True, max_keys=4).changes == {
        "views": None,
        "likes": {(1,)},
    }
    for k in range(5):
        pc.incr("views", k)
    assert pc.drain_queue_batch(changes=True, max_keys=5).changes == {
        "views": {(k,) for k in range(5)}
    }


@pytest.mark.parametrize("fast", [False, True])
def test_a_column_counter_over_the_cap_is_noted_once(
    dsn: str, conn: Conn, pc: Counters, fast: bool
) -> None:
    conn.execute("CREATE TABLE article (id bigint PRIMARY KEY, n bigint NOT NULL DEFAULT 0)")
    conn.execute("INSERT INTO article (id) SELECT generate_series(1, 5)")
    pc.create_column_counter("article.n", "article", "n")
    for key in (1, 2, 3):
        pc.incr("article.n", key)
    with conn.transaction():
        conn.execute(
            "SELECT set_config('pgcounters.fast_column_drain', %s, true)", ["on" if fast else ""]
        )
        conn.execute(statement("note_changes"), {"max_keys": "2"})
        conn.execute("SELECT * FROM pgcounters.drain_queue(100, false)")
        row = conn.execute(statement("noted_changes")).fetchone()
    assert row is not None
    assert json.loads(row[0]) == [["article.n", None]]
    assert conn.execute("SELECT sum(n) FROM article").fetchone() == (3,)
    for key in (1, 2):
        pc.incr("article.n", key)
    with conn.transaction():
        conn.execute(
            "SELECT set_config('pgcounters.fast_column_drain', %s, true)", ["on" if fast else ""]
        )
        conn.execute(statement("note_changes"), {"max_keys": "2"})
        conn.execute("SELECT * FROM pgcounters.drain_queue(100, false)")
        row = conn.execute(statement("noted_changes")).fetchone()
    assert row is not None
    assert decode_noted(row, 2) == {"article.n": {(1,), (2,)}}


def test_a_broken_column_counter_beside_leaves_the_others_capped(conn: Conn, pc: Counters) -> None:
    conn.execute("CREATE TABLE article (id bigint PRIMARY KEY, n bigint NOT NULL DEFAULT 0)")
    conn.execute("INSERT INTO article (id) VALUES (1)")
    pc.create_column_counter("article.n", "article", "n")
    pc.create_counter("views", int)
    pc.incr("article.n", 1)
    conn.execute("ALTER TABLE article DROP COLUMN n")
    for k in range(3):
        pc.incr("views", k)
    notices: list[str] = []
    conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
    # the statement that skips the broken counter's deltas notes the same way
    noted = _noted(conn, "2")
    assert any("stay queued" in n for n in notices)
    assert noted == [["views", None]]
