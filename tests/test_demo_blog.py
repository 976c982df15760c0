"""The blog part of ``pgcounters demo``: a short mixed load, then every counter checked."""

from __future__ import annotations

import collections

import psycopg
import pytest

import truth
from pgcounters import Counters
from pgcounters.demos import blog as demo_blog
from pgcounters.demos import demo
from pgcounters.quotas import Quotas
from support import tamper

# the truth of each demo counter, written by hand
TRUTHS = [
    truth.from_sql(
        "demo.article.public_comments",
        "SELECT article_id, count(*) FROM demo_blog.comments"
        " WHERE publish_status = 'public' AND article_id IS NOT NULL GROUP BY article_id",
        stored="SELECT id, public_comments FROM demo_blog.articles",
    ),
    truth.from_sql(
        "demo.user.public_comments",
        "SELECT creator_id, count(*) FROM demo_blog.comments"
        " WHERE publish_status = 'public' AND creator_id IS NOT NULL GROUP BY creator_id",
        stored="SELECT id, public_comments FROM demo_blog.users",
    ),
    truth.from_sql(
        "demo.user.unread_notifications",
        "SELECT user_id, count(*) FROM demo_blog.notifications"
        " WHERE NOT is_read AND user_id IS NOT NULL GROUP BY user_id",
        stored="SELECT id, unread_notifications FROM demo_blog.users",
    ),
    truth.from_sql("demo.users.total", "SELECT count(*) FROM demo_blog.users"),
]

TINY = demo_blog.Sizes(
    users=20, articles=5, comments=200, comment_writers=2, quota_threads=2, quota_limit=40
)


def test_mixed_load_is_exact_and_a_tampered_counter_is_reported(dsn: str) -> None:
    result = demo_blog.run(dsn, 1.5, TINY, seed=7)
    assert result.errors == []
    names = [c.name for c in result.counters]
    assert names == [s.name for s in demo_blog.specs()]
    assert all(c.exact and c.keys_checked > 0 for c in result.counters)
    assert result.ok
    # the load did happen, and the checks saw it
    assert result.ops["comment: add"] > 0
    assert result.ops["notification: create"] > 0
    assert result.races > 0
    assert result.races_ok
    assert 0 < result.quota_allowed <= TINY.quota_limit * TINY.quota_subjects
    assert result.quota_highest_use <= TINY.quota_limit
    assert result.quota_ok
    assert result.recount_keys > 0
    assert result.recount_fixed >= 1
    assert result.deltas_by_worker + result.deltas_final_drain > 0

    with psycopg.connect(dsn, autocommit=True) as conn:
        # the demo's own check agrees with the truths written here
        truth.assert_drained(conn, TRUTHS)
        tamper(
            conn, "UPDATE demo_blog.users SET public_comments = public_comments + 1 WHERE id = 3"
        )
        assert [(m.counter, m.key) for t in TRUTHS for m in truth.exact_mismatches(conn, t)] == [
            ("demo.user.public_comments", (3,))
        ]
    tampered = demo_blog.check(dsn, result)
    exact = {c.name: c.exact for c in tampered.counters}
    assert exact == {
        "demo.article.public_comments": True,
        "demo.user.public_comments": False,
        "demo.user.unread_notifications": True,
        "demo.users.total": True,
    }
    assert not tampered.ok
    assert any("exact: NO (1 keys differ)" in line for line in tampered.summary())


def test_a_quota_above_its_limit_is_reported(dsn: str) -> None:
    demo_blog.setup(dsn, TINY)
    with psycopg.connect(dsn, autocommit=True) as conn:
        call = Quotas(conn).register_call(demo_blog.QUOTA, "customer-1")
    assert call.allowed
    result = demo_blog.BlogDemoResult(quota_limit=TINY.quota_limit)
    claimed = collections.Counter({("customer-1", call.window_start): TINY.quota_limit + 1})
    demo_blog.check(dsn, result, claimed)
    assert result.counters_exact
    assert not result.quota_ok
    assert not result.ok
    assert "customer-1" in result.quota_over_limit[0]


def test_setup_twice_starts_again_from_nothing(dsn: str) -> None:
    demo_blog.setup(dsn, TINY)
    demo_blog.setup(dsn, TINY)
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM demo_blog.users").fetchone()
        assert row == (TINY.users,)
        assert Counters(conn).get("demo.users.total") == TINY.users
    result = demo_blog.check(dsn, demo_blog.BlogDemoResult())
    assert result.counters_exact


def test_the_whole_demo_command_exits_zero(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = demo.run(dsn, writers=2, per_writer=20, txn_per_writer=2, blog_seconds=1.0)
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.count("exact: yes") == len(demo_blog.specs())
    assert "never above" in out
