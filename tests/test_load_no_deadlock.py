"""The load that would have caught it: application transactions that update two or three
parent rows in random order and write counted rows, two workers draining and recounts
looping, for a bounded number of transactions. Zero deadlocks in pg_stat_database, zero
application errors, and every counter equal to a truth computed here with plain SQL
(GROUP BY over the source rows), not with pgcounters' own verify."""

from __future__ import annotations

import random
import threading

import psycopg

from pgcounters import Counters
from pgcounters.connection import Conn
from pgcounters.repair import recount
from pgcounters.specs import ColumnTarget, CounterSpec, Fragment, NamedTarget
from pgcounters.triggers import install
from pgcounters.worker import Worker, WorkerSettings
from support import deadlocks

THREADS = 4
TRANSACTIONS = 100  # per application thread
ARTICLES_PER_THREAD = 3
USERS_PER_THREAD = 2
PUBLIC = Fragment("publish_status = %s", ("public",))

DDL = """
CREATE TABLE blog_user (id bigint PRIMARY KEY, karma bigint NOT NULL DEFAULT 0,
                        public_comments bigint NOT NULL DEFAULT 0);
CREATE TABLE blog_article (id bigint PRIMARY KEY, body text NOT NULL DEFAULT '',
                           public_comments bigint NOT NULL DEFAULT 0,
                           score_total bigint NOT NULL DEFAULT 0);
CREATE TABLE blog_comment (
    id bigserial PRIMARY KEY,
    article_id bigint NOT NULL REFERENCES blog_article,
    creator_id bigint NOT NULL REFERENCES blog_user,
    publish_status text NOT NULL DEFAULT 'private',
    score integer NOT NULL DEFAULT 1,
    created_on date NOT NULL
);
"""

SPECS = [
    CounterSpec(
        name="load.article.public_comments",
        source="blog_comment",
        keys=("article_id",),
        target=ColumnTarget("blog_article", "public_comments"),
        where=PUBLIC,
        mode="queued",
    ),
    CounterSpec(
        name="load.article.score_total",
        source="blog_comment",
        keys=("article_id",),
        target=ColumnTarget("blog_article", "score_total"),
        sum="score",
        mode="unlogged",
    ),
    CounterSpec(
        name="load.user.public_comments",
        source="blog_comment",
        keys=("creator_id",),
        target=ColumnTarget("blog_user", "public_comments"),
        where=PUBLIC,
        mode="direct",
    ),
    CounterSpec(
        name="load.comments_per_article_day",
        source="blog_comment",
        keys=("article_id", "created_on"),
        target=NamedTarget(("bigint", "date")),
        where=PUBLIC,
        mode="queued",
    ),
    CounterSpec(
        name="load.comments_total",
        source="blog_comment",
        target=NamedTarget(()),
        mode="unlogged",
    ),
]


def application(dsn: str, index: int, errors: list[BaseException]) -> None:
    """Own articles and users (so application transactions cannot deadlock each other);
    each transaction updates 2-3 own articles in random order, writes comments (insert,
    publish, move, delete) and touches the comment's author last."""
    rng = random.Random(index)
    articles = [index * ARTICLES_PER_THREAD + i + 1 for i in range(ARTICLES_PER_THREAD)]
    users = [index * USERS_PER_THREAD + i + 1 for i in range(USERS_PER_THREAD)]
    try:
        with psycopg.connect(dsn) as conn:
            for n in range(TRANSACTIONS):
                touched = rng.sample(articles, rng.choice((2, 3)))
                with conn.transaction():
                    for article in touched:
                        conn.execute(
                            "UPDATE blog_article SET body = %s WHERE id = %s",
                            (f"edit {n}", article),
                        )
                    kind = rng.random()
                    if kind < 0.5:
                        conn.execute(
                            "INSERT INTO blog_comment (article_id, creator_id, publish_status,"
                            " score, created_on) VALUES (%s, %s, %s, %s, %s::date)",
                            (
                                rng.choice(touched),
                                rng.choice(users),
                                rng.choice(("public", "private")),
                                rng.randrange(1, 5),
                                f"2026-11-{rng.randrange(20, 23)}",
                            ),
                        )
                    elif kind < 0.7:
                        conn.execute(
                            "UPDATE blog_comment SET publish_status = CASE publish_status"
                            " WHEN 'public' THEN 'private' ELSE 'public' END"
                            " WHERE id = (SELECT id FROM blog_comment WHERE article_id = ANY (%s)"
                            " ORDER BY random() LIMIT 1)",
                            (touched,),
                        )
                    elif kind < 0.85:
                        conn.execute(
                            "UPDATE blog_comment SET article_id = %s, score = score + 1"
                            " WHERE id = (SELECT id FROM blog_comment WHERE article_id = %s"
                            " ORDER BY id LIMIT 1)",
                            (touched[0], touched[-1]),
                        )
                    else:
                        conn.execute(
                            "DELETE FROM blog_comment WHERE id = (SELECT id FROM blog_comment"
                            " WHERE article_id = ANY (%s) ORDER BY random() LIMIT 1)",
                            (touched,),
                        )
                    # the author's own row last, in random order of the two users
                    for user in rng.sample(users, 2):
                        conn.execute(
                            "UPDATE blog_user SET karma = karma + 1 WHERE id = %s", (user,)
                        )
    except BaseException as exc:
        errors.append(exc)


def recounting(dsn: str, stop: threading.Event, errors: list[BaseException]) -> int:
    rounds = 0
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            while not stop.is_set():
                for spec in SPECS:
                    recount(conn, spec.name, batch_size=2, resume=False)
                rounds += 1
    except BaseException as exc:
        errors.append(exc)
    return rounds


TRUTH = {
    "article": """
        SELECT a.id, a.public_comments, a.score_total,
               count(c.id) FILTER (WHERE c.publish_status = 'public'),
               coalesce(sum(c.score), 0)
          FROM blog_article AS a LEFT JOIN blog_comment AS c ON c.article_id = a.id
         GROUP BY a.id ORDER BY a.id""",
    "user": """
        SELECT u.id, u.public_comments, count(c.id) FILTER (WHERE c.publish_status = 'public')
          FROM blog_user AS u LEFT JOIN blog_comment AS c ON c.creator_id = u.id
         GROUP BY u.id ORDER BY u.id""",
    "per_day": """
        SELECT ARRAY[article_id::text, to_char(created_on, 'YYYY-MM-DD')], count(*)
          FROM blog_comment WHERE publish_status = 'public'
         GROUP BY article_id, created_on ORDER BY 1""",
    "stored_per_day": """
        SELECT c.key, c.value FROM pgcounters.counters AS c
          JOIN pgcounters.targets AS t ON t.id = c.target_id
         WHERE t.name = 'load.comments_per_article_day' AND c.value <> 0 ORDER BY 1""",
    "total": "SELECT count(*) FROM blog_comment",
    "stored_total": """
        SELECT c.value FROM pgcounters.counters AS c
          JOIN pgcounters.targets AS t ON t.id = c.target_id
         WHERE t.name = 'load.comments_total'""",
}


def test_applications_workers_and_recounts_together_never_deadlock_and_end_exact(
    dsn: str, conn: Conn, pc: Counters
) -> None:
    conn.execute(DDL)
    conn.execute(
        "INSERT INTO blog_user (id) SELECT generate_series(1, %s)", (THREADS * USERS_PER_THREAD,)
    )
    conn.execute(
        "INSERT INTO blog_article (id) SELECT generate_series(1, %s)",
        (THREADS * ARTICLES_PER_THREAD,),
    )
    install(conn, SPECS)
    before = deadlocks(conn)
    errors: list[BaseException] = []
    recount_errors: list[BaseException] = []
    workers = [
        Worker(dsn, WorkerSettings(batch_size=20, min_interval=0.005, max_interval=0.05))
        for _ in range(2)
    ]
    worker_threads = [threading.Thread(target=w.run) for w in workers]
    stop = threading.Event()
    rounds: list[int] = []
    recounter = threading.Thread(
        target=lambda: rounds.append(recounting(dsn, stop, recount_errors))
    )
    apps = [threading.Thread(target=application, args=(dsn, i, errors)) for i in range(THREADS)]
    for t in (*worker_threads, recounter, *apps):
        t.start()
    try:
        for t in apps:
            t.join(timeout=300)
    finally:
        stop.set()
        recounter.join(timeout=300)
        for w in workers:
            w.stop()
        for t in worker_threads:
            t.join(timeout=60)
    assert errors == []
    assert recount_errors == []
    assert rounds
    assert rounds[0] >= 1
    assert [w.get_stats().errors for w in workers] == [0, 0]
    pc.drain()
    assert pc.pending() == (0, 0)
    assert conn.execute("SELECT count(*) FROM pgcounters.quarantine").fetchone() == (0,)
    assert deadlocks(conn) == before
    # the truth, by hand
    for row in conn.execute(TRUTH["article"]).fetchall():
        article, stored_public, stored_score, public, score = row
        assert (article, stored_public, stored_score) == (article, public, score)
    for user, stored, truth in conn.execute(TRUTH["user"]).fetchall():
        assert (user, stored) == (user, truth)
    assert (
        conn.execute(TRUTH["stored_per_day"]).fetchall()
        == conn.execute(TRUTH["per_day"]).fetchall()
    )
    assert conn.execute(TRUTH["stored_total"]).fetchall() == conn.execute(TRUTH["total"]).fetchall()
    made = conn.execute("SELECT count(*) FROM blog_comment").fetchone()
    assert made is not None
    assert made[0] > 0
    retried = conn.execute("SELECT coalesce(sum(retries), 0) FROM pgcounters.retries").fetchone()
    print(
        f"{THREADS * TRANSACTIONS} application transactions, {rounds[0]} recount rounds, "
        f"{sum(w.get_stats().busy for w in workers)} busy deltas left for later, "
        f"{retried[0] if retried else 0} retried batches, 0 deadlocks"
    )
