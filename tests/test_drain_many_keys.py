"""The drain over many distinct keys: updates of named counters are heap-only (no
index covers the value), top-N ranks through rank bands with the same result as a
full sort, and the column part of a batch locks and applies in one statement."""

from __future__ import annotations

import random
import uuid

import psycopg
import pytest

from pgcounters import Counters, sqlfiles
from pgcounters.connection import Conn
from pgcounters.schema import upgrade


def _values(conn: Conn, name: str, pairs: list[tuple[int, int]]) -> None:
    """Store values of a named counter keyed by int (as a drain or recount would)."""
    target = Counters(conn).counter(name).id
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO pgcounters.counters (target_id, key, value) VALUES (%s, %s, %s)",
            [(target, [str(k)], v) for k, v in pairs],
        )


def test_no_index_of_the_counters_table_covers_the_value(conn: Conn) -> None:
    """An index on the value makes every update of a value a new entry in every index of
    the table (never heap-only): the ranking must go through something else."""
    rows = conn.execute(
        "SELECT i.indexrelid::regclass::text FROM pg_index AS i"
        " JOIN pg_attribute AS a ON a.attrelid = i.indrelid AND a.attname = 'value'"
        " WHERE i.indrelid = 'pgcounters.counters'::regclass"
        "   AND (a.attnum = ANY (i.indkey::int2[])"
        "        OR pg_get_expr(i.indexprs, i.indrelid) LIKE '%value%'"
        "        OR pg_get_expr(i.indpred, i.indrelid) LIKE '%value%')"
    ).fetchall()
    assert rows == []


def test_a_drain_of_deltas_that_keep_values_in_their_band_updates_heap_only(
    conn: Conn, pc: Counters
) -> None:
    pc.create_counter("views", key=int)
    keys = range(20)
    for k in keys:
        pc.incr("views", k, 3)
    assert pc.drain().deltas == 20  # the rows are inserted
    for k in keys:
        pc.incr("views", k, 5)  # 3 -> 8: the same band
    with conn.transaction():
        row = conn.execute("SELECT deltas FROM pgcounters.drain_queue(1000)").fetchone()
        hot = conn.execute(
            "SELECT pg_stat_get_xact_tuples_hot_updated('pgcounters.counters'::regclass),"
            " pg_stat_get_xact_tuples_updated('pgcounters.counters'::regclass)"
        ).fetchone()
    assert row == (20,)
    assert hot == (20, 20)
    assert pc.get_many("views", keys) == [8] * 20


def test_rank_bands_are_monotonic_and_coarse_at_the_bottom(conn: Conn, pc: Counters) -> None:
    edges = [-(2**63), -(2**63) + 1, 2**63 - 1, 2**63 - 2]
    for k in range(1, 63):
        edges += [2**k + d for d in (-1, 0, 1)] + [-(2**k) + d for d in (-1, 0, 1)]
    values = sorted(set(edges) | set(range(-100, 101)))
    pc.create_counter("edges", key=int)
    _values(conn, "edges", list(enumerate(values)))
    rows = conn.execute(
        "SELECT value, band FROM pgcounters.counters WHERE target_id = %s ORDER BY value",
        (pc.counter("edges").id,),
    ).fetchall()
    assert [int(v) for v, _ in rows] == values
    bands = [int(b) for _, b in rows]
    assert bands == sorted(bands)  # a greater value never has a lower band
    by_value = {int(v): int(b) for v, b in rows}
    assert {by_value[v] for v in range(-16, 16)} == {0}
    assert (by_value[16], by_value[31], by_value[32], by_value[-17]) == (1, 1, 2, -1)
    assert (by_value[2**63 - 1], by_value[-(2**63)]) == (59, -59)
    # an update recomputes the band
    conn.execute(
        "UPDATE pgcounters.counters SET value = 40 WHERE target_id = %s AND key = '{0}'",
        (pc.counter("edges").id,),
    )
    row = conn.execute(
        "SELECT band FROM pgcounters.counters WHERE target_id = %s AND key = '{0}'",
        (pc.counter("edges").id,),
    ).fetchone()
    assert row == (2,)


@pytest.mark.parametrize("n", [0, 1, 3, 10, 57, 500])
def test_top_is_the_first_n_of_a_full_sort_by_value_then_key(
    conn: Conn, pc: Counters, n: int
) -> None:
    """Values across many bands, negative ones, ties inside a band and across the cut,
    and a second counter whose rows must not leak in."""
    rng = random.Random(n)
    pc.create_counter("score", key=int)
    pc.create_counter("other", key=int)
    pairs = [
        (k, rng.choice([rng.randint(-40, 40), rng.randint(0, 10**6), 2**40, 17]))
        for k in range(300)
    ]
    _values(conn, "score", pairs)
    _values(conn, "other", [(k, 10**9 + k) for k in range(50)])
    expected = sorted(pairs, key=lambda p: (-p[1], str(p[0])))[:n]
    assert pc.top("score", n) == [((k,), v) for k, v in expected]


def test_the_migration_ranks_values_stored_before_it(empty_dsn: str) -> None:
    """The band of rows stored before the column existed is computed by the migration."""
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        for migration in sqlfiles.migrations():
            if migration.version >= 14:
                break
            c.execute(migration.sql.encode())
            c.execute(
                sqlfiles.query("record_migration"),
                {"version": migration.version, "name": migration.name},
            )
        target = c.execute("SELECT pgcounters.create_counter('old', '{bigint}')").fetchone()
        assert target is not None
        c.execute(
            "INSERT INTO pgcounters.counters (target_id, key, value)"
            " SELECT %s, ARRAY[k::text], k * 37 %% 101 FROM generate_series(0, 100) AS k",
            (target[0],),
        )
        assert 14 in upgrade(c)
        got = Counters(c).top("old", 5)
    assert got == [((k,), k * 37 % 101) for k in (30, 60, 90, 19, 49)]


def test_busy_rows_of_a_uuid_keyed_parent_go_back_with_their_key_text(
    dsn: str, conn: Conn, pc: Counters
) -> None:
    ids = sorted(str(uuid.UUID(int=i * 7919)) for i in range(1, 5))
    conn.execute("CREATE TABLE doc (id uuid PRIMARY KEY, views bigint NOT NULL DEFAULT 0)")
    conn.execute("INSERT INTO doc (id) SELECT unnest(%s::uuid[])", (ids,))
    pc.create_column_counter("doc.views", "doc", "views")
    for i, key in enumerate(ids):
        pc.incr("doc.views", uuid.UUID(key), i + 1)
    app = psycopg.connect(dsn)
    try:
        app.execute("SELECT 1 FROM doc WHERE id = %s FOR UPDATE", (ids[1],))
        batch = pc.drain_queue_batch(100)
        assert (batch.deltas, batch.keys, batch.busy) == (3, 3, 1)
        requeued = conn.execute("SELECT key, delta FROM pgcounters.queue").fetchall()
        assert requeued == [("{" + ids[1] + "}", 2)]
        assert pc.get("doc.views", uuid.UUID(ids[1])) == 2  # exact while pending
    finally:
        app.rollback()  # the row is free once this returns (a close alone ends it later)
        app.close()
    assert pc.drain().deltas == 1
    views = dict(conn.execute("SELECT id::text, views FROM doc").fetchall())
    assert views == {key: i + 1 for i, key in enumerate(ids)}


def test_two_counters_on_one_parent_table_apply_in_one_batch(conn: Conn, pc: Counters) -> None:
    conn.execute(
        "CREATE TABLE post (id bigint PRIMARY KEY, likes bigint NOT NULL DEFAULT 0,"
        " shares bigint DEFAULT NULL)"
    )
    conn.execute("INSERT INTO post (id) SELECT generate_series(1, 50)")
    pc.create_column_counter("post.likes", "post", "likes")
    pc.create_column_counter("post.shares", "post", "shares")
    for k in range(1, 61):  # keys 51-60 have no row: their deltas are discarded
        pc.incr("post.likes", k, k)
        pc.incr("post.shares", k, 2 * k)
        pc.incr("post.likes", k, 1)
    batch = pc.drain_queue_batch(1000)
    assert (batch.deltas, batch.keys, batch.busy) == (180, 100, 0)
    rows = conn.execute("SELECT id, likes, shares FROM post ORDER BY id").fetchall()
    assert rows == [(k, k + 1, 2 * k) for k in range(1, 51)]


def test_top_of_a_large_counter_reads_the_bands_through_the_index(conn: Conn, pc: Counters) -> None:
    """The plan of top(): the rank index, an incremental sort per band, no parallel workers
    and no sort of every row (checked in the plan, not by timing)."""
    pc.create_counter("big", key=int)
    conn.execute(
        "INSERT INTO pgcounters.counters (target_id, key, value)"
        " SELECT %s, ARRAY[g::text], (1000000 / (1 + (g::bigint * 7919) %% 1000000))::bigint"
        "   FROM generate_series(1, 1000000) AS g",
        (pc.counter("big").id,),
    )
    conn.execute("ANALYZE pgcounters.counters")
    row = conn.execute(
        "EXPLAIN (ANALYZE, FORMAT JSON) " + sqlfiles.query("top_named"),
        {"t": pc.counter("big").id, "n": 10},
    ).fetchone()
    assert row is not None
    plan = str(row[0])
    assert "counters_rank" in plan
    assert "Incremental Sort" in plan
    assert "Gather" not in plan
    assert "Seq Scan" not in plan
    top = pc.top("big", 10)
    full = conn.execute(
        "SELECT key, value FROM pgcounters.counters WHERE target_id = %s"
        " ORDER BY value DESC, key LIMIT 10",
        (pc.counter("big").id,),
    ).fetchall()
    assert top == [((int(k[0]),), int(v)) for k, v in full]
