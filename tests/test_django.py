"""The Django app on the blog example: every kind of ORM and raw write is counted."""

from __future__ import annotations

import os
import sys
import threading
from io import StringIO
from typing import Any

import pytest
from blog.models import Article, Comment, Notification, User
from django.core.management import call_command
from django.db import connection, transaction
from django.db.models import Count, Q

from django_support import assert_exact, drain
from pgcounters import Counters
from pgcounters.contrib.django import Exact
from pgcounters.contrib.django.db import psycopg_connection
from pgcounters.contrib.django.pagination import EstimatedCountPaginator, estimated_count

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.fast]


def truth() -> list[tuple[int, int]]:
    return list(
        Article.objects.annotate(n=Count("comments", filter=Q(comments__publish_status="public")))
        .order_by("id")
        .values_list("id", "n")
    )


def test_every_orm_and_raw_write_is_counted() -> None:
    users = User.objects.bulk_create([User(username=f"u{i}") for i in range(3)])
    articles = Article.objects.bulk_create([Article(title=f"a{i}") for i in range(3)])
    c = Comment.objects.create(creator=users[0], article=articles[0], publish_status="public")
    c.publish_status = "private"
    c.save()  # a flip
    c.publish_status = "public"
    c.article = articles[1]
    c.save()  # a flip and a move
    Comment.objects.bulk_create(
        [
            Comment(creator=users[i % 3], article=articles[i % 3], publish_status="public", score=i)
            for i in range(30)
        ]
    )
    Comment.objects.filter(score__lt=5).update(publish_status="private")
    Comment.objects.filter(score__gt=25).delete()
    Comment.objects.filter(score=10).first().delete()  # type: ignore[union-attr]
    Comment.objects.filter(score=11).update(article=None)  # NULL parent
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO blog_comment (creator_id, article_id, message, publish_status, score)"
            " VALUES (%s, %s, '', 'public', 3)",
            [users[1].id, articles[2].id],
        )
    with (
        psycopg_connection() as conn,
        conn.cursor() as pcur,
        pcur.copy(
            "COPY blog_comment (creator_id, article_id, message, publish_status, score) FROM STDIN"
        ) as copy,
    ):
        for i in range(7):
            copy.write_row((users[0].id, articles[0].id, "", "public", i))
    drain()
    assert list(Article.objects.order_by("id").values_list("id", "public_comments")) == truth()
    assert_exact(stored=True)
    # the counter column is a real column: filter and order by it
    top = Article.objects.filter(public_comments__gt=0).order_by("-public_comments").first()
    assert top is not None
    assert top.public_comments == max(n for _, n in truth())


def test_exact_annotation_adds_pending_deltas_in_one_statement() -> None:
    user = User.objects.create(username="u")
    article = Article.objects.create(title="a")
    Comment.objects.bulk_create(
        [Comment(creator=user, article=article, publish_status="public") for _ in range(4)]
    )
    row = Article.objects.annotate(n=Exact("public_comments")).get(pk=article.pk)
    assert (row.public_comments, row.n) == (0, 4)
    drain()
    row = Article.objects.annotate(n=Exact("public_comments")).get(pk=article.pk)
    assert (row.public_comments, row.n) == (4, 4)
    ranked = Article.objects.annotate(n=Exact("public_comments")).order_by("-n")
    assert [a.pk for a in ranked] == [article.pk]


def test_notifications_unread_count() -> None:
    user = User.objects.create(username="reader")
    notes = Notification.objects.bulk_create([Notification(user=user) for _ in range(5)])
    Notification.objects.filter(pk=notes[0].pk).delete()  # delete of an unread: -1
    Notification.objects.filter(pk=notes[1].pk).update(read=True)  # mark as read: -1
    Notification.objects.filter(pk=notes[1].pk).update(read=True)  # again: nothing
    read = Notification.objects.create(user=user, read=True)  # a read one counts nothing
    read.delete()
    drain()
    user.refresh_from_db()
    assert user.unread_notifications == 3


def test_mark_as_read_by_two_requests_at_once_counts_once() -> None:
    user = User.objects.create(username="reader")
    note = Notification.objects.create(user=user)
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def request() -> None:
        try:
            barrier.wait()
            with transaction.atomic():
                Notification.objects.filter(pk=note.pk, read=False).update(read=True)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=request) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    drain()
    user.refresh_from_db()
    assert user.unread_notifications == 0


def test_global_counter_of_users() -> None:
    User.objects.bulk_create([User(username=f"u{i}") for i in range(7)])
    User.objects.filter(username="u3").delete()
    with psycopg_connection() as conn:
        assert Counters(conn).get("blog.users.total") == 6


def test_management_command_shares_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    user = User.objects.create(username="u")
    Comment.objects.create(creator=user, publish_status="public")
    call_command("pgcounters", "drain")
    assert "applied" in capsys.readouterr().out
    user.refresh_from_db()
    assert user.public_comments == 1


def test_makemigrations_has_nothing_to_add() -> None:
    out = StringIO()
    call_command("makemigrations", "blog", "--check", "--dry-run", stdout=out)
    assert "No changes detected" in out.getvalue()


def test_triggers_compiled_by_an_earlier_version_are_a_database_check_error() -> None:
    from pgcounters.contrib.django.checks import check_database

    with connection.cursor() as cur:
        cur.execute(
            "SELECT t.tgfoid, pg_get_functiondef(t.tgfoid) FROM pg_trigger AS t"
            " WHERE t.tgname LIKE %s ORDER BY t.tgname LIMIT 1",
            ["pgtrigger_pgc_blog_article_public_comments%ins%"],
        )
        _, source = cur.fetchone()
        # the body as an earlier version compiled it (here: one comment more)
        cur.execute(source.replace("RETURN NULL;", "RETURN NULL; -- earlier", 1))
    try:
        errors = check_database(databases=["default"])
        assert [e.id for e in errors] == ["pgcounters.E003"]
        assert "compiled by an earlier version" in errors[0].msg
        assert "pgcounters was upgraded" in str(errors[0].hint)
    finally:  # the database outlives the test: the body as it was
        with connection.cursor() as cur:
            cur.execute(source)
    assert check_database(databases=["default"]) == []


def test_database_checks_pass_when_installed() -> None:
    from pgcounters.contrib.django.checks import check_database, check_declarations

    assert check_declarations() == []
    assert check_database(databases=["default"]) == []
    with connection.cursor() as cur:
        cur.execute(
            "SELECT tgname FROM pg_trigger WHERE tgname LIKE %s LIMIT 1",
            ["pgtrigger_pgc_blog_article_public_comments%"],
        )
        name = cur.fetchone()[0]
        cur.execute(f'ALTER TABLE blog_comment DISABLE TRIGGER "{name}"')
    try:
        errors = check_database(databases=["default"])
        assert [e.id for e in errors] == ["pgcounters.E003"]
        # migrate, which the hint names, runs its checks first: the drift warns there
        # instead of stopping it (it stopped with a SystemCheckError)
        err = StringIO()
        call_command("migrate", skip_checks=False, verbosity=0, stderr=err)
        assert "pgcounters.W003" in err.getvalue()
    finally:  # the database outlives the test: leave the trigger as it was
        with connection.cursor() as cur:
            cur.execute(f'ALTER TABLE blog_comment ENABLE TRIGGER "{name}"')


def test_estimated_counts(settings: Any) -> None:
    user = User.objects.create(username="u")
    Comment.objects.bulk_create([Comment(creator=user) for _ in range(2000)])
    with connection.cursor() as cur:
        cur.execute("ANALYZE blog_comment")
    estimate = estimated_count(Comment.objects.all())
    assert 1000 <= estimate <= 4000
    paginator = EstimatedCountPaginator(Comment.objects.order_by("id"), 100)
    assert paginator.count == 2000  # below the threshold: exact
    EstimatedCountPaginator.threshold = 10
    try:
        assert EstimatedCountPaginator(Comment.objects.order_by("id"), 100).count == estimate
    finally:
        EstimatedCountPaginator.threshold = 100_000


def test_manage_py_pgcounters_into_a_closed_pipe_stops_quietly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`manage.py pgcounters list | head`: the reader goes away before the listing ends;
    it printed a BrokenPipeError traceback (the console script already stopped quietly)."""
    from django.core.management.base import CommandError

    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader went away
    gone = os.fdopen(write_end, "w", buffering=1)
    monkeypatch.setattr(sys, "stdout", gone)
    try:
        with pytest.raises(CommandError) as failed:
            call_command("pgcounters", "list")
        assert failed.value.returncode == 1
        print("x" * 100_000, file=gone)  # what is left to print goes nowhere
    finally:
        gone.close()


def test_a_migrate_that_replaces_a_disabled_trigger_counts_its_counter_again() -> None:
    """An upgrade's migration replaces the triggers of an earlier version (here: the blog
    migrated back before its last trigger migration, then forward): a trigger disabled
    before it comes back enabled, and the rows written meanwhile are counted."""
    from pgcounters import verify

    user = User.objects.create(username="w")
    article = Article.objects.create(title="a")
    Comment.objects.create(creator=user, article=article, publish_status="public")
    with connection.cursor() as cur:
        cur.execute(
            "SELECT tgname FROM pg_trigger WHERE tgname LIKE %s",
            ["pgtrigger_pgc_blog_article_public_comments%ins%"],
        )
        (name,) = cur.fetchone()
        cur.execute(f'ALTER TABLE blog_comment DISABLE TRIGGER "{name}"')
    Comment.objects.create(creator=user, article=article, publish_status="public")  # uncounted
    with psycopg_connection() as conn:
        assert not verify(conn, "blog.article.public_comments").ok
    try:
        call_command("migrate", "blog", "0008", verbosity=0)
        call_command("migrate", "blog", verbosity=0)
        with psycopg_connection() as conn:
            assert verify(conn, "blog.article.public_comments").ok
    finally:  # the database outlives the test: the trigger enabled, as migrated
        with connection.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_trigger WHERE tgname = %s AND tgenabled = 'D'", [name])
            if cur.fetchone() is not None:
                cur.execute(f'ALTER TABLE blog_comment ENABLE TRIGGER "{name}"')
