"""Recount and verify beside the application: rows another transaction holds are skipped
and recounted at the end (never waited for while holding others), batches PostgreSQL
aborts are retried with a WARNING, and a recount that cannot finish says so in one line."""

from __future__ import annotations

import datetime as dt
import logging
import threading

import psycopg
import pytest

import blog_schema
from pgcounters import BatchAborted, Counters, cli
from pgcounters.connection import Conn
from pgcounters.repair import RecountResult, recount, verify
from pgcounters.specs import ColumnTarget, CounterSpec, Fragment
from pgcounters.triggers import install
from support import deadlocks, lock_waiters, tamper, wait_for

SPEC = "blog.article.public_comments"


def retries(conn: Conn, operation: str) -> int:
    row = conn.execute(
        "SELECT coalesce(sum(retries), 0) FROM pgcounters.retries WHERE operation = %s",
        (operation,),
    ).fetchone()
    return int(row[0]) if row else 0


# what the blog fixture writes: 50 public comments on five articles in turn
ARTICLES = range(1, 6)
PUBLIC_COMMENTS = 10


def assert_recounted(conn: Conn) -> None:
    """Each article's exact value, then its column once drained, is what the fixture wrote
    (the recount repaired the tampered values)."""
    pc = Counters(conn)
    assert pc.get_many(SPEC, ARTICLES) == [PUBLIC_COMMENTS] * len(ARTICLES)
    pc.drain()
    assert conn.execute("SELECT id, public_comments FROM blog_article ORDER BY id").fetchall() == [
        (a, PUBLIC_COMMENTS) for a in ARTICLES
    ]


@pytest.fixture
def blog(conn: Conn) -> Conn:
    blog_schema.create(conn, users=2, articles=5)
    for spec in blog_schema.specs("queued"):
        install(conn, [spec])
    conn.execute(
        "INSERT INTO blog_comment (article_id, creator_id, publish_status)"
        " SELECT 1 + g % 5, 1 + g % 2, 'public' FROM generate_series(1, 50) g"
    )
    # wrong stored values, for the recount to repair
    tamper(conn, "UPDATE blog_article SET public_comments = 1000 + id")
    return conn


def test_a_recount_beside_an_application_holding_parent_rows_never_deadlocks(
    dsn: str, blog: Conn
) -> None:
    """The application updates article 3, the recount goes through articles 1-5, then the
    application updates article 1. The recount used to hold 1 and 2 while it waited for 3:
    the second UPDATE closed the cycle."""
    before = deadlocks(blog)
    app = psycopg.connect(dsn)
    app.execute("UPDATE blog_article SET title = 'featured' WHERE id = 3")
    outcome: list[object] = []

    def run() -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            try:
                outcome.append(recount(c, SPEC, batch_size=10))
            except psycopg.Error as exc:
                outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        wait_for(lambda: lock_waiters(blog) == 1)  # the recount waits for article 3
        app.execute("UPDATE blog_article SET title = '' WHERE id = 1")
        app.commit()
    finally:
        app.close()
        thread.join(timeout=60)
    assert len(outcome) == 1
    result = outcome[0]
    assert isinstance(result, RecountResult), result
    assert (result.keys_done, result.keys_fixed, result.busy_keys) == (5, 5, 1)
    recorded = blog.execute(
        "SELECT keys_done, keys_fixed, finished_at IS NOT NULL FROM pgcounters.recounts"
        " WHERE name = %s",
        (SPEC,),
    ).fetchone()
    assert recorded == (5, 5, True)
    assert deadlocks(blog) == before
    assert_recounted(blog)


def test_a_named_recount_skips_rows_a_direct_writer_holds(dsn: str, conn: Conn) -> None:
    blog_schema.create(conn, users=1, articles=3)
    spec = next(s for s in blog_schema.specs("direct") if s.name == "blog.comments_per_article_day")
    install(conn, [spec])
    conn.execute(
        "INSERT INTO blog_comment (article_id, creator_id, publish_status)"
        " SELECT 1 + g % 3, 1, 'public' FROM generate_series(1, 30) g"
    )
    conn.execute("UPDATE pgcounters.counters SET value = value + 7")
    app = psycopg.connect(dsn)
    # a direct counter's writer: its transaction holds the row of article 2's key
    app.execute(
        "INSERT INTO blog_comment (article_id, creator_id, publish_status) VALUES (2, 1, 'public')"
    )
    outcome: list[object] = []

    def run() -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            outcome.append(recount(c, spec.name, batch_size=10))

    thread = threading.Thread(target=run)
    thread.start()
    try:
        wait_for(lambda: lock_waiters(conn) == 1)
        app.commit()
    finally:
        app.close()
        thread.join(timeout=60)
    result = outcome[0]
    assert isinstance(result, RecountResult)
    assert (result.keys_done, result.busy_keys) == (3, 1)
    # the 30 comments on three articles in turn, and the application's one more on article 2
    # (the recount came back to its busy key): the +7 of each key repaired
    day = dt.date(2026, 11, 21)  # the comments' default day
    keys = [(a, day) for a in (1, 2, 3)]
    assert Counters(conn).get_many(spec.name, keys) == [10, 11, 10]
    stored = conn.execute(
        "SELECT key, value FROM pgcounters.counters ORDER BY key[1]::bigint"
    ).fetchall()
    assert stored == [([str(a), day.isoformat()], n) for a, n in ((1, 10), (2, 11), (3, 10))]


def test_an_aborted_batch_is_retried_with_a_warning_and_counted(
    dsn: str, blog: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    """A batch that PostgreSQL cancels (here: lock_timeout while an operator holds the
    counted table) is retried until it gets through."""
    holder = psycopg.connect(dsn)
    holder.execute("LOCK TABLE blog_comment IN ACCESS EXCLUSIVE MODE")
    outcome: list[object] = []

    def run() -> None:
        with psycopg.connect(dsn, autocommit=True, options="-c lock_timeout=100") as c:
            try:
                outcome.append(recount(c, SPEC, batch_size=10))
            except Exception as exc:  # the test reports it below
                outcome.append(exc)

    caplog.set_level(logging.WARNING, logger="pgcounters.recount")
    thread = threading.Thread(target=run)
    thread.start()
    try:
        wait_for(lambda: retries(blog, "recount") >= 1)
    finally:
        holder.rollback()
        holder.close()
        thread.join(timeout=60)
    assert isinstance(outcome[0], RecountResult), outcome
    assert_recounted(blog)
    warnings = [r.getMessage() for r in caplog.records if r.name == "pgcounters.recount"]
    assert warnings
    assert all("aborted by lock timeout, retrying" in w for w in warnings)


def test_verify_retries_a_cancelled_statement(
    dsn: str, blog: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    recount(blog, SPEC)
    assert_recounted(blog)  # what verify must find right
    holder = psycopg.connect(dsn)
    holder.execute("LOCK TABLE blog_comment IN ACCESS EXCLUSIVE MODE")
    outcome: list[object] = []

    def run() -> None:
        with psycopg.connect(dsn, autocommit=True, options="-c lock_timeout=100") as c:
            outcome.append(verify(c, SPEC))

    thread = threading.Thread(target=run)
    thread.start()
    try:
        wait_for(lambda: retries(blog, "verify") >= 1)
    finally:
        holder.rollback()
        holder.close()
        thread.join(timeout=60)
    assert [getattr(r, "ok", r) for r in outcome] == [True]


def test_a_recount_that_cannot_get_through_stops_with_one_line_and_exit_1(
    dsn: str, blog: Conn, capsys: pytest.CaptureFixture[str]
) -> None:
    holder = psycopg.connect(dsn)
    holder.execute("LOCK TABLE blog_comment IN ACCESS EXCLUSIVE MODE")
    try:
        with (
            psycopg.connect(dsn, autocommit=True, options="-c lock_timeout=50") as c,
            pytest.raises(BatchAborted, match="aborted 6 times, last by lock timeout"),
        ):
            recount(c, SPEC)
        slow = dsn + " options='-c lock_timeout=50'"
        code = cli.run(["--dsn", slow, "recount", SPEC, "--no-progress"])
    finally:
        holder.rollback()
        holder.close()
    err = capsys.readouterr().err
    assert code == cli.EXIT_ERROR
    lines = [line for line in err.splitlines() if line.startswith("pgcounters: error:")]
    assert len(lines) == 1
    assert "Traceback" not in err


def test_direct_mode_writing_for_user_b_then_a_beside_a_drain_and_a_recount(
    dsn: str, conn: Conn
) -> None:
    """Direct mode's contract: the writer's transaction locks user B's row (its first
    notification), then user A's. A drain (queued counter on the same table) and a recount
    (of the direct counter) run in between: neither waits for B while holding A, so the
    application's second write goes through and nothing deadlocks."""
    conn.execute(
        "CREATE TABLE app_user (id bigint PRIMARY KEY, unread bigint NOT NULL DEFAULT 0,"
        " received bigint NOT NULL DEFAULT 0);"
        " CREATE TABLE notification (id bigserial PRIMARY KEY, user_id bigint NOT NULL,"
        " read boolean NOT NULL DEFAULT false);"
        " INSERT INTO app_user (id) VALUES (1), (2)"
    )
    unread = CounterSpec(
        name="user.unread",
        source="notification",
        keys=("user_id",),
        target=ColumnTarget("app_user", "unread"),
        where=Fragment("NOT read"),
        mode="direct",
    )
    received = CounterSpec(
        name="user.received",
        source="notification",
        keys=("user_id",),
        target=ColumnTarget("app_user", "received"),
        mode="queued",
    )
    install(conn, [unread, received])
    conn.execute("INSERT INTO notification (user_id) VALUES (1), (2), (2)")
    tamper(conn, "UPDATE app_user SET unread = 50")  # wrong, for the recount
    before = deadlocks(conn)
    app = psycopg.connect(dsn)
    app.execute("INSERT INTO notification (user_id) VALUES (2)")  # user B's row locked
    pc = Counters(conn)
    batch = pc.drain_queue_batch(100)
    assert (batch.deltas, batch.busy) == (1, 1)  # user A applied, user B's left queued
    outcome: list[object] = []

    def run() -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            try:
                outcome.append(recount(c, unread.name, batch_size=10))
            except psycopg.Error as exc:
                outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        wait_for(lambda: lock_waiters(conn) == 1)  # the recount waits for B, holding nothing
        app.execute("INSERT INTO notification (user_id) VALUES (1)")  # then user A's
        app.commit()
    finally:
        app.close()
        thread.join(timeout=60)
    assert isinstance(outcome[0], RecountResult), outcome
    assert deadlocks(conn) == before
    pc.drain()
    assert conn.execute("SELECT id, unread, received FROM app_user ORDER BY id").fetchall() == [
        (1, 2, 2),
        (2, 3, 3),
    ]
