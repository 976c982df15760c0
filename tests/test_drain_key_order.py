"""The drain writes the rows of named counters in (counter, key) order, whatever order the
deltas were queued in: every drainer (and a recount) locks these rows in that one order,
so two drainers cannot deadlock on them.

The order is observed, not inferred: rows new to ``pgcounters.counters`` are appended to
its heap in the order the statement writes them, so their physical order (``ctid``) is
the order of the writes. The keys are chosen so that no other order the statement could
fall back to (the queue's, a hash's, the text of the keys') is (counter, key) order.
"""

from __future__ import annotations

import psycopg
import pytest

from pgcounters import Counters
from pgcounters.client import Mode
from pgcounters.connection import Conn

# the text of the queued form ({100} before {10}, {"a b"} before {a}) does not sort as the keys
KEYS = ["b", "a b", "a", "a!", "10", "9", "a,b", "", "Z", "a}"]


def written_order(conn: Conn) -> list[tuple[int, tuple[str, ...]]]:
    rows = conn.execute("SELECT target_id, key FROM pgcounters.counters ORDER BY ctid").fetchall()
    return [(int(t), tuple(k)) for t, k in rows]


def enqueue(pc: Counters, unlogged: bool) -> None:
    """Deltas of two counters for every key, queued one by one: the later counter first,
    the keys in reverse order."""
    for key in reversed(KEYS):
        for name in ("second", "first"):
            pc.incr(name + ("_u" if unlogged else ""), key, 1)


@pytest.mark.parametrize("unlogged", [False, True], ids=["logged", "unlogged"])
@pytest.mark.parametrize("sole", [True, False], ids=["sole-drainer", "beside-another"])
@pytest.mark.parametrize("broken", [False, True], ids=["", "beside-a-broken-counter"])
def test_the_drain_writes_named_counters_in_key_order(
    dsn: str, conn: Conn, pc: Counters, unlogged: bool, sole: bool, broken: bool
) -> None:
    """Each of the drain's statements: the queue, its claim, and the statement built
    when a column counter's table is gone (its deltas are left out of the claim)."""
    if broken:
        conn.execute("CREATE TABLE gone (id bigint PRIMARY KEY, n bigint NOT NULL DEFAULT 0)")
        pc.create_column_counter("gone.n", "gone", "n")
        conn.execute("DROP TABLE gone")
    mode: Mode = "unlogged" if unlogged else "queued"
    suffix = "_u" if unlogged else ""
    ids = {
        name: pc.create_counter(name + suffix, key=str, mode=mode).id
        for name in ("first", "second")
    }
    expected = sorted((ids[name], (key,)) for name in ids for key in KEYS)
    enqueue(pc, unlogged)
    with psycopg.connect(dsn, autocommit=True) as other:
        if not sole:
            # another drainer holds the queue's range claim: this one claims with SKIP
            # LOCKED, by the other of the drain's statements
            other.execute(
                "SELECT pg_advisory_lock(hashtext('pgcounters.drain'), %s)", (int(unlogged),)
            )
        batch = pc.drain_queue_batch(1000, unlogged=unlogged)
    assert (batch.deltas, batch.keys) == (len(expected), len(expected))
    assert written_order(conn) == expected


def careful_batch(conn: Conn, pc: Counters, keys: list[str]) -> list[tuple[int, tuple[str, ...]]]:
    """Deltas of ``keys`` queued out of order and a delta of a dropped counter, drained in
    one batch: the careful path, one key at a time. The (counter, key) order expected."""
    ids = {name: pc.create_counter(name, key=str).id for name in ("first", "second")}
    for key in reversed(keys):
        for name in ("second", "first"):
            pc.incr(name, key, 1)
    dropped = pc.create_counter("dropped").id
    pc.drop_counter("dropped")
    conn.execute(
        "INSERT INTO pgcounters.queue (target_id, key, delta) VALUES (%s, '{}', 1)", (dropped,)
    )
    batch = pc.drain_queue_batch(1000)
    expected: list[tuple[int, tuple[str, ...]]] = sorted(
        (ids[name], (key,)) for name in ids for key in keys
    )
    assert (batch.deltas, batch.quarantined) == (len(expected), 1)
    return expected


def test_the_careful_path_writes_in_key_order_too(conn: Conn, pc: Counters) -> None:
    """A batch holding a delta of no counter is taken again one key at a time: in the
    same (counter, key) order (keys whose text sorts as the keys do: none the start of
    another)."""
    expected = careful_batch(conn, pc, ["3", "10", "9", "-1", "25", "b", "a", "cd"])
    assert written_order(conn) == expected


def test_the_careful_path_writes_any_keys_in_the_fast_paths_order(conn: Conn, pc: Counters) -> None:
    expected = careful_batch(conn, pc, [*KEYS, "100"])
    assert written_order(conn) == expected
