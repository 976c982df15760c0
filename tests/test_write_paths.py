"""Every way SQL can write a counted table is counted: savepoints, MERGE, writable CTEs,
INSERT ... ON CONFLICT, COPY, a trigger of the user's that writes the table, in the three
modes. The truth is SQL written here by hand over the source rows; pgcounters' exact values
are read back for every key and compared with it."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import blog_schema
from pgcounters import Counters, triggers
from pgcounters.connection import Conn

MODES = ["queued", "unlogged", "direct"]
Write = Callable[[Conn], None]


def hand_truth(conn: Conn) -> dict[str, dict[tuple[Any, ...], int]]:
    """The five counters of the test blog, each by its own GROUP BY, keys without a zero."""

    def rows(query: str) -> dict[tuple[Any, ...], int]:
        return {tuple(r[:-1]): int(r[-1]) for r in conn.execute(query).fetchall() if r[-1]}

    return {
        "blog.article.public_comments": rows(
            "SELECT article_id, count(*) FROM blog_comment WHERE publish_status = 'public'"
            " AND article_id IS NOT NULL GROUP BY 1"
        ),
        "blog.user.public_comments": rows(
            "SELECT creator_id, count(*) FROM blog_comment WHERE publish_status = 'public'"
            " AND creator_id IS NOT NULL GROUP BY 1"
        ),
        "blog.article.score_total": rows(
            "SELECT article_id, coalesce(sum(score), 0) FROM blog_comment"
            " WHERE article_id IS NOT NULL GROUP BY 1"
        ),
        "blog.comments_per_article_day": rows(
            "SELECT article_id, created_on, count(*) FROM blog_comment"
            " WHERE publish_status = 'public' AND article_id IS NOT NULL GROUP BY 1, 2"
        ),
        "blog.comments_total": rows("SELECT count(*) FROM blog_comment"),
    }


def assert_counted(conn: Conn) -> None:
    truth = hand_truth(conn)
    pc = Counters(conn)
    articles = [r[0] for r in conn.execute("SELECT id FROM blog_article").fetchall()]
    users = [r[0] for r in conn.execute("SELECT id FROM blog_user").fetchall()]
    days = [dt.date(2026, 11, 20), dt.date(2026, 11, 21), dt.date(2026, 11, 22)]
    keys: dict[str, list[tuple[Any, ...]]] = {
        "blog.article.public_comments": [(a,) for a in articles],
        "blog.user.public_comments": [(u,) for u in users],
        "blog.article.score_total": [(a,) for a in articles],
        "blog.comments_per_article_day": [(a, d) for a in articles for d in days],
        "blog.comments_total": [()],
    }
    wrong = {
        (name, key): (pc.get(name, key if key else None), truth[name].get(key, 0))
        for name, wanted in keys.items()
        for key in wanted
        if pc.get(name, key if key else None) != truth[name].get(key, 0)
    }
    assert wrong == {}, "(counter, key): (pgcounters, truth)"


def _savepoints(conn: Conn) -> None:
    with conn.transaction():
        conn.execute(
            "INSERT INTO blog_comment (article_id, creator_id, publish_status, score)"
            " VALUES (1, 1, 'public', 2)"
        )
        conn.execute("SAVEPOINT failed")
        conn.execute(
            "INSERT INTO blog_comment (article_id, creator_id, publish_status, score)"
            " VALUES (2, 2, 'public', 5), (3, 3, 'public', 7)"
        )
        conn.execute("UPDATE blog_comment SET article_id = 4 WHERE article_id = 1")
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute("SELECT 1 / 0")
        conn.execute("ROLLBACK TO SAVEPOINT failed")
        with conn.transaction():  # a savepoint released: kept
            conn.execute("UPDATE blog_comment SET score = 10 WHERE article_id = 1")
        conn.execute("SAVEPOINT s")
        conn.execute("DELETE FROM blog_comment")
        conn.execute("ROLLBACK TO SAVEPOINT s")


def _merge(conn: Conn) -> None:
    conn.execute(
        "INSERT INTO blog_comment (id, article_id, creator_id, publish_status, score)"
        " VALUES (101, 1, 1, 'public', 1), (102, 2, 2, 'private', 2), (103, 3, 3, 'public', 3)"
    )
    conn.execute(
        """MERGE INTO blog_comment AS c
           USING (VALUES (101, 2, 'private', 4), (102, 2, 'public', 5), (103, 0, '', 0),
                         (104, 5, 'public', 6), (105, 1, 'public', 7)) AS s(id, art, st, sc)
              ON c.id = s.id
            WHEN MATCHED AND s.art = 0 THEN DELETE
            WHEN MATCHED THEN UPDATE SET article_id = s.art, publish_status = s.st,
                                         score = s.sc
            WHEN NOT MATCHED THEN INSERT (id, article_id, creator_id, publish_status, score)
                                  VALUES (s.id, s.art, 1, s.st, s.sc)"""
    )


def _writable_ctes(conn: Conn) -> None:
    conn.execute(
        "INSERT INTO blog_comment (article_id, creator_id, publish_status, score)"
        " SELECT g % 5 + 1, g % 3 + 1, 'public', g FROM generate_series(1, 30) g"
    )
    conn.execute(
        """WITH moved AS (
               UPDATE blog_comment SET article_id = 2 WHERE article_id = 1 RETURNING id),
           gone AS (DELETE FROM blog_comment WHERE article_id = 3 RETURNING id),
           added AS (
               INSERT INTO blog_comment (article_id, creator_id, publish_status, score)
               SELECT 4, 2, 'public', 100 FROM gone RETURNING id)
           SELECT (SELECT count(*) FROM moved), (SELECT count(*) FROM added)"""
    )


def _on_conflict(conn: Conn) -> None:
    conn.execute(
        "INSERT INTO blog_comment (id, article_id, creator_id, publish_status, score)"
        " VALUES (201, 1, 1, 'public', 1), (202, 2, 2, 'private', 2)"
    )
    conn.execute(
        "INSERT INTO blog_comment (id, article_id, creator_id, publish_status, score)"
        " VALUES (201, 3, 1, 'public', 9), (202, 2, 2, 'public', 8), (203, 4, 3, 'public', 7)"
        " ON CONFLICT (id) DO UPDATE SET article_id = excluded.article_id,"
        " publish_status = excluded.publish_status, score = excluded.score"
    )
    conn.execute(
        "INSERT INTO blog_comment (id, article_id, publish_status) VALUES (203, 5, 'public'),"
        " (204, 5, 'public') ON CONFLICT (id) DO NOTHING"
    )


def _copy(conn: Conn) -> None:
    with (
        conn.cursor() as cur,
        cur.copy(
            "COPY blog_comment (article_id, creator_id, publish_status, score, created_on)"
            " FROM STDIN"
        ) as copy,
    ):
        for i in range(50):
            status = "public" if i % 3 else "private"
            day = dt.date(2026, 11, 20 + i % 3)
            copy.write_row((i % 5 + 1, i % 4 + 1 if i % 7 else None, status, i, day))


def _user_trigger(conn: Conn) -> None:
    """A trigger of the application's that writes the counted table itself (nested writes)."""
    conn.execute(
        """CREATE FUNCTION echo_comment() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN
               IF NEW.score > 0 THEN
                   INSERT INTO blog_comment (article_id, creator_id, publish_status, score)
                   VALUES (NEW.article_id, NEW.creator_id, NEW.publish_status, -NEW.score + 1);
               END IF;
               RETURN NULL;
           END $$"""
    )
    conn.execute(
        "CREATE TRIGGER echo AFTER INSERT ON blog_comment FOR EACH ROW EXECUTE FUNCTION"
        " echo_comment()"
    )
    conn.execute(
        "INSERT INTO blog_comment (article_id, creator_id, publish_status, score)"
        " VALUES (1, 1, 'public', 3), (2, 2, 'private', 4), (3, NULL, 'public', 0)"
    )


WRITES: dict[str, Write] = {
    "savepoints": _savepoints,
    "merge": _merge,
    "writable-ctes": _writable_ctes,
    "on-conflict": _on_conflict,
    "copy": _copy,
    "user-trigger": _user_trigger,
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("path", list(WRITES))
def test_every_write_path_is_counted(conn: Conn, mode: str, path: str) -> None:
    blog_schema.create(conn)
    triggers.install(conn, blog_schema.specs(mode))
    WRITES[path](conn)
    written = conn.execute("SELECT count(*) FROM blog_comment").fetchone()
    assert written is not None
    assert written[0] > 0, "the write path wrote nothing"
    assert_counted(conn)
    Counters(conn).drain()
    assert_counted(conn)
