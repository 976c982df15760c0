"""A whole batch of busy deltas does not end a drain while applicable deltas wait behind
it: ``CALL pgcounters.drain_all``, :meth:`Counters.drain` and the worker go on past it.

An application holds the parent rows of the first batch's keys; every delta of that
batch is left queued (busy). The deltas of another key, queued after them, must be
applied by the same drain, not left for a later one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import psycopg
import pytest
from psycopg import sql

from pgcounters import Counters
from pgcounters.connection import Conn
from pgcounters.worker import Worker, WorkerSettings

BATCH = 3
HELD = (1, 2, 3)  # the keys of the first batch: one delta each, parent rows held
FREE_KEY = 4  # five deltas queued behind them


def comments(conn: Conn) -> dict[int, int]:
    return dict(conn.execute("SELECT id, comments FROM blog_article ORDER BY id").fetchall())


def queued(conn: Conn) -> list[tuple[str, int]]:
    return [
        (str(k), int(d))
        for k, d in conn.execute(
            "SELECT key, sum(delta) FROM pgcounters.queue GROUP BY key ORDER BY key"
        ).fetchall()
    ]


@pytest.fixture
def held(dsn: str, conn: Conn, pc: Counters) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    conn.execute(
        "CREATE TABLE blog_article (id bigint PRIMARY KEY, comments bigint NOT NULL DEFAULT 0);"
        " INSERT INTO blog_article (id) SELECT generate_series(1, 5)"
    )
    pc.create_column_counter("article.comments", "blog_article", "comments")
    for key in HELD:
        pc.incr("article.comments", key)
    for _ in range(5):
        pc.incr("article.comments", FREE_KEY)
    # the first batch's ids are the held keys' deltas, the free key's come after
    first = conn.execute(
        "SELECT array_agg(key ORDER BY id) FROM (SELECT id, key FROM pgcounters.queue"
        " ORDER BY id LIMIT %s) AS b",
        (BATCH,),
    ).fetchone()
    assert first == (["{1}", "{2}", "{3}"],)
    app = psycopg.connect(dsn)
    app.execute("SELECT id FROM blog_article WHERE id = ANY (%s) FOR UPDATE", (list(HELD),))
    try:
        yield app
    finally:
        app.close()


def drain_all(conn: Conn, pc: Counters) -> None:
    conn.execute("SELECT set_config('pgcounters.max_batch_size', %s, false)", (str(BATCH),))
    # a literal: a parameter makes drain_all refuse to run (it takes the Bind's time for
    # the one of a transaction block)
    row = conn.execute(sql.SQL("CALL pgcounters.drain_all({})").format(BATCH)).fetchone()
    assert row == (5, len(HELD), 0)  # deltas applied, left busy, set aside


def client_drain(conn: Conn, pc: Counters) -> None:
    result = pc.drain(batch_size=BATCH, max_batch_size=BATCH)
    assert (result.deltas, result.busy, result.quarantined) == (5, len(HELD), 0)


def worker_rounds(conn: Conn, pc: Counters) -> None:
    """The worker's rounds, as its loop runs them, until it would wait: the rounds it
    runs at once, before any idle interval (an hour here)."""
    worker = Worker(
        "", WorkerSettings(batch_size=BATCH, max_batch_size=BATCH, min_interval=3600,
                           max_interval=3600, linger=0, log_every=0),
    )  # fmt: skip
    interval = worker.settings.min_interval
    for _ in range(20):
        got, full, busy = worker._round(conn)
        wait, _, interval = worker._pace(got, full, busy, interval)
        if wait:
            return
    raise AssertionError("the worker never paused")


@pytest.mark.parametrize(
    "drain", [drain_all, client_drain, worker_rounds], ids=["drain_all", "drain", "worker"]
)
def test_deltas_behind_a_wholly_busy_batch_are_applied(
    conn: Conn,
    pc: Counters,
    held: psycopg.Connection[tuple[object, ...]],
    drain: Callable[[Conn, Counters], None],
) -> None:
    drain(conn, pc)
    assert comments(conn) == {1: 0, 2: 0, 3: 0, FREE_KEY: 5, 5: 0}
    assert queued(conn) == [("{1}", 1), ("{2}", 1), ("{3}", 1)]  # busy, still queued
    held.rollback()  # the application lets go: the next drain applies them
    pc.drain()
    assert comments(conn) == {1: 1, 2: 1, 3: 1, FREE_KEY: 5, 5: 0}
    assert queued(conn) == []
