"""Smoke runs of the blog benchmarks with tiny sizes: every variant exact (not their speed)."""

from __future__ import annotations

import re

import psycopg

from pgcounters import Counters
from pgcounters.connection import Conn
from pgcounters.demos import sqlfiles
from pgcounters.demos.bench import SCENARIOS, blog


def test_the_scenarios_are_registered() -> None:
    assert SCENARIOS["trigger-overhead"] is blog.trigger_overhead
    assert SCENARIOS["top-n"] is blog.top_n
    assert SCENARIOS["exact-read"] is blog.exact_read


def test_trigger_overhead_is_exact_with_and_without_foreign_keys(dsn: str) -> None:
    scenario = blog.trigger_overhead(dsn, 1, True, rows=600)
    shapes = ("", blog.FK)
    assert set(scenario.runs) == {v + s for v in blog.TRIGGER_VARIANTS for s in shapes}
    for variant, runs in scenario.runs.items():
        assert [r.exact for r in runs] == [True], variant
        assert runs[0].operations == 600
    # 400 public comments: the reference trigger queues two deltas each, pgcounters one per
    # article and one per user the statement touched (the scenario's spread over 1000 of each,
    # computed here from its formula: every public comment has an article and a user of its own)
    public = [g for g in range(1, 601) if g % 3]
    touched = len({1 + g * 7919 % 1000 for g in public}) + len(
        {1 + g * 104729 % 1000 for g in public}
    )
    assert touched == 800
    assert scenario.runs["row trigger (reference)"][0].extra["queued deltas"] == 800
    assert scenario.runs["pgcounters"][0].extra["queued deltas"] == touched
    assert scenario.runs["no counters"][0].extra["queued deltas"] == 0
    head = scenario.headline_comparison()
    assert head is not None
    assert (head["variant"], head["baseline"], head["target"]) == (
        "pgcounters",
        "row trigger (reference)",
        3.0,
    )
    assert len(scenario.comparisons) == len(blog.TRIGGER_COMPARISONS)
    with psycopg.connect(dsn) as conn:  # the scenario removes what it created
        assert conn.execute("SELECT to_regnamespace('reference_blog')").fetchone() == (None,)


def test_the_exactness_check_sees_a_wrong_count(conn: Conn) -> None:
    blog.prepare(conn, 20, 30)
    for table in (blog.REFERENCE, blog.PGC):
        conn.execute(
            blog.q("insert_comments", table), {"users": 20, "articles": 30, "first": 1, "last": 90}
        )
    # pgcounters' counts arrive with the drain, the reference with its queue function
    assert blog.mismatches(conn, blog.PGC) > 0
    Counters(conn).drain()
    assert blog.mismatches(conn, blog.PGC) == 0
    conn.execute(blog.q("reset_article_counts"))
    conn.execute(blog.q("reset_user_counts"))
    blog.drain_reference(conn, limit=7)
    assert blog.mismatches(conn, blog.REFERENCE) == 0
    conn.execute("UPDATE reference_blog.blog_article SET total_public_comments = 99 WHERE id = 3")
    assert blog.mismatches(conn, blog.REFERENCE) == 1
    blog.cleanup(conn)


def test_top_n_gives_the_same_top_10_both_ways(dsn: str) -> None:
    scenario = blog.top_n(dsn, 2, True, rows=3000, articles=200)
    assert set(scenario.runs) == set(blog.TOP_VARIANTS)
    assert all(r.exact for runs in scenario.runs.values() for r in runs)
    assert [len(runs) for runs in scenario.runs.values()] == [2, 2]
    assert scenario.as_json()["target"] == 100.0


def test_exact_read_reads_every_value_right(dsn: str) -> None:
    scenario = blog.exact_read(dsn, 1, True, pending=200, base=500, reads=40)
    assert set(scenario.runs) == set(blog.READ_VARIANTS)
    assert all(r.exact for runs in scenario.runs.values() for r in runs)
    assert scenario.runs["exact"][0].operations == 40
    assert scenario.runs["count(*) (reference)"][0].operations == 10
    document = scenario.as_json()
    assert document["headline"] == "exact vs stored"
    assert document["target"] == 0.5


def _normalise(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def test_the_annotate_query_is_what_django_generates() -> None:
    from blog.models import Article
    from django.db.models import Count, Q

    query = (
        Article.objects.annotate(
            n=Count("comments", filter=Q(comments__publish_status="public"))
        ).order_by("-n", "pk")
    )[:10]
    django_sql = _normalise(str(query.query))
    block = sqlfiles.named("bench_blog.sql")["top_annotate"]
    ours = _normalise(" ".join(x for x in block.splitlines() if not x.startswith("--")))
    # the example's model has other columns (the count comes after them here);
    # from the aggregate on, the statements agree
    django_tail = django_sql[django_sql.index("COUNT(") :]
    ours_tail = ours[ours.index("COUNT(") :]
    ours_tail = (
        ours_tail.replace('"reference_blog"."blog_article"', '"blog_article"')
        .replace('{comments} AS "blog_comment"', '"blog_comment"')
        .replace("'public'", "public")
        .replace("ORDER BY 4 DESC", f"ORDER BY {len(Article._meta.concrete_fields) + 1} DESC")
        .replace("%(n)s", "10")
    )
    assert django_tail == ours_tail
