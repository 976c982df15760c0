"""The Django side with the triggers the compiler writes today, not those frozen in the
migration files: a fault of the compiler (a counter column's guard left open, say)
reaches Django's tests too.

Each test installs every trigger of the models through the library's own delivery
(the pgtrigger triggers the apps registered, compiled when the apps loaded) inside the
test's transaction, which rolls them back with everything else; then it writes the way
ordinary Django code and psql do, and checks the counters against a hand count.
"""

from __future__ import annotations

from typing import Any

import pgtrigger
import pytest
from blog.models import Article, Comment, User
from django.db import DatabaseError, connection, transaction
from django.db.models import Count, Q, Sum

from members.models import Member, Post
from pgcounters.contrib.django.pgtrigger_delivery import CounterTrigger
from pgcounters.dberrors import translate
from pgcounters.errors import CounterColumnWrite

pytestmark = pytest.mark.django_db

PUBLIC = Q(comments__publish_status="public")


def registered() -> list[tuple[Any, CounterTrigger]]:
    """(model, trigger) of every counter trigger the apps registered."""
    return [
        (model, trigger)
        for model, trigger in pgtrigger.registered()
        if isinstance(trigger, CounterTrigger)
    ]


@pytest.fixture(autouse=True)
def current_triggers() -> None:
    """The compiler's triggers of today in place of the migrations' (in this test's
    transaction: rolled back with it)."""
    guards = [t for _, t in registered() if t.compiled.event == "guard_update"]
    tables = {t.compiled.table.name for t in guards if t.compiled.table is not None}
    assert tables >= {"blog_article", "members_member"}
    pgtrigger.install()
    with connection.cursor() as cur:
        for model, trigger in registered():
            # installed as compiled now: the function's body is the compiler's
            cur.execute(
                "SELECT prosrc FROM pg_proc WHERE proname = %s",
                (trigger.get_pgid(model),),
            )
            row = cur.fetchone()
            assert row is not None, trigger.name
            assert trigger.compiled.body in row[0], trigger.name


def truth(article: Article) -> tuple[int, int]:
    """Public comments and the sum of their scores, counted by hand."""
    row = Article.objects.annotate(
        n=Count("comments", filter=PUBLIC),
        s=Sum("comments__score", filter=PUBLIC, default=0),
    ).get(pk=article.pk)
    return int(row.n), int(row.s)


def stored(article: Article) -> tuple[int, int]:
    return Article.objects.values_list("public_comments", "public_score").get(pk=article.pk)


def drain() -> None:
    """The drain's SQL function, in the test's transaction (its column writes pass the
    guard); the queue is empty after it."""
    with connection.cursor() as cur:
        cur.execute("SELECT deltas, busy, quarantined FROM pgcounters.drain_queue(1000)")
        assert cur.fetchone()[1:] == (0, 0)
        cur.execute("SELECT count(*) FROM pgcounters.queue")
        assert cur.fetchone() == (0,)


def refused(write: Any) -> None:
    """``write`` is refused by a counter column's guard, and writes nothing."""
    with pytest.raises(DatabaseError, match="kept by pgcounters") as raised, transaction.atomic():
        write()
    assert isinstance(translate(raised.value.__cause__), CounterColumnWrite)  # type: ignore[arg-type]


def test_a_counter_column_is_refused_to_django_and_to_sql() -> None:
    user = User.objects.create(username="u")
    article = Article.objects.create(title="a", public_comments=7, public_score=9)
    assert stored(article) == truth(article) == (0, 0)  # a new row starts at 0
    Comment.objects.create(article=article, creator=user, publish_status="public", score=3)
    Comment.objects.create(article=article, creator=user, publish_status="private", score=5)
    drain()
    assert stored(article) == truth(article) == (1, 3)
    refused(lambda: Article.objects.filter(pk=article.pk).update(public_comments=0))
    refused(lambda: Article.objects.update(public_score=0, title="all"))
    stale = Article.objects.get(pk=article.pk)
    stale.public_comments = 40
    refused(lambda: Article.objects.bulk_update([stale], ["public_comments"]))

    def raw() -> None:
        with connection.cursor() as cur:
            cur.execute("UPDATE blog_article SET public_score = 50 WHERE id = %s", (article.pk,))

    refused(raw)
    Article.objects.filter(pk=article.pk).update(title="only the title")
    assert stored(article) == truth(article) == (1, 3)


def test_a_counted_users_column_is_refused_too() -> None:
    member = Member.objects.create(username="ann", published_posts=5, all_posts=6)
    Post.objects.create(author=member, published=True)
    Post.objects.create(author=member, published=False)
    drain()
    counted = Member.objects.annotate(
        p=Count("posts", filter=Q(posts__published=True)), a=Count("posts")
    ).get(pk=member.pk)
    fresh = Member.objects.get(pk=member.pk)
    assert (fresh.published_posts, fresh.all_posts) == (counted.p, counted.a) == (1, 2)
    refused(lambda: Member.objects.filter(pk=member.pk).update(published_posts=9))
    fresh = Member.objects.get(pk=member.pk)
    assert (fresh.published_posts, fresh.all_posts) == (1, 2)
