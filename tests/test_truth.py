"""The independent truth of tests/truth.py disagrees when a counter is wrong.

Each test breaks a counter by hand (a stored value, a pending delta, a key
nobody can name) and checks that the judgement fails and names exactly the
wrong keys: a check that could not fail would make every test built on it
meaningless.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

import blog_schema
import truth
from pgcounters import Counters, triggers
from pgcounters.connection import Conn
from support import tamper

TRUTHS = blog_schema.truths()
BY_NAME = {t.counter: t for t in TRUTHS}


@pytest.fixture
def blog(conn: Conn) -> Conn:
    blog_schema.create(conn)
    triggers.install(conn, blog_schema.specs())
    conn.execute(
        "INSERT INTO blog_comment (article_id, creator_id, publish_status, score, created_on)"
        " SELECT 1 + g % 4, 1 + g % 3, CASE WHEN g % 3 = 0 THEN 'private' ELSE 'public' END, g,"
        " date '2026-11-20' + g % 3 FROM generate_series(1, 60) g"
    )
    conn.execute("UPDATE blog_comment SET article_id = NULL WHERE id % 10 = 0")
    return conn


def _target_id(conn: Conn, name: str) -> int:
    row = conn.execute("SELECT id FROM pgcounters.targets WHERE name = %s", (name,)).fetchone()
    assert row is not None
    return int(row[0])


def test_the_truths_of_the_test_schema_hold_and_are_not_all_zero(
    blog: Conn,
) -> None:
    truth.assert_exact(blog, TRUTHS)
    truth.assert_drained(blog, TRUTHS)
    # by hand, independently of any query of truth.py
    comments = blog.execute(
        "SELECT article_id, publish_status, score, created_on FROM blog_comment"
    ).fetchall()
    per_article_day: dict[tuple[Any, ...], int] = {}
    score: dict[tuple[Any, ...], int] = {}
    for article, status, points, day in comments:
        if article is not None:
            score[(article,)] = score.get((article,), 0) + points
            if status == "public":
                per_article_day[(article, day)] = per_article_day.get((article, day), 0) + 1
    assert truth.values(blog, BY_NAME["blog.article.score_total"]) == score
    assert truth.values(blog, BY_NAME["blog.comments_per_article_day"]) == per_article_day
    assert truth.values(blog, BY_NAME["blog.comments_total"]) == {(): 60}
    assert (1, dt.date(2026, 11, 21)) in per_article_day
    assert all(v > 0 for v in score.values())


def test_a_wrong_stored_column_value_is_named(blog: Conn) -> None:
    Counters(blog).drain()
    tamper(blog, "UPDATE blog_article SET score_total = score_total + 1 WHERE id IN (2, 4)")
    with pytest.raises(AssertionError) as failed:
        truth.assert_exact(blog, TRUTHS)
    message = str(failed.value)
    assert "2 mismatching keys" in message
    assert "blog.article.score_total (2,)" in message
    assert "blog.article.score_total (4,)" in message
    with pytest.raises(AssertionError, match="stored"):
        truth.assert_stored(blog, TRUTHS)
    wrong = truth.exact_mismatches(blog, BY_NAME["blog.article.score_total"])
    assert [(m.key, m.found - m.truth) for m in wrong] == [((2,), 1), ((4,), 1)]


def test_a_wrong_pending_delta_of_a_composite_key_is_named(blog: Conn) -> None:
    target = _target_id(blog, "blog.comments_per_article_day")
    blog.execute(
        "INSERT INTO pgcounters.queue (target_id, key, delta) VALUES (%s, '{3,2026-11-21}', 2)",
        (target,),
    )
    wrong = truth.exact_mismatches(blog, BY_NAME["blog.comments_per_article_day"])
    assert [(m.key, m.found - m.truth) for m in wrong] == [((3, dt.date(2026, 11, 21)), 2)]
    with pytest.raises(AssertionError, match="after a full drain"):
        truth.assert_drained(blog, TRUTHS)


def test_a_key_no_typed_key_can_name_is_a_mismatch(blog: Conn) -> None:
    """A key with a NULL part (what a trigger that forgot the NULL test would queue)."""
    target = _target_id(blog, "blog.comments_per_article_day")
    blog.execute(
        "INSERT INTO pgcounters.queue (target_id, key, delta)"
        " VALUES (%s, ARRAY[NULL, '2026-11-21']::text[]::text, 1)",
        (target,),
    )
    wrong = truth.exact_mismatches(blog, BY_NAME["blog.comments_per_article_day"])
    assert [(m.key, m.truth, m.found, m.what) for m in wrong] == [
        ((None, "2026-11-21"), 0, 1, "held")
    ]


def test_a_key_the_truth_counts_but_pgcounters_lacks_is_named(
    blog: Conn,
) -> None:
    Counters(blog).drain()
    blog.execute(
        "DELETE FROM pgcounters.counters WHERE target_id = %s AND key = '{}'",
        (_target_id(blog, "blog.comments_total"),),
    )
    wrong = truth.exact_mismatches(blog, BY_NAME["blog.comments_total"])
    assert [(m.key, m.truth, m.found) for m in wrong] == [((), 60, 0)]


def test_a_wrong_value_fails_the_drained_check(blog: Conn) -> None:
    truth.assert_drained(blog, TRUTHS)
    assert truth.pending_deltas(blog, "blog.comments_total") == 0
    tamper(blog, "UPDATE blog_user SET public_comments = public_comments - 1 WHERE id = 1")
    with pytest.raises(AssertionError, match=r"blog.user.public_comments \(1,\)"):
        truth.assert_drained(blog, TRUTHS)
