"""The drain's claim keeps its index plan on a large queue.

Checked through PostgreSQL's own statistics, not through timing: a batch of
1000 deltas out of 1M queued must not scan the queue sequentially.
"""

from __future__ import annotations

from typing import Any

import pytest
from psycopg import sql

from pgcounters import Counters
from pgcounters.config import connect
from pgcounters.connection import Conn


def _scans(conn: Conn, table: str) -> tuple[int, int]:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT seq_scan, coalesce(idx_scan, 0) FROM pg_stat_user_tables"
        " WHERE schemaname = 'pgcounters' AND relname = %s",
        (table,),
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


@pytest.mark.parametrize("second", [False, True], ids=["sole drainer", "second drainer"])
@pytest.mark.parametrize(("table", "mode"), [("queue", "queued"), ("queue_unlogged", "unlogged")])
def test_claim_uses_the_index_at_one_million_queued(
    dsn: str, conn: Conn, pc: Counters, table: str, mode: Any, second: bool
) -> None:
    if conn.info.server_version < 150000:
        pytest.skip("pg_stat_force_next_flush() needs PostgreSQL 15")
    pc.create_counter("big", int, mode=mode)
    ident = sql.Identifier("pgcounters", table)
    conn.execute(
        sql.SQL(
            "INSERT INTO {} (target_id, key, delta)"
            " SELECT %s, ARRAY[(g %% 1000)::text], 1 FROM generate_series(1, 1000000) g"
        ).format(ident),
        (pc.counter("big").id,),
    )
    conn.execute(sql.SQL("ANALYZE {}").format(ident))
    conn.execute("SELECT pg_stat_force_next_flush()")
    seq_before, idx_before = _scans(conn, table)
    with connect(dsn) as holder, connect(dsn) as drainer:
        if second:
            # another drainer holds the queue's lock: this one claims with SKIP LOCKED
            holder.execute(
                "SELECT pg_advisory_lock(hashtext('pgcounters.drain'), %s)",
                (int(mode == "unlogged"),),
            )
        drains = Counters(drainer)
        # more batches than PostgreSQL plans for the statement's parameters before it
        # considers a generic plan (5): the drain's statements keep their plans a session
        for _ in range(8):
            assert drains.drain_batch(1000, unlogged=mode == "unlogged") == (1000, 1000)
        drainer.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT pg_stat_force_next_flush()")
    seq_after, idx_after = _scans(conn, table)
    assert seq_after == seq_before, "the claim scanned the whole queue"
    assert idx_after > idx_before
    assert pc.get("big", 7) == 1000
    assert pc.get("big", 7, exact=False) == 8
