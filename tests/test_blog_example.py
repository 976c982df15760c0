"""The blog example as a site: its pages, admin, rate-limited API, sample data and start-up."""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Iterator
from io import StringIO
from pathlib import Path
from typing import Any

import psycopg
import pytest
from blog.models import Article, Comment, Notification, User
from blogsite import local
from django.conf import settings
from django.core.cache import cache
from django.core.management import call_command
from django.db.migrations.loader import MigrationLoader
from django.db.models import Count, Q
from django.test import Client

from django_support import assert_exact, drain
from pgcounters import Quotas
from pgcounters.contrib.django.db import psycopg_connection
from pgcounters.contrib.django.expressions import Exact
from pgcounters.contrib.django.pagination import EstimatedCountPaginator
from support import set_clock

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def empty_page_cache() -> Iterator[None]:
    """The article pages cached by another test (ids come back after a migrate to zero)."""
    cache.clear()
    yield
    cache.clear()


def blog(public: list[int], private: int = 2) -> tuple[User, list[Article]]:
    """Articles with ``public[i]`` public comments each (and a few private ones)."""
    user = User.objects.create(username="ann")
    articles = Article.objects.bulk_create(Article(title=f"a{i}") for i in range(len(public)))
    Comment.objects.bulk_create(
        [
            Comment(article=a, creator=user, publish_status="public")
            for a, n in zip(articles, public, strict=True)
            for _ in range(n)
        ]
        + [Comment(article=articles[0], creator=user) for _ in range(private)]
    )
    return user, articles


def test_article_list_is_the_top_by_the_counter_column() -> None:
    _, articles = blog([3, 7, 0, 5])
    drain()
    response = Client().get("/")
    assert response.status_code == 200
    shown = [(a.title, a.public_comments, a.exact) for a in response.context["articles"]]
    assert shown == [("a1", 7, 7), ("a3", 5, 5), ("a0", 3, 3), ("a2", 0, 0)]
    assert f'href="/articles/{articles[1].pk}/detail/"' in response.content.decode()
    truth = dict(
        Article.objects.annotate(
            n=Count("comments", filter=Q(comments__publish_status="public"))
        ).values_list("title", "n")
    )
    assert {title: n for title, n, _ in shown} == truth


def test_article_detail_shows_the_exact_count_before_the_drain() -> None:
    _, articles = blog([4, 1])
    response = Client().get(f"/articles/{articles[0].pk}/detail/")
    assert response.status_code == 200
    html = response.content.decode()
    # nothing drained yet: the column says 0, the exact value says 4
    assert '<strong id="exact">4</strong>' in html
    assert '<span id="stored">0</span>' in html
    assert '<span id="pending">4</span>' in html
    assert len(response.context["comments"]) == 4
    assert Client().get("/articles/999999/detail/").status_code == 404


def test_notifications_page_and_mark_as_read_twice_counts_once() -> None:
    user = User.objects.create(username="bob")
    other = User.objects.create(username="eve")
    notes = Notification.objects.bulk_create(
        [Notification(user=user, message=f"n{i}") for i in range(3)]
        + [Notification(user=user, read=True), Notification(user=other)]
    )
    client = Client()
    page = client.get(f"/users/{user.pk}/notifications/")
    assert page.status_code == 200
    assert '<strong id="unread">3</strong>' in page.content.decode()
    assert len(page.context["notifications"]) == 4

    for _ in range(2):  # the same notification, posted twice
        answer = client.post(f"/notifications/{notes[0].pk}/read/")
        assert answer.status_code == 303
        assert answer["Location"] == f"/users/{user.pk}/notifications/"
    assert client.get(f"/notifications/{notes[0].pk}/read/").status_code == 405
    assert client.post("/notifications/999999/read/").status_code == 404

    page = client.get(f"/users/{user.pk}/notifications/")
    assert '<strong id="unread">2</strong>' in page.content.decode()
    drain()
    assert User.objects.get(pk=user.pk).unread_notifications == 2
    assert User.objects.get(pk=other.pk).unread_notifications == 1
    assert_exact(stored=True)


@pytest.fixture
def api_quota() -> Iterator[int]:
    """The API's quota with a limit of 3 a minute, its window as the example defines it, and
    the quotas' clock of Django's connection 3.5 s before a minute ends (no roll-over)."""
    name = settings.BLOG_API_QUOTA
    with psycopg_connection() as conn:
        quotas = Quotas(conn)
        quotas.drop_quota(name)
        quotas.define_quota(name, 3, window="60s")
        set_clock(conn, dt.datetime(2026, 3, 10, 12, 34, 56, 500000, tzinfo=dt.UTC))
        try:
            yield 3
        finally:
            set_clock(conn, None)
            quotas.drop_quota(name)


def test_api_answers_429_past_its_limit(api_quota: int) -> None:
    blog([2, 1])
    client = Client(REMOTE_ADDR="203.0.113.9")
    answers = [client.get("/api/top-articles/") for _ in range(api_quota + 2)]
    assert [a.status_code for a in answers] == [200] * api_quota + [429, 429]
    assert [a["public_comments"] for a in answers[0].json()["articles"]] == [2, 1]
    assert answers[0]["RateLimit-Remaining"] == str(api_quota - 1)
    assert answers[-1]["Retry-After"] == "4"  # 3.5 s to the end of the minute, rounded up
    # another client address has its own budget
    assert Client(REMOTE_ADDR="203.0.113.10").get("/api/top-articles/").status_code == 200


def test_migrate_defines_the_api_quota() -> None:
    from blog.apps import define_api_quota

    define_api_quota()
    with psycopg_connection() as conn:
        quota = Quotas(conn).quota(settings.BLOG_API_QUOTA)
    assert quota.default_limit == settings.BLOG_API_LIMIT
    assert quota.window == "60s"


def test_admin_lists_the_counter_columns(admin_client: Client) -> None:
    _, rows = blog([2])
    assert admin_client.get(f"/admin/blog/article/{rows[0].pk}/change/").status_code == 200
    for model in ("user", "article", "comment", "notification", "tag"):
        response = admin_client.get(f"/admin/blog/{model}/")
        assert response.status_code == 200, model
    articles = admin_client.get("/admin/blog/article/")
    assert "public_comments" in articles.context["cl"].list_display
    comments = admin_client.get("/admin/blog/comment/")
    assert isinstance(comments.context["cl"].paginator, EstimatedCountPaginator)
    assert comments.context["cl"].result_count == 4


def test_blog_seed_loads_sample_data_and_counters_are_exact() -> None:
    out = StringIO()
    call_command(
        "blog_seed",
        users=6,
        articles=4,
        comments=80,
        notifications=30,
        no_admin=True,
        stdout=out,
    )
    assert "6 users, 4 articles, 7 tags, 80 comments, 30 notifications" in out.getvalue()
    assert (User.objects.count(), Article.objects.count()) == (6, 4)
    assert (Comment.objects.count(), Notification.objects.count()) == (80, 30)
    # everything was drained: the stored columns are the exact values
    rows = Article.objects.annotate(exact=Exact("public_comments"))
    assert all(a.public_comments == a.exact for a in rows)
    assert sum(a.public_comments for a in rows) == (
        Comment.objects.filter(publish_status="public").count()
    )
    call_command("blog_seed", users=2, articles=1, comments=5, notifications=0, no_admin=True)
    assert Comment.objects.count() == 5
    assert_exact()


@pytest.mark.django_db(transaction=False)
def test_embedded_database_is_not_started_when_a_dsn_is_set(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PGCOUNTERS_DSN", "host=127.0.0.1 dbname=elsewhere")
    with local.embedded_database(tmp_path / "data") as started:
        assert started is None
        assert os.environ["PGCOUNTERS_DSN"] == "host=127.0.0.1 dbname=elsewhere"
    assert not (tmp_path / "data").exists()


@pytest.mark.django_db(transaction=False)
def test_embedded_database_starts_creates_blog_and_stops(
    monkeypatch: pytest.MonkeyPatch, server_folder: Path
) -> None:
    monkeypatch.delenv("PGCOUNTERS_DSN", raising=False)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    folder = server_folder / "data"
    with local.embedded_database(folder) as dsn:
        assert dsn is not None
        assert os.environ["PGCOUNTERS_DSN"] == dsn
        with psycopg.connect(dsn) as conn:
            row: Any = conn.execute("SELECT current_database()").fetchone()
            assert row[0] == local.DATABASE
        assert (folder / "postmaster.pid").exists()
    assert "PGCOUNTERS_DSN" not in os.environ
    assert not (folder / "postmaster.pid").exists()  # stopped: it was started here
    assert (folder / "PG_VERSION").exists()  # the data stays, in the folder given


def test_runserver_drains_only_in_the_serving_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RUN_MAIN", raising=False)
    assert not local._serving(["manage.py", "migrate"])
    assert not local._serving(["manage.py", "runserver"])  # the autoreloader's parent
    assert local._serving(["manage.py", "runserver", "--noreload"])
    monkeypatch.setenv("RUN_MAIN", "true")
    assert local._serving(["manage.py", "runserver"])


def test_checks_wait_for_migrate_on_a_database_not_migrated_yet() -> None:
    from pgcounters.contrib.django.checks import check_database

    assert check_database(databases=["default"]) == []
    call_command("migrate", "blog", "0001", verbosity=0)
    try:
        # no warning either: `migrate` runs the checks before it migrates, and the first
        # migrate of a fresh database must print nothing of pgcounters
        assert check_database(databases=["default"]) == []
        on_disk = MigrationLoader(None, ignore_no_migrations=True).disk_migrations
        assert len([name for app, name in on_disk if app == "blog"]) > 1
    finally:
        call_command("migrate", "blog", verbosity=0)
    assert check_database(databases=["default"]) == []
