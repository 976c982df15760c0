"""Counter columns belong to pgcounters: no ordinary write from Django or SQL changes them.

Every test writes a counter column the way ordinary code does (a stale save,
the admin, ``bulk_update``, ``QuerySet.update``, psql) and checks the counters
against the truth counted by hand (``annotate(Count(..., filter=...))``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from blog.models import Article, Comment, User
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import DatabaseError
from django.db.models import Count, Q
from django.db.models.signals import pre_save
from django.test import Client

from members.models import Member, Post
from pgcounters import Counters
from pgcounters.connection import Conn
from pgcounters.contrib.django import Exact
from pgcounters.contrib.django.db import dsn
from pgcounters.dberrors import translate
from pgcounters.errors import CounterColumnWrite
from pgcounters.triggers import paused

pytestmark = pytest.mark.django_db(transaction=True)

PUBLIC = Q(comments__publish_status="public")


def truth(article: Article) -> tuple[int, int]:
    """Public comments and the sum of their likes, counted by hand."""
    from django.db.models import Sum

    row = Article.objects.annotate(
        n=Count("comments", filter=PUBLIC),
        s=Sum("comments__score", filter=PUBLIC, default=0),
    ).get(pk=article.pk)
    return int(row.n), int(row.s)


def exact(article: Article) -> tuple[int, int]:
    row = Article.objects.annotate(n=Exact("public_comments"), s=Exact("public_score")).get(
        pk=article.pk
    )
    return int(row.n), int(row.s)


def stored(article: Article) -> tuple[int, int]:
    return Article.objects.values_list("public_comments", "public_score").get(pk=article.pk)


@pytest.fixture
def worker() -> Iterator[Conn]:
    """A connection of its own, as a worker beside the application has."""
    with psycopg.connect(dsn(), autocommit=True) as conn:
        yield conn


@pytest.fixture
def article() -> Article:
    user = User.objects.create(username="u")
    a = Article.objects.create(title="a")
    Comment.objects.create(article=a, creator=user, publish_status="public", score=3)
    Comment.objects.create(article=a, creator=user, publish_status="private", score=5)
    call_command("pgcounters", "drain")
    assert stored(a) == truth(a) == (1, 3)
    return a


def comment(article: Article, score: int = 2) -> None:
    user = User.objects.get()
    Comment.objects.create(article=article, creator=user, publish_status="public", score=score)


def test_a_stale_save_keeps_the_counters(article: Article) -> None:
    stale = Article.objects.get(pk=article.pk)
    comment(article)
    call_command("pgcounters", "drain")
    stale.title = "edited"
    stale.save()
    assert Article.objects.get(pk=article.pk).title == "edited"
    assert exact(article) == stored(article) == truth(article) == (2, 5)


def test_save_with_update_fields_naming_a_counter_keeps_it(article: Article) -> None:
    stale = Article.objects.get(pk=article.pk)
    comment(article)
    call_command("pgcounters", "drain")
    stale.public_comments = 0
    stale.save(update_fields=["title", "public_comments"])
    assert stored(article) == truth(article) == (2, 5)


def test_a_new_row_starts_at_zero_whatever_the_instance_says() -> None:
    a = Article.objects.create(title="new", public_comments=7, public_score=9)
    assert a.public_comments == 0
    assert stored(a) == truth(a) == (0, 0)
    got, created = Article.objects.get_or_create(title="other", defaults={"public_comments": 5})
    assert created
    assert stored(got) == truth(got) == (0, 0)


def test_get_or_create_and_update_or_create_keep_the_counters(article: Article) -> None:
    comment(article)
    call_command("pgcounters", "drain")
    _, created = Article.objects.get_or_create(pk=article.pk, defaults={"title": "x"})
    assert not created
    _, created = Article.objects.update_or_create(
        pk=article.pk, defaults={"title": "renamed", "public_comments": 0, "public_score": 0}
    )
    assert not created
    assert Article.objects.get(pk=article.pk).title == "renamed"
    assert exact(article) == stored(article) == truth(article) == (2, 5)


def test_set_password_and_save_on_a_user_with_counters(worker: Conn) -> None:
    member = Member.objects.create(username="ann")
    stale = Member.objects.get(pk=member.pk)
    Post.objects.create(author=member, published=True)
    Post.objects.create(author=member, published=False)
    Counters(worker).drain()
    stale.set_password("a long passphrase")
    stale.save()
    fresh = Member.objects.get(pk=member.pk)
    assert fresh.check_password("a long passphrase")
    assert (fresh.published_posts, fresh.all_posts) == (1, 2)
    counted = Member.objects.annotate(
        p=Count("posts", filter=Q(posts__published=True)), a=Count("posts")
    ).get(pk=member.pk)
    assert (counted.p, counted.a) == (1, 2)


def test_the_admin_change_form_keeps_the_counters(
    admin_client: Client, article: Article, worker: Conn
) -> None:
    comment(article)

    def drain_meanwhile(sender: Any, instance: Article, **kwargs: Any) -> None:
        # a worker drains between the admin's read of the row and its save
        Counters(worker).drain()

    pre_save.connect(drain_meanwhile, sender=Article)
    try:
        url = f"/admin/blog/article/{article.pk}/change/"
        assert admin_client.get(url).status_code == 200
        response = admin_client.post(url, {"title": "via the admin"})
    finally:
        pre_save.disconnect(drain_meanwhile, sender=Article)
    assert response.status_code == 302, response.content.decode()[:2000]
    assert Article.objects.get(pk=article.pk).title == "via the admin"
    assert exact(article) == stored(article) == truth(article) == (2, 5)


def test_bulk_update_of_a_counter_is_refused(article: Article) -> None:
    stale = Article.objects.get(pk=article.pk)
    comment(article)
    call_command("pgcounters", "drain")
    stale.title = "bulk"
    Article.objects.bulk_update([stale], ["title"])  # other fields: fine
    assert Article.objects.get(pk=article.pk).title == "bulk"
    with pytest.raises(DatabaseError, match="kept by pgcounters") as raised:
        Article.objects.bulk_update([stale], ["title", "public_comments"])
    assert isinstance(translate(raised.value.__cause__), CounterColumnWrite)  # type: ignore[arg-type]
    assert exact(article) == stored(article) == truth(article) == (2, 5)


def test_queryset_update_of_a_counter_is_refused(article: Article) -> None:
    with pytest.raises(DatabaseError, match="kept by pgcounters"):
        Article.objects.filter(pk=article.pk).update(public_comments=0)
    with pytest.raises(DatabaseError, match="kept by pgcounters"):
        Article.objects.update(public_score=0, title="all")
    Article.objects.filter(pk=article.pk).update(title="only the title")
    assert exact(article) == stored(article) == truth(article) == (1, 3)


def test_a_raw_update_from_another_program_is_refused(article: Article, worker: Conn) -> None:
    with pytest.raises(psycopg.Error) as raised:
        worker.execute("UPDATE blog_article SET public_comments = 0 WHERE id = %s", (article.pk,))
    assert raised.value.sqlstate == "PCC01"
    mapped = translate(raised.value)
    assert isinstance(mapped, CounterColumnWrite)
    assert "pgcounters recount blog.article.public_comments" in str(raised.value.diag.message_hint)
    # setting the value it has is no change, and other columns are free
    worker.execute("UPDATE blog_article SET public_comments = public_comments, title = 't'")
    assert exact(article) == stored(article) == truth(article) == (1, 3)


def test_a_raw_insert_from_another_program_starts_at_zero(worker: Conn) -> None:
    row = worker.execute("INSERT INTO blog_article (title) VALUES ('raw') RETURNING id").fetchone()
    assert row is not None
    forced = worker.execute(
        "INSERT INTO blog_article (title, public_comments, public_score) VALUES ('x', 5, 6)"
        " RETURNING id"
    ).fetchone()
    assert forced is not None
    for pk in (row[0], forced[0]):
        a = Article.objects.get(pk=pk)
        assert stored(a) == truth(a) == (0, 0)


def test_pgcounters_own_writers_still_apply(article: Article, worker: Conn) -> None:
    # the drain, a recount and a TRUNCATE of the counted table write the column
    comment(article, 4)
    Counters(worker).drain()
    assert stored(article) == truth(article) == (2, 7)
    with paused(worker, "blog.article.public_score"):
        worker.execute(
            "UPDATE blog_comment SET score = score + 10 WHERE article_id = %s", (article.pk,)
        )
    assert stored(article) == (2, 7) != truth(article)
    call_command("pgcounters", "recount", "blog.article.public_score")
    assert stored(article) == truth(article) == (2, 27)
    worker.execute("TRUNCATE blog_comment")
    assert stored(article) == truth(article) == (0, 0)


def test_stock_user_model_is_untouched() -> None:
    # the project's AUTH_USER_MODEL (the stock one) has no counter column and saves as before
    user = get_user_model().objects.create_user(username="stock", password="pw")
    user.set_password("another")
    user.save()
    assert get_user_model().objects.get(pk=user.pk).check_password("another")


def test_loaddata_starts_new_rows_at_zero_and_refuses_stale_values(
    article: Article, tmp_path: Any
) -> None:
    from django.core import serializers

    fixture = serializers.serialize("json", Article.objects.filter(pk=article.pk))
    dump = tmp_path / "articles.json"
    dump.write_text(fixture)
    # a fresh row from a fixture that says 1: it starts at 0 (nothing of it counted yet)
    fresh = fixture.replace(f'"pk": {article.pk}', '"pk": 9999')
    (tmp_path / "fresh.json").write_text(fresh)
    call_command("loaddata", str(tmp_path / "fresh.json"), verbosity=0)
    assert stored(Article.objects.get(pk=9999)) == (0, 0)
    # the same row again while its counter has moved on: refused, nothing written
    comment(article)
    call_command("pgcounters", "drain")
    with pytest.raises(DatabaseError, match="kept by pgcounters"):
        call_command("loaddata", str(dump), verbosity=0)
    assert exact(article) == stored(article) == truth(article) == (2, 5)
