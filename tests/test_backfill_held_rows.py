"""A backfill never moves its cursor past a row an application holds: a key in the middle
of a batch and the last key of the table, both held, are backfilled once they are free.

The truth is a hand-written count of the comments; the application also writes to the
rows it holds, so their counts change while the backfill waits for them.
"""

from __future__ import annotations

import threading

import psycopg
import pytest

import blog_schema
from pgcounters import Counters, backfill, triggers
from pgcounters.connection import Conn
from support import wait_for

NAME = "blog.article.public_comments"
ARTICLES = 40
HELD = (20, ARTICLES)  # a key in the middle of the second batch, and the last key
BATCH = 15

TRUTH = (
    "SELECT a.id, count(c.id) FILTER (WHERE c.publish_status = 'public')"
    " FROM blog_article a LEFT JOIN blog_comment c ON c.article_id = a.id"
    " GROUP BY a.id ORDER BY a.id"
)
STORED = "SELECT id, public_comments FROM blog_article ORDER BY id"


def rows(conn: Conn, query: str) -> list[tuple[int, int]]:
    return [(int(a), int(b)) for a, b in conn.execute(query).fetchall()]


@pytest.fixture
def blog(conn: Conn) -> Conn:
    blog_schema.create(conn, users=1, articles=ARTICLES)
    # written before the counter exists: article a has a - 1 comments, a third private
    conn.execute(
        "INSERT INTO blog_comment (article_id, creator_id, publish_status, score)"
        " SELECT a, 1, CASE WHEN n %% 3 = 0 THEN 'private' ELSE 'public' END, n"
        " FROM generate_series(1, %s) a, generate_series(1, %s) n WHERE n < a",
        (ARTICLES, ARTICLES),
    )
    triggers.install(conn, [s for s in blog_schema.specs() if s.name == NAME], backfill=False)
    assert [b.name for b in backfill.pending(conn)] == [NAME]
    return conn


def hold(dsn: str) -> psycopg.Connection[tuple[object, ...]]:
    app = psycopg.connect(dsn)
    app.execute("SELECT id FROM blog_article WHERE id = ANY (%s) FOR UPDATE", (list(HELD),))
    return app


def write_and_release(app: psycopg.Connection[tuple[object, ...]]) -> None:
    """The application adds a public comment to each row it holds, and commits."""
    for article in HELD:
        app.execute(
            "INSERT INTO blog_comment (article_id, creator_id, publish_status, score)"
            " VALUES (%s, 1, 'public', 1)",
            (article,),
        )
    app.commit()
    app.close()


def expected() -> list[tuple[int, int]]:
    """Public comments per article, by hand: a - 1 comments numbered 1 .. a - 1, those
    numbered by a multiple of 3 private; one more public on each held article."""
    return [(a, sum(1 for n in range(1, a) if n % 3) + (a in HELD)) for a in range(1, ARTICLES + 1)]


def test_the_workers_steps_stop_before_a_held_key_and_come_back_for_it(
    dsn: str, blog: Conn
) -> None:
    app = hold(dsn)
    try:
        for _ in range(5):
            backfill.step(blog, BATCH)
        # the first batch, then the second up to the key before the held one
        [pending] = backfill.pending(blog)
        assert (pending.cursor, pending.keys_done) == (("19",), 19)
    finally:
        write_and_release(app)
    while backfill.pending(blog):
        backfill.step(blog, BATCH)
    Counters(blog).drain()
    assert rows(blog, STORED) == rows(blog, TRUTH) == expected()


def test_a_backfill_run_waits_for_each_held_key(dsn: str, blog: Conn) -> None:
    app = hold(dsn)
    done: list[dict[str, int]] = []

    def run() -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            done.append(backfill.run(c, batch_size=BATCH))

    thread = threading.Thread(target=run)
    try:
        thread.start()
        at_held = [("19",)]  # the cursor stops before the first held key
        wait_for(
            lambda: [b.cursor for b in backfill.pending(blog)] == at_held or not thread.is_alive()
        )
        assert [b.cursor for b in backfill.pending(blog)] == at_held
    finally:
        write_and_release(app)
    thread.join(60)
    assert not thread.is_alive()
    assert done == [{NAME: ARTICLES}]  # every key, each once
    Counters(blog).drain()
    assert rows(blog, STORED) == rows(blog, TRUTH) == expected()
