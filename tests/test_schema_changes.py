"""Schema changes on counted tables: a change that would break a declared counter is refused
with a message naming it (or, where no guard could be installed, reported as broken), never
left to break the application's writes or to drift silently."""

from __future__ import annotations

import psycopg
import pytest

import blog_schema
from pgcounters import Counters, backfill, triggers
from pgcounters.connection import Conn
from pgcounters.dberrors import translate
from pgcounters.errors import CounterBroken, InvalidCounterDefinition
from pgcounters.repair import recount, verify
from pgcounters.specs import ColumnTarget, CounterSpec

ARTICLE = "blog.article.public_comments"
SCORE = "blog.article.score_total"


@pytest.fixture
def blog(conn: Conn) -> Conn:
    blog_schema.create(conn)
    triggers.install(conn, blog_schema.specs())
    conn.execute(
        "INSERT INTO blog_comment (article_id, creator_id, publish_status, score)"
        " VALUES (1, 1, 'public', 3), (1, 2, 'public', 4), (2, 1, 'private', 5)"
    )
    return conn


def _truth(conn: Conn) -> dict[int, tuple[int, int]]:
    """Public comments and summed score per article, by hand."""
    rows = conn.execute(
        "SELECT a.id, count(c.id) FILTER (WHERE c.publish_status = 'public'),"
        " coalesce(sum(c.score), 0) FROM blog_article a"
        " LEFT JOIN blog_comment c ON c.article_id = a.id GROUP BY a.id"
    ).fetchall()
    return {a: (n, s) for a, n, s in rows}


def _values(conn: Conn) -> dict[int, tuple[int, int]]:
    pc = Counters(conn)
    ids = [r[0] for r in conn.execute("SELECT id FROM blog_article").fetchall()]
    return {a: (pc.get(ARTICLE, a), pc.get(SCORE, a)) for a in ids}


@pytest.mark.parametrize(
    ("ddl", "column"),
    [
        ("ALTER TABLE blog_comment RENAME COLUMN article_id TO post_id", "article_id"),
        ("ALTER TABLE blog_comment DROP COLUMN score", "score"),
        ("ALTER TABLE blog_comment RENAME COLUMN publish_status TO status", "publish_status"),
        ("ALTER TABLE blog_comment ALTER COLUMN score TYPE numeric(10, 2)", "integer_value"),
        ("ALTER TABLE blog_comment ALTER COLUMN score TYPE double precision", "integer_value"),
        # the parent table that holds the counter column
        ("ALTER TABLE blog_article RENAME COLUMN public_comments TO n", "public_comments"),
        ("ALTER TABLE blog_article RENAME COLUMN id TO article_id", "id"),
    ],
)
def test_a_change_that_breaks_a_counter_is_refused(blog: Conn, ddl: str, column: str) -> None:
    with pytest.raises(psycopg.Error, match=r"breaks counter blog\.") as caught:
        blog.execute(ddl)
    assert caught.value.sqlstate == "PC020"
    assert column in str(caught.value)
    assert caught.value.diag.message_hint is not None
    assert isinstance(translate(caught.value), CounterBroken)
    # nothing changed: the application's writes go on, counted
    blog.execute(
        "INSERT INTO blog_comment (article_id, publish_status, score) VALUES (2, 'public', 1)"
    )
    assert _values(blog) == _truth(blog) == {1: (2, 7), 2: (1, 6), 3: (0, 0), 4: (0, 0), 5: (0, 0)}
    assert all(d.state == "installed" for d in triggers.drift(blog))


def test_a_change_that_keeps_counters_whole_is_allowed(blog: Conn) -> None:
    blog.execute("ALTER TABLE blog_comment ADD COLUMN body text NOT NULL DEFAULT ''")
    blog.execute("ALTER TABLE blog_comment ALTER COLUMN score TYPE bigint")  # still an integer
    blog.execute("ALTER TABLE blog_comment RENAME COLUMN body TO text")  # not read by a counter
    blog.execute("ALTER TABLE blog_article ADD COLUMN views bigint NOT NULL DEFAULT 0")
    blog.execute(
        "INSERT INTO blog_comment (article_id, publish_status, score) VALUES (1, 'public', 2)"
    )
    assert _values(blog) == _truth(blog)
    assert all(d.state == "installed" for d in triggers.drift(blog))


def test_the_counter_removed_first_then_the_change_then_installed_again(
    blog: Conn,
) -> None:
    """What a migration that renames a key column does: the counter's triggers go before the
    change and come back after it, in one transaction (as Django's migrations order them)."""
    specs = {s.name: s for s in blog_schema.specs()}
    article = specs[ARTICLE]
    moved = CounterSpec(
        name=ARTICLE,
        source="blog_comment",
        keys=("post_id",),
        target=ColumnTarget("blog_article", "public_comments"),
        where=article.where,
    )
    others = [s for s in specs.values() if s.name != ARTICLE and "article_id" in s.keys]
    with blog.transaction():
        for spec in [article, *others]:
            triggers.uninstall(blog, spec.name)
        blog.execute("ALTER TABLE blog_comment RENAME COLUMN article_id TO post_id")
        rekeyed = [
            CounterSpec(
                name=s.name,
                source="blog_comment",
                keys=tuple("post_id" if k == "article_id" else k for k in s.keys),
                target=s.target,
                where=s.where,
                sum=s.sum,
            )
            for s in others
        ]
        triggers.install(blog, [moved, *rekeyed])
    backfill.run(blog)  # a changed counter is recomputed over the rows already there
    blog.execute(
        "INSERT INTO blog_comment (post_id, publish_status, score) VALUES (1, 'public', 5)"
    )
    truth = blog.execute(
        "SELECT count(*) FROM blog_comment WHERE post_id = 1 AND publish_status = 'public'"
    ).fetchone()
    assert truth == (3,)
    assert Counters(blog).get(ARTICLE, 1) == 3
    assert verify(blog, ARTICLE).mismatches == []


def test_a_sum_over_a_non_integer_column_is_refused_at_install(
    conn: Conn,
) -> None:
    blog_schema.create(conn)
    conn.execute("ALTER TABLE blog_comment ADD COLUMN price numeric(10, 2)")
    spec = CounterSpec(
        name="blog.article.price_total",
        source="blog_comment",
        keys=("article_id",),
        target=ColumnTarget("blog_article", "score_total"),
        sum="price",
    )
    with pytest.raises(
        InvalidCounterDefinition, match="is a decimal: declare the counter with scale=2"
    ):
        triggers.install(conn, [spec])
    assert triggers.installed(conn) == []


def test_without_the_guard_a_broken_counter_is_reported_not_installed(
    blog: Conn,
) -> None:
    """Where the schema was installed by a role that may not create event triggers."""
    blog.execute("ALTER EVENT TRIGGER pgcounters_guard_ddl DISABLE")
    blog.execute("ALTER TABLE blog_comment RENAME COLUMN score TO points")
    states = {d.name: d for d in triggers.drift(blog)}
    assert states[SCORE].state == "broken"
    assert "score" in states[SCORE].detail
    assert states[ARTICLE].state == "installed"  # it reads no renamed column
    with pytest.raises(CounterBroken, match=r"counter blog\.article\.score_total no longer"):
        verify(blog, SCORE)
    with pytest.raises(CounterBroken, match="install it again"):
        recount(blog, SCORE)
    assert verify(blog, ARTICLE).mismatches == []


def test_without_the_guard_a_renamed_counter_column_is_reported_broken(
    blog: Conn,
) -> None:
    blog.execute("ALTER EVENT TRIGGER pgcounters_guard_ddl DISABLE")
    blog.execute("ALTER TABLE blog_article RENAME COLUMN score_total TO points")
    states = {d.name: d for d in triggers.drift(blog)}
    assert states[SCORE].state == "broken"
    assert "score_total" in states[SCORE].detail
    assert states[ARTICLE].state == "installed"
    with pytest.raises(CounterBroken, match=r"counter blog\.article\.score_total no longer"):
        verify(blog, SCORE)
