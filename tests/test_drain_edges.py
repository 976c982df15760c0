"""The range claim's edges: a drainer holding part of the queue, deletes of a counter's
deltas in another order, holes in ids, a column counter whose table is gone."""

from __future__ import annotations

import threading

import psycopg
import pytest

from pgcounters import Counters
from pgcounters.client import DrainResult
from pgcounters.connection import Conn
from pgcounters.worker import Worker, WorkerSettings
from support import lock_waiters, wait_for

ENQUEUE = "INSERT INTO pgcounters.queue (target_id, key, delta) VALUES (%s, %s, 1)"


def other_drainer_holds_the_head(dsn: str, rows: int) -> Conn:
    """A drainer of the SKIP LOCKED form in the middle of its batch: the first rows taken."""
    other = psycopg.connect(dsn)
    other.execute(
        "DELETE FROM pgcounters.queue WHERE id = ANY (ARRAY(SELECT id FROM pgcounters.queue"
        " ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED))",
        (rows,),
    )
    return other


@pytest.mark.parametrize("forget", ["reset_target", "drop_counter"])
def test_deleting_a_counters_deltas_waits_for_the_range_drainer_without_deadlock(
    dsn: str, conn: Conn, pc: Counters, forget: str
) -> None:
    t = pc.create_counter("t", key=int).id
    u = pc.create_counter("u", key=int).id
    for target, key in ((t, "{9}"), (u, "{3}"), (t, "{8}"), (t, "{7}")):
        conn.execute(ENQUEUE, (target, key))
    conn.execute(
        "INSERT INTO pgcounters.queue (target_id, key, delta)"
        " SELECT %s, ARRAY[(g %% 100)::text], 1 FROM generate_series(1, 20000) AS g",
        (u,),
    )
    conn.execute("ANALYZE pgcounters.queue")
    # another drainer holds row 2: the range drainer waits for it, holding row 1
    other = psycopg.connect(dsn)
    other.execute("DELETE FROM pgcounters.queue WHERE id = 2")
    results: dict[str, object] = {}

    def run(name: str, statement: str) -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            try:
                results[name] = c.execute(statement).fetchall()
            except psycopg.Error as exc:
                results[name] = exc

    drainer = threading.Thread(
        target=run, args=("drain", "SELECT * FROM pgcounters.drain_batch(10)")
    )
    drainer.start()
    wait_for(lambda: lock_waiters(conn) == 1)
    call = (
        f"SELECT pgcounters.reset_target({t})"
        if forget == "reset_target"
        else ("SELECT pgcounters.drop_counter('t')")
    )
    forgetter = threading.Thread(target=run, args=("forget", call))
    forgetter.start()
    wait_for(lambda: lock_waiters(conn) == 2)
    other.commit()
    other.close()
    drainer.join(timeout=30)
    forgetter.join(timeout=30)
    assert not isinstance(results["drain"], psycopg.Error), results["drain"]
    assert not isinstance(results["forget"], psycopg.Error), results["forget"]
    pc.drain()
    assert pc.pending() == (0, 0)
    # 20,000 rows over 100 keys; row 2 went with the other "drainer", which applied nothing
    assert pc.get("u", 3) == 200


def test_drain_goes_on_when_another_drainer_held_its_range(
    dsn: str, conn: Conn, pc: Counters
) -> None:
    n = pc.create_counter("n").id
    conn.execute(
        "INSERT INTO pgcounters.queue (target_id, key, delta)"
        " SELECT %s, '{}', 1 FROM generate_series(1, 300)",
        (n,),
    )
    other = other_drainer_holds_the_head(dsn, 100)
    out: list[DrainResult] = []

    def drain() -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            out.append(Counters(c).drain(batch_size=50))

    thread = threading.Thread(target=drain)
    thread.start()
    wait_for(lambda: lock_waiters(conn) == 1)
    other.commit()  # the rows it held are gone: the range drainer must look further
    other.close()
    thread.join(timeout=30)
    assert [r.deltas for r in out] == [200]
    assert pc.pending() == (0, 0)


def test_the_worker_does_not_wait_between_short_batches(dsn: str, conn: Conn, pc: Counters) -> None:
    """Every other id is a hole (rolled-back inserts): every batch is half full. A worker
    that waited after each short batch would need 40 x 30 s here."""
    c = pc.create_counter("c", key=int).id
    conn.execute(
        "INSERT INTO pgcounters.queue (target_id, key, delta)"
        " SELECT %s, ARRAY[(g %% 10)::text], 1 FROM generate_series(1, 40000) AS g",
        (c,),
    )
    conn.execute("DELETE FROM pgcounters.queue WHERE id % 2 = 0")
    settings = WorkerSettings(
        batch_size=1000, max_batch_size=1000, min_interval=30, max_interval=30
    )
    worker = Worker(dsn, settings)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_for(lambda: pc.pending() == (0, 0), timeout=60)
    finally:
        worker.stop()
        thread.join(timeout=60)
    stats = worker.get_stats()
    assert stats.deltas == 20000
    assert stats.batches >= 40  # short batches, one after the other
    assert sum(pc.get_many("c", range(10), exact=False)) == 20000


def test_a_column_counter_whose_table_is_gone_does_not_stop_the_others(
    conn: Conn, pc: Counters
) -> None:
    pc.create_counter("n")
    conn.execute("CREATE TABLE parent (id bigint PRIMARY KEY, cnt bigint NOT NULL DEFAULT 0)")
    conn.execute("INSERT INTO parent VALUES (1)")
    pc.create_column_counter("col", "parent", "cnt")
    pc.incr("col", 1)
    pc.incr("n")
    pc.incr("n")
    conn.execute("DROP TABLE parent")
    result = pc.drain()  # the table's deltas are left out, with a WARNING from the server
    assert result.deltas == 2
    assert pc.get("n", exact=False) == 2
    assert pc.pending() == (1, 0)  # the column counter's delta waits for its table
    conn.execute("CREATE TABLE parent (id bigint PRIMARY KEY, cnt bigint NOT NULL DEFAULT 0)")
    conn.execute("INSERT INTO parent VALUES (1)")
    assert pc.drain().deltas == 1
    assert conn.execute("SELECT cnt FROM parent").fetchone() == (1,)


def test_two_column_counters_of_one_table_never_wait_for_a_row_another_transaction_holds(
    dsn: str, conn: Conn, pc: Counters
) -> None:
    """A count and a sum kept in one table, and a recount holding row 1 while it goes on to
    row 2: the drain takes that table's rows without waiting, applies row 2 and leaves
    row 1's delta queued, so the recount can take row 2 and finish."""
    conn.execute(
        "CREATE TABLE article (id bigint PRIMARY KEY, n bigint NOT NULL DEFAULT 0,"
        " score bigint NOT NULL DEFAULT 0); INSERT INTO article VALUES (1), (2)"
    )
    count = pc.create_column_counter("article.n", "article", "n").id
    total = pc.create_column_counter("article.score", "article", "score").id
    conn.execute(ENQUEUE, (count, "{2}"))  # the first counter's key is the higher one
    conn.execute(ENQUEUE, (total, "{1}"))
    recount = psycopg.connect(dsn)  # a recount locks rows in key order: 1, then 2
    recount.execute("SELECT 1 FROM article WHERE id = 1 FOR NO KEY UPDATE")
    try:
        first = conn.execute("SELECT * FROM pgcounters.drain_queue(10)").fetchall()
        assert first == [(1, 1, 1, 0, False)]  # row 2 applied, row 1 left for later
        assert lock_waiters(conn) == 0
        recount.execute("SELECT 1 FROM article WHERE id = 2 FOR NO KEY UPDATE")
        recount.commit()
    finally:
        recount.close()
    assert conn.execute("SELECT * FROM pgcounters.drain_batch(10)").fetchall() == [(1, 1)]
    assert conn.execute("SELECT id, n, score FROM article ORDER BY id").fetchall() == [
        (1, 0, 1),
        (2, 1, 0),
    ]
