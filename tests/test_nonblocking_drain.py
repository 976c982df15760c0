"""The drain beside application transactions: it never waits on a parent row an
application holds (unless a session chooses the 1 ms attempt), so it cannot be a party
to a deadlock; deltas of a busy row stay queued (exact reads stay exact) and are applied
once the row is free."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from pgcounters import Counters
from pgcounters.client import BatchResult, Mode
from pgcounters.connection import Conn
from pgcounters.worker import Worker, WorkerSettings
from support import deadlocks, lock_waiters, wait_for


def articles(conn: Conn, pc: Counters, mode: Mode = "queued") -> int:
    conn.execute(
        "CREATE TABLE blog_article (id bigint PRIMARY KEY, body text NOT NULL DEFAULT '',"
        " comments bigint NOT NULL DEFAULT 0);"
        " INSERT INTO blog_article (id) SELECT generate_series(1, 5)"
    )
    return pc.create_column_counter("article.comments", "blog_article", "comments", mode=mode).id


def comments(conn: Conn) -> dict[int, int]:
    return dict(conn.execute("SELECT id, comments FROM blog_article ORDER BY id").fetchall())


@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("mode", ["queued", "unlogged"])
def test_a_drain_beside_an_application_locking_two_rows_in_any_order_never_deadlocks(
    dsn: str, conn: Conn, pc: Counters, mode: Mode, fast: bool
) -> None:
    """The application updates article 2, the drain applies deltas of 1 and 2, then the
    application updates article 1. The drain used to lock 1, wait for 2, and the
    application's second UPDATE closed the cycle: DeadlockDetected. The drain locks what
    is free without waiting; with pgcounters.fast_column_drain on, its column UPDATE waits
    at most 1 ms for article 2, then locks what is free."""
    articles(conn, pc, mode)
    pc.incr("article.comments", 1)
    pc.incr("article.comments", 2)
    before = deadlocks(conn)
    app = psycopg.connect(dsn)
    app.execute("UPDATE blog_article SET body = 'featured' WHERE id = 2")
    outcome: list[object] = []

    def drain() -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            if fast:
                c.execute("SET pgcounters.fast_column_drain = on")
            try:
                outcome.append(Counters(c).drain_queue_batch(100, unlogged=mode == "unlogged"))
            except psycopg.Error as exc:
                outcome.append(exc)

    thread = threading.Thread(target=drain)
    thread.start()
    # either the drain is done, or it waits on the application's row (the old drain
    # for good, the drain's column UPDATE for at most 1 ms)
    wait_for(lambda: bool(outcome) or lock_waiters(conn) == 1)
    try:
        app.execute("UPDATE blog_article SET body = '' WHERE id = 1")
        app.commit()
    finally:
        app.close()
        thread.join(timeout=30)
    # article 1 applied and article 2 busy; or, when the application's second UPDATE
    # took article 1 during the drain's 1 ms wait, both busy, or both applied once the
    # application had committed
    assert len(outcome) == 1
    batch = outcome[0]
    assert isinstance(batch, BatchResult)
    assert (batch.deltas + batch.busy, batch.keys, batch.quarantined) == (2, batch.deltas, 0)
    if not fast:
        assert (batch.deltas, batch.busy) == (1, 1)  # it waited for nothing
    assert deadlocks(conn) == before
    # the busy rows' deltas stayed queued: exact reads counted them all along
    assert pc.get("article.comments", 1) == 1
    assert pc.get("article.comments", 2) == 1
    assert sum(comments(conn).values()) == batch.deltas
    assert pc.drain().deltas == batch.busy
    assert comments(conn) == {1: 1, 2: 1, 3: 0, 4: 0, 5: 0}
    assert pc.pending() == (0, 0)


def test_a_busy_row_does_not_stop_the_drain_of_others_nor_lose_its_age(
    dsn: str, conn: Conn, pc: Counters
) -> None:
    articles(conn, pc)
    conn.execute(
        "INSERT INTO pgcounters.queue (target_id, key, delta, created_at)"
        " SELECT t.id, ARRAY[(g % 5 + 1)::text]::text, 1, now() - interval '1 hour'"
        " FROM pgcounters.targets t, generate_series(1, 100) g"
    )
    app = psycopg.connect(dsn)
    try:
        app.execute("SELECT 1 FROM blog_article WHERE id = 3 FOR UPDATE")
        result = pc.drain(batch_size=7)  # many batches; the busy row's deltas go round
        assert result.deltas == 80
        # the last batch found only article 3's deltas, folded as they went round into one
        # queued row: it left that row
        assert result.busy == 1
        assert comments(conn) == {1: 20, 2: 20, 3: 0, 4: 20, 5: 20}
        # left as one delta, as old as the oldest of the twenty
        rows = conn.execute(
            "SELECT key, delta, created_at < now() - interval '59 minutes' FROM pgcounters.queue"
        ).fetchall()
        assert rows == [("{3}", 20, True)]
        assert pc.get("article.comments", 3) == 20
    finally:
        app.commit()
        app.close()
    # the twenty, folded into one queued row: one delta applied, in one batch
    final = pc.drain()
    assert (final.deltas, final.keys, final.batches, final.busy) == (1, 1, 1, 0)
    assert comments(conn) == {1: 20, 2: 20, 3: 20, 4: 20, 5: 20}
    assert pc.pending() == (0, 0)


def test_a_row_held_busy_by_the_application_is_applied_by_the_worker_once_free(
    dsn: str, conn: Conn, pc: Counters
) -> None:
    """No starvation: while the application holds article 3, the worker applies every
    other delta and keeps article 3's queued; once the application commits, the worker
    applies them. The lag after the release is measured (printed, not asserted: the
    machine is shared)."""
    articles(conn, pc)
    app = psycopg.connect(dsn)
    app.execute("UPDATE blog_article SET body = 'held' WHERE id = 3")
    worker = Worker(dsn, WorkerSettings(batch_size=50, min_interval=0.01, max_interval=0.2))
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        for i in range(200):
            pc.incr("article.comments", i % 5 + 1)
        wait_for(lambda: comments(conn) == {1: 40, 2: 40, 3: 0, 4: 40, 5: 40})
        assert pc.get("article.comments", 3) == 40  # exact all along
        assert lock_waiters(conn) == 0  # the worker waits for nobody
        released = time.monotonic()
        app.commit()
        wait_for(lambda: comments(conn)[3] == 40)
        lag = time.monotonic() - released
        print(f"busy row applied {lag * 1000:.0f} ms after its release")
    finally:
        app.close()
        worker.stop()
        thread.join(timeout=30)
    assert pc.pending() == (0, 0)
    assert worker.get_stats().errors == 0


def log_lock_timeout(conn: Conn) -> None:
    """Each UPDATE of an article logs the lock_timeout it ran under (the drain's write)."""
    conn.execute(
        "CREATE TABLE article_writes (id bigint, lock_timeout text);"
        " CREATE FUNCTION log_article_write() RETURNS trigger LANGUAGE plpgsql AS $$"
        " BEGIN INSERT INTO article_writes VALUES (NEW.id, current_setting('lock_timeout'));"
        " RETURN NEW; END $$;"
        " CREATE TRIGGER article_writes BEFORE UPDATE ON blog_article"
        " FOR EACH ROW EXECUTE FUNCTION log_article_write()"
    )


def writes(conn: Conn) -> list[tuple[int, str]]:
    rows = conn.execute("SELECT id, lock_timeout FROM article_writes ORDER BY id").fetchall()
    conn.execute("TRUNCATE article_writes")
    return [(int(i), str(t)) for i, t in rows]


def test_with_no_row_busy_the_column_deltas_are_one_update_that_waits_at_most_1ms(
    conn: Conn, pc: Counters
) -> None:
    """With pgcounters.fast_column_drain on, a batch updates the parent rows in one
    statement under a lock_timeout of 1 ms (no separate locking pass); the caller's
    lock_timeout is back afterwards. Off (the default), the rows are locked without
    waiting first, under the caller's lock_timeout."""
    articles(conn, pc)
    log_lock_timeout(conn)
    pc.incr("article.comments", 3)
    assert pc.drain().deltas == 1
    assert writes(conn) == [(3, "0")]  # the default: the locking statement
    conn.execute("SET pgcounters.fast_column_drain = on")
    for key in (1, 2, 2, 5):
        pc.incr("article.comments", key)
    with conn.transaction():
        conn.execute("SET LOCAL lock_timeout = '7s'")
        batch = conn.execute(
            "SELECT deltas, keys, busy FROM pgcounters.drain_queue(100)"
        ).fetchone()
        assert conn.execute("SHOW lock_timeout").fetchone() == ("7s",)
    assert batch == (4, 3, 0)
    assert writes(conn) == [(1, "1ms"), (2, "1ms"), (5, "1ms")]
    assert comments(conn) == {1: 1, 2: 2, 3: 1, 4: 0, 5: 1}


def test_a_busy_row_sends_the_table_to_the_locking_statement_until_none_is_busy(
    dsn: str, conn: Conn, pc: Counters
) -> None:
    """A row the application holds stops the one-statement UPDATE within 1 ms; the batch
    then locks the free rows without waiting (under the caller's lock_timeout), puts the
    busy row's delta back, and the session's next batches on that table lock first
    until one finds no row busy."""
    articles(conn, pc)
    log_lock_timeout(conn)
    conn.execute("SET pgcounters.fast_column_drain = on")
    pc.incr("article.comments", 1)
    pc.incr("article.comments", 3)
    app = psycopg.connect(dsn)
    try:
        app.execute("SELECT 1 FROM blog_article WHERE id = 3 FOR UPDATE")
        batch = pc.drain_queue_batch(100)
        assert (batch.deltas, batch.keys, batch.busy) == (1, 1, 1)
        assert writes(conn) == [(1, "0")]  # the 1 ms attempt was rolled back
        held = "SELECT current_setting('pgcounters.held_tables', true)"
        assert conn.execute(held).fetchone() == ("{public.blog_article}",)
        pc.incr("article.comments", 2)
        assert pc.drain().deltas == 1  # article 2; article 3 still busy
        assert writes(conn) == [(2, "0")]
        assert comments(conn) == {1: 1, 2: 1, 3: 0, 4: 0, 5: 0}
    finally:
        app.rollback()
        app.close()
    assert pc.drain().deltas == 1
    assert writes(conn) == [(3, "0")]
    assert conn.execute(held).fetchone() == ("{}",)
    pc.incr("article.comments", 4)
    assert pc.drain().deltas == 1
    assert writes(conn) == [(4, "1ms")]  # one statement again
    assert comments(conn) == {1: 1, 2: 1, 3: 1, 4: 1, 5: 0}
    assert pc.get("article.comments", 3) == 1


def test_a_batch_of_more_than_20000_column_keys_locks_its_rows_first(
    conn: Conn, pc: Counters
) -> None:
    """A long UPDATE could hold rows an application waits for long enough for that
    application's own deadlock check: beyond 20,000 keys the batch takes the locking
    statement (the caller's lock_timeout, 0), not the 1 ms attempt."""
    articles(conn, pc)
    conn.execute("INSERT INTO blog_article (id) SELECT generate_series(6, 20001)")
    log_lock_timeout(conn)
    conn.execute("SET pgcounters.fast_column_drain = on")
    conn.execute(
        "INSERT INTO pgcounters.queue (target_id, key, delta)"
        " SELECT t.id, ARRAY[g::text]::text, 1 FROM pgcounters.targets t,"
        " generate_series(1, 20001) g"
    )
    batch = pc.drain_queue_batch(30_000)
    assert (batch.deltas, batch.keys, batch.busy) == (20_001, 20_001, 0)
    assert conn.execute(
        "SELECT lock_timeout, count(*) FROM article_writes GROUP BY 1"
    ).fetchall() == [("0", 20_001)]
    assert conn.execute("SELECT sum(comments), min(comments) FROM blog_article").fetchone() == (
        20_001,
        1,
    )
