"""Exact reads keep their plans whatever the tables' sizes and statistics say: a lookup by
key of each key's stored value and pending deltas, never a scan, in the plan a prepared
statement keeps (the generic plan), also after VACUUM has found a drained queue empty."""

from __future__ import annotations

import json
import re

import pytest
from psycopg import sql

from pgcounters import Counters
from pgcounters.connection import Conn
from pgcounters.sqlfiles import query

pytestmark = pytest.mark.slow

KEYS = 10_000


def _generic_plan(conn: Conn, name: str, types: dict[str, str], values: dict[str, object]) -> str:
    """The plan of a named statement as a prepared statement keeps it (generic)."""
    order = list(types)
    text = query(name)
    for i, param in enumerate(order, 1):
        text = text.replace(f"%({param})s", f"${i}")
    conn.execute(f"PREPARE p ({', '.join(types[p] for p in order)}) AS {text}")
    try:
        conn.execute("SET plan_cache_mode = force_generic_plan")
        args = sql.SQL(", ").join(sql.Literal(str(values[p])) for p in order)
        rows = conn.execute(sql.SQL("EXPLAIN EXECUTE p({})").format(args)).fetchall()
        return "\n".join(str(r[0]) for r in rows)
    finally:
        conn.execute("RESET plan_cache_mode")
        conn.execute("DEALLOCATE p")


def test_reads_of_a_few_keys_look_each_key_up_after_the_queue_was_drained_and_vacuumed(
    conn: Conn, pc: Counters
) -> None:
    target = pc.create_counter("views", key=int).id
    # 10,000 stored keys (a counters table of about 150 pages) and queues that held 100,000
    # deltas, drained and vacuumed: their pages are empty
    for queue in ("queue", "queue_unlogged"):
        conn.execute(
            sql.SQL(
                "INSERT INTO pgcounters.{} (target_id, key, delta)"
                " SELECT %s, '{{' || (g %% %s) || '}}', 1 FROM generate_series(1, 50000) AS g"
            ).format(sql.Identifier(queue)),
            (target, KEYS),
        )
    assert pc.drain().deltas == 100_000
    conn.execute("VACUUM ANALYZE pgcounters.queue, pgcounters.queue_unlogged, pgcounters.counters")
    pages = conn.execute(
        "SELECT relpages FROM pg_class"
        " WHERE oid IN ('pgcounters.queue'::regclass, 'pgcounters.queue_unlogged'::regclass)"
    ).fetchall()
    # the files keep their pages: the planner sees no empty queue
    assert [p > 0 for (p,) in pages] == [True, True]
    keys = json.dumps([[str(k)] for k in range(0, KEYS, KEYS // 50)])
    for name, types, values in (
        ("exact_named", {"t": "integer", "k": "text[]"}, {"t": target, "k": "{7}"}),
        ("exact_named_many", {"t": "integer", "keys": "text"}, {"t": target, "keys": keys}),
        ("stored_named_many", {"t": "integer", "keys": "text"}, {"t": target, "keys": keys}),
    ):
        plan = _generic_plan(conn, name, types, values)
        scans = re.findall(r"Seq Scan on (\w+)", plan)
        assert [s for s in scans if s in ("queue", "queue_unlogged", "counters")] == [], (
            f"{name}:\n{plan}"
        )
    assert pc.get_many("views", range(0, KEYS, KEYS // 50)) == [10] * 50
