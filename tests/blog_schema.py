"""A small blog schema (users, articles, public comments) and the counter specs the trigger
tests use."""

from __future__ import annotations

from typing import Any

import truth
from pgcounters.connection import Conn
from pgcounters.specs import ColumnTarget, CounterSpec, Fragment, NamedTarget

DDL = """
CREATE TABLE blog_user (id bigserial PRIMARY KEY, username text NOT NULL,
                        public_comments bigint NOT NULL DEFAULT 0);
CREATE TABLE blog_article (id bigserial PRIMARY KEY, title text NOT NULL DEFAULT '',
                           public_comments bigint NOT NULL DEFAULT 0,
                           score_total bigint NOT NULL DEFAULT 0);
CREATE TABLE blog_comment (
    id bigserial PRIMARY KEY,
    article_id bigint REFERENCES blog_article ON DELETE CASCADE,
    creator_id bigint REFERENCES blog_user ON DELETE CASCADE,
    publish_status text NOT NULL DEFAULT 'private',
    score integer,
    created_on date NOT NULL DEFAULT '2026-11-21'
);
CREATE INDEX ON blog_comment (article_id);
CREATE INDEX ON blog_comment (creator_id);
"""

PUBLIC = Fragment("publish_status = %s", ("public",))


def specs(mode: Any = "queued") -> list[CounterSpec]:
    """Every kind of spec: column targets, a sum, a composite named key and a global count."""
    return [
        CounterSpec(
            name="blog.article.public_comments",
            source="blog_comment",
            keys=("article_id",),
            target=ColumnTarget("blog_article", "public_comments"),
            where=PUBLIC,
            mode=mode,
        ),
        CounterSpec(
            name="blog.user.public_comments",
            source="blog_comment",
            keys=("creator_id",),
            target=ColumnTarget("blog_user", "public_comments"),
            where=PUBLIC,
            mode=mode,
        ),
        CounterSpec(
            name="blog.article.score_total",
            source="blog_comment",
            keys=("article_id",),
            target=ColumnTarget("blog_article", "score_total"),
            sum="score",
            mode=mode,
        ),
        CounterSpec(
            name="blog.comments_per_article_day",
            source="blog_comment",
            keys=("article_id", "created_on"),
            target=NamedTarget(("bigint", "date")),
            where=PUBLIC,
            mode=mode,
        ),
        CounterSpec(
            name="blog.comments_total",
            source="blog_comment",
            target=NamedTarget(()),
            mode=mode,
        ),
    ]


def truths() -> list[truth.Truth]:
    """The truth of each counter of :func:`specs`, written by hand (whatever the mode)."""
    return [
        truth.from_sql(
            "blog.article.public_comments",
            "SELECT article_id, count(*) FROM blog_comment"
            " WHERE publish_status = 'public' AND article_id IS NOT NULL GROUP BY article_id",
            stored="SELECT id, public_comments FROM blog_article",
        ),
        truth.from_sql(
            "blog.user.public_comments",
            "SELECT creator_id, count(*) FROM blog_comment"
            " WHERE publish_status = 'public' AND creator_id IS NOT NULL GROUP BY creator_id",
            stored="SELECT id, public_comments FROM blog_user",
        ),
        truth.from_sql(
            "blog.article.score_total",
            "SELECT article_id, sum(score) FROM blog_comment"
            " WHERE article_id IS NOT NULL GROUP BY article_id",
            stored="SELECT id, score_total FROM blog_article",
        ),
        truth.from_sql(
            "blog.comments_per_article_day",
            "SELECT article_id, created_on, count(*) FROM blog_comment"
            " WHERE publish_status = 'public' AND article_id IS NOT NULL"
            " GROUP BY article_id, created_on",
        ),
        truth.from_sql("blog.comments_total", "SELECT count(*) FROM blog_comment"),
    ]


def create(conn: Conn, users: int = 5, articles: int = 5) -> None:
    conn.execute(DDL)
    conn.execute(
        "INSERT INTO blog_user (username) SELECT 'u' || g FROM generate_series(1, %s) g", (users,)
    )
    conn.execute(
        "INSERT INTO blog_article (title) SELECT 'a' || g FROM generate_series(1, %s) g",
        (articles,),
    )
