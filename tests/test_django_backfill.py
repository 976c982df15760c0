"""Django: counters added, changed or removed over existing rows stay exact through migrate.

A counter added to a model over a populated table is, for the database, a
spec recorded for the first time while the column holds 0 everywhere; a
changed filter is a spec recorded with another fingerprint; a removed field
leaves a recorded spec with no triggers and no column. ``migrate`` (its
``post_migrate`` step) must leave each exact. The truth is Django's own
``annotate(Count(..., filter=...))``.
"""

from __future__ import annotations

from io import StringIO

import pytest
from blog.models import Article, Comment, User
from django.core.management import call_command
from django.db.models import Count, Q, Sum
from django.test import Client, override_settings

from members.models import Member, Post
from pgcounters import backfill
from pgcounters.contrib.django.db import psycopg_connection
from pgcounters.contrib.django.expressions import Exact
from pgcounters.specs import ColumnTarget, CounterSpec
from pgcounters.triggers import declared, record
from support import tamper

pytestmark = pytest.mark.django_db(transaction=True)

COUNTER = "blog.article.public_comments"
PUBLIC = Q(comments__publish_status="public")


def populate() -> list[Article]:
    user = User.objects.create(username="u")
    articles = Article.objects.bulk_create([Article(title=f"a{i}") for i in range(12)])
    Comment.objects.bulk_create(
        [
            Comment(article=a, creator=user, publish_status="public", score=n)
            for i, a in enumerate(articles)
            for n in range(i * 3)
        ]
    )
    call_command("pgcounters", "drain")
    return articles


def truth() -> list[tuple[int, int]]:
    return list(
        Article.objects.annotate(n=Count("comments", filter=PUBLIC))
        .order_by("id")
        .values_list("id", "n")
    )


def exact() -> list[tuple[int, int]]:
    return list(
        Article.objects.annotate(n=Exact("public_comments")).order_by("id").values_list("id", "n")
    )


def stored() -> list[tuple[int, int]]:
    return list(Article.objects.order_by("id").values_list("id", "public_comments"))


def as_if_just_added() -> None:
    """The counter's state right after AddField + its triggers over existing rows."""
    with psycopg_connection() as conn:
        conn.execute("DELETE FROM pgcounters.specs WHERE name = %s", (COUNTER,))
        tamper(conn, "UPDATE blog_article SET public_comments = 0")


def test_migrate_backfills_a_counter_added_over_existing_rows() -> None:
    populate()
    as_if_just_added()
    assert {n for _, n in stored()} == {0} != {n for _, n in truth()}
    out = StringIO()
    call_command("migrate", verbosity=1, stdout=out)
    assert stored() == exact() == truth()
    with psycopg_connection() as conn:
        assert backfill.pending(conn) == []


def test_reads_during_a_backfill_are_exact_and_it_shows(capsys: pytest.CaptureFixture[str]) -> None:
    populate()
    as_if_just_added()
    with override_settings(PGCOUNTERS_BACKFILL="worker"):
        call_command("migrate", verbosity=0)
    # nothing backfilled yet: every key is counted from the comments
    assert stored() != truth()
    assert exact() == truth()
    ordered = list(
        Article.objects.annotate(n=Exact("public_comments"))
        .filter(n__gte=9)
        .order_by("-n", "id")
        .values_list("id", "n")
    )
    assert ordered == sorted(((i, n) for i, n in truth() if n >= 9), key=lambda r: (-r[1], r[0]))
    call_command("pgcounters", "verify", COUNTER)  # not drift: not ready (exit 0)
    assert f"{COUNTER}: backfilling (0 keys done)" in capsys.readouterr().out
    call_command("pgcounters", "list")
    listed = [line for line in capsys.readouterr().out.splitlines() if line.startswith(COUNTER)]
    assert len(listed) == 1
    assert "backfilling (0 keys done)" in listed[0]
    with psycopg_connection() as conn:
        assert backfill.step(conn, batch_size=5) == 5  # a first batch: keys 1-5 are stored
        Comment.objects.create(
            article=Article.objects.order_by("id").last(),
            creator=User.objects.get(),
            publish_status="public",
        )
        assert exact() == truth()
        backfill.run(conn)
    call_command("pgcounters", "drain")
    assert stored() == exact() == truth()


def test_a_changed_filter_is_backfilled_by_migrate() -> None:
    populate()
    Comment.objects.filter(score__gte=4).update(publish_status="private")
    call_command("pgcounters", "drain")
    with psycopg_connection() as conn:
        # the stored values were kept under another definition: all comments counted
        conn.execute(
            "UPDATE pgcounters.specs SET definition = jsonb_set(definition, '{where}', 'null')"
            " WHERE name = %s",
            (COUNTER,),
        )
        tamper(
            conn,
            "UPDATE blog_article a SET public_comments ="
            " (SELECT count(*) FROM blog_comment c WHERE c.article_id = a.id)",
        )
    assert stored() != truth()
    call_command("migrate", verbosity=0)
    assert stored() == exact() == truth()


def test_a_removed_counter_leaves_no_spec_and_verify_of_the_others_works() -> None:
    populate()
    gone = CounterSpec(
        name="blog.article.old_score",
        source="blog_comment",
        keys=("article_id",),
        target=ColumnTarget("blog_article", "old_score"),
        sum="score",
    )
    with psycopg_connection() as conn:
        record(conn, gone)  # what a SumField left before it was removed
    call_command("migrate", verbosity=0)
    with psycopg_connection() as conn:
        assert "blog.article.old_score" not in {s.name for s in declared(conn)}
    call_command("pgcounters", "verify")  # every counter; raises on an error or drift
    call_command("pgcounters", "recount", "--no-progress")
    sums = Article.objects.annotate(s=Sum("comments__score", filter=PUBLIC, default=0))
    assert list(Article.objects.order_by("id").values_list("public_score", flat=True)) == [
        a.s for a in sums.order_by("id")
    ]


def test_list_shows_declared_counters_right_after_migrate(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with psycopg_connection() as conn:
        conn.execute("SELECT pgcounters.drop_counter(%s)", (COUNTER,))
    call_command("migrate", verbosity=0)
    call_command("pgcounters", "list")
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert COUNTER in names
    assert "blog.users.total" in names


def test_drop_removes_the_spec_and_the_triggers_too() -> None:
    from pgcounters.specs import NamedTarget
    from pgcounters.triggers import install, installed

    extra = CounterSpec(name="blog.comments.scratch", source="blog_comment", target=NamedTarget())
    with psycopg_connection() as conn:
        install(conn, [extra])
        assert "blog.comments.scratch" in {s.name for s in declared(conn)}
    call_command("pgcounters", "drop", "blog.comments.scratch")
    with psycopg_connection() as conn:
        assert "blog.comments.scratch" not in {s.name for s in declared(conn)}
        assert "blog.comments.scratch" not in {t.spec_name for t in installed(conn)}


def test_the_admin_counters_page_shows_a_backfill(admin_client: Client) -> None:
    populate()
    as_if_just_added()
    with override_settings(PGCOUNTERS_BACKFILL="worker"):
        call_command("migrate", verbosity=0)
    html = admin_client.get("/admin/pgcounters/counter/").content.decode()
    assert "backfilling (0 keys done)" in html
    with psycopg_connection() as conn:
        backfill.run(conn)
    html = admin_client.get("/admin/pgcounters/counter/").content.decode()
    assert "backfilling" not in html
    assert "ready" in html


def test_a_partial_migrate_keeps_the_counters_of_unmigrated_tables() -> None:
    # the members app unmigrated: its counters are still declared, their tables are gone
    call_command("migrate", "members", "zero", verbosity=0)
    try:
        with psycopg_connection() as conn:
            names = {s.name for s in declared(conn)}
            assert backfill.pending(conn) == []
        # still declared by the models: not dropped, registered again once migrated
        assert {"members.member.published_posts", COUNTER} <= names
    finally:
        call_command("migrate", "members", verbosity=0)
    member = Member.objects.create(username="back")
    Post.objects.create(author=member, published=True)
    call_command("pgcounters", "drain")
    assert Member.objects.get(pk=member.pk).published_posts == 1
