"""Online backfill: counters installed or changed over rows that already exist.

The truth is counted here by hand-written SQL, never by pgcounters' verify or
recount.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import psycopg
import pytest

import blog_schema
from pgcounters import Counters, backfill, triggers
from pgcounters.connection import Conn
from pgcounters.errors import CounterBackfilling
from pgcounters.specs import ColumnTarget, CounterSpec, Fragment
from support import wait_for

TRUTH = {
    "blog.article.public_comments": (
        "SELECT a.id, count(c.id) FILTER (WHERE c.publish_status = 'public')"
        " FROM blog_article a LEFT JOIN blog_comment c ON c.article_id = a.id"
        " GROUP BY a.id ORDER BY a.id"
    ),
    "blog.article.score_total": (
        "SELECT a.id, coalesce(sum(c.score), 0) FROM blog_article a"
        " LEFT JOIN blog_comment c ON c.article_id = a.id GROUP BY a.id ORDER BY a.id"
    ),
}
STORED = {
    "blog.article.public_comments": "SELECT id, public_comments FROM blog_article ORDER BY id",
    "blog.article.score_total": "SELECT id, score_total FROM blog_article ORDER BY id",
}


@pytest.fixture
def blog(conn: Conn) -> Conn:
    blog_schema.create(conn)
    conn.execute("INSERT INTO blog_user (username) SELECT 'u' || i FROM generate_series(1, 5) i")
    conn.execute("INSERT INTO blog_article (title) SELECT 'a' || i FROM generate_series(1, 40) i")
    # rows written before any counter exists: 0 to 39 comments per article
    conn.execute(
        "INSERT INTO blog_comment (article_id, creator_id, publish_status, score)"
        " SELECT a, 1 + a % 5, CASE WHEN n % 3 = 0 THEN 'private' ELSE 'public' END, n"
        " FROM generate_series(1, 40) a, generate_series(1, 40) n WHERE n < a"
    )
    return conn


def column_specs() -> list[CounterSpec]:
    return [s for s in blog_schema.specs() if s.name in TRUTH]


def rows(conn: Conn, query: str, params: Any = None) -> list[tuple[int, int]]:
    return [(int(a), int(b)) for a, b in conn.execute(query, params).fetchall()]


def assert_exact(conn: Conn, name: str) -> None:
    Counters(conn).drain()
    assert rows(conn, STORED[name]) == rows(conn, TRUTH[name]), name


def test_install_over_existing_rows_counts_them(blog: Conn) -> None:
    assert max(n for _, n in rows(blog, TRUTH["blog.article.public_comments"])) >= 20
    triggers.install(blog, column_specs())
    assert backfill.pending(blog) == []
    for name in TRUTH:
        assert_exact(blog, name)


def test_a_changed_filter_or_sum_is_backfilled(blog: Conn) -> None:
    triggers.install(blog, column_specs())
    blog.execute("INSERT INTO blog_comment (article_id, publish_status, score) VALUES (3, 'x', 7)")
    narrowed = CounterSpec(
        name="blog.article.public_comments",
        source="blog_comment",
        keys=("article_id",),
        target=ColumnTarget("blog_article", "public_comments"),
        where=Fragment("publish_status = %s AND score > %s", ("public", 10)),
    )
    triggers.install(blog, [narrowed])
    truth = (
        "SELECT a.id, count(c.id) FILTER (WHERE c.publish_status = 'public' AND c.score > 10)"
        " FROM blog_article a LEFT JOIN blog_comment c ON c.article_id = a.id"
        " GROUP BY a.id ORDER BY a.id"
    )
    Counters(blog).drain()
    assert rows(blog, STORED["blog.article.public_comments"]) == rows(blog, truth)


def test_a_backfill_goes_batch_by_batch_resumes_and_reads_refuse_meanwhile(
    blog: Conn, dsn: str
) -> None:
    triggers.install(blog, column_specs(), backfill=False)
    pending = {b.name: b for b in backfill.pending(blog)}
    assert set(pending) == set(TRUTH)
    assert pending["blog.article.public_comments"].cursor is None
    pc = Counters(blog)
    with pytest.raises(CounterBackfilling, match="being backfilled"):
        pc.get("blog.article.public_comments", 40)
    with pytest.raises(psycopg.Error, match="being backfilled"):
        blog.execute("SELECT pgcounters.get('blog.article.public_comments', '{40}')")
    with psycopg.connect(dsn, autocommit=True) as writer:
        writer.execute("SET lock_timeout = '5s'")
        for i in range(6):
            assert backfill.step(blog, batch_size=7) > 0
            # between batches the application writes parent and counted rows freely
            writer.execute("UPDATE blog_article SET title = title || '.'")
            writer.execute(
                "INSERT INTO blog_comment (article_id, publish_status, score)"
                " VALUES (%s, 'public', 1), (%s, 'public', 2)",
                (1 + i * 7, 40 - i),
            )
            writer.execute(
                "DELETE FROM blog_comment WHERE id IN (SELECT min(id) FROM blog_comment)"
            )
            pc.drain()
    left = {b.name: b for b in backfill.pending(blog)}
    assert left  # interrupted: resumes from its cursor
    assert left["blog.article.public_comments"].cursor is not None
    assert left["blog.article.public_comments"].keys_done == 42
    done = backfill.run(blog)
    assert sum(done.values()) > 0
    assert backfill.pending(blog) == []
    for name in TRUTH:
        assert_exact(blog, name)
    truth = dict(rows(blog, TRUTH["blog.article.public_comments"]))
    assert pc.get("blog.article.public_comments", 40) == truth[40]


def test_uninstall_forgets_a_pending_backfill(blog: Conn) -> None:
    triggers.install(blog, column_specs(), backfill=False)
    triggers.uninstall(blog, "blog.article.score_total")
    assert [b.name for b in backfill.pending(blog)] == ["blog.article.public_comments"]


def test_a_worker_round_runs_backfill_batches(blog: Conn, dsn: str) -> None:
    from pgcounters.worker import Worker, WorkerSettings

    triggers.install(blog, column_specs(), backfill=False)
    worker = Worker(dsn, WorkerSettings(batch_size=10))
    with psycopg.connect(dsn, autocommit=True) as conn:
        while backfill.pending(conn):
            worker._round(conn)
    for name in TRUTH:
        assert_exact(blog, name)


def test_status_shows_backfills(blog: Conn) -> None:
    from pgcounters import status

    triggers.install(blog, column_specs(), backfill=False)
    backfill.step(blog, batch_size=4)
    snapshot = status.get_status(blog)
    text = status.text(snapshot)
    assert "backfills: 2 counters backfilling" in text
    assert "blog.article.public_comments  backfilling, 4 keys done" in text
    assert "pgcounters_backfills 2" in status.prometheus(snapshot)
    backfill.run(blog)
    assert "backfills: none" in status.text(status.get_status(blog))


def test_named_counters_are_backfilled_too(blog: Conn) -> None:
    named = [s for s in blog_schema.specs() if s.name not in TRUTH and not s.key_types]
    named += [s for s in blog_schema.specs() if s.name == "blog.comments_per_article_day"]
    triggers.install(blog, named, backfill=False)
    pc = Counters(blog)
    day = blog.execute("SELECT min(created_on) FROM blog_comment").fetchone()
    assert day is not None
    with pytest.raises(CounterBackfilling):
        pc.get_many("blog.comments_per_article_day", [(3, day[0]), (4, day[0])])
    assert sum(backfill.run(blog, batch_size=3).values()) > 0
    truth = rows(
        blog,
        "SELECT article_id, count(*) FROM blog_comment WHERE article_id IN (3, 4)"
        " AND publish_status = 'public' AND created_on = %s"
        " GROUP BY article_id ORDER BY article_id",
        (day[0],),
    )
    assert pc.get_many("blog.comments_per_article_day", [(3, day[0]), (4, day[0])]) == [
        n for _, n in truth
    ]
    total = blog.execute("SELECT count(*) FROM blog_comment").fetchone()
    assert total is not None
    assert pc.get("blog.comments_total") == total[0] > 0


def test_the_backfill_and_list_commands(
    blog: Conn, dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from pgcounters import cli

    assert cli.run(["--dsn", dsn, "backfill"]) == 0
    assert capsys.readouterr().out == "no backfill pending\n"
    triggers.install(blog, column_specs(), backfill=False)
    assert cli.run(["--dsn", dsn, "list", "--json"]) == 0
    listed = {c["name"]: c["backfilling"] for c in json.loads(capsys.readouterr().out)}
    assert listed == dict.fromkeys(TRUTH, True)
    assert cli.run(["--dsn", dsn, "backfill", "nope"]) == 1
    assert "no backfill is pending for nope" in capsys.readouterr().err
    assert cli.run(["--dsn", dsn, "backfill", "--batch-size", "10"]) == 0
    out = capsys.readouterr().out
    assert "blog.article.public_comments: backfilled, 45 keys" in out
    for name in TRUTH:
        assert_exact(blog, name)
    assert cli.run(["--dsn", dsn, "list"]) == 0
    assert "backfilling" not in capsys.readouterr().out


def test_a_backfill_waits_without_spinning_for_a_row_an_application_holds(
    dsn: str, blog: Conn
) -> None:
    """The backfill leaves a busy row alone and tries it again after a pause that grows,
    and finishes exact once the row is free (it ran thousands of transactions a second)."""
    triggers.install(blog, column_specs(), backfill=False)
    app = psycopg.connect(dsn)
    app.execute("SELECT 1 FROM blog_article WHERE id = 1 FOR UPDATE")  # the first key
    done: list[dict[str, int]] = []

    def run() -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            done.append(backfill.run(c))

    def commits() -> int:
        blog.execute("SELECT pg_stat_clear_snapshot()")
        row = blog.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database"
            " WHERE datname = current_database()"
        ).fetchone()
        assert row is not None
        return int(row[0])

    thread = threading.Thread(target=run)
    try:
        thread.start()
        wait_for(lambda: backfill.pending(blog) != [] and commits() > 0)
        before = commits()
        time.sleep(1.5)  # the application holds the row this long (the scenario, not a check)
        during = commits() - before
    finally:
        app.rollback()
        app.close()
    thread.join(60)
    assert not thread.is_alive()
    # pauses of 0.01 s doubling to 0.5 s: about ten attempts in 1.5 s, a few statements each
    assert during < 150, during
    assert len(done) == 1
    articles = blog.execute("SELECT count(*) FROM blog_article").fetchone()
    assert articles is not None
    assert done[0] == dict.fromkeys(TRUTH, articles[0])  # every key, each once
    for name in TRUTH:
        assert_exact(blog, name)
