"""The blog example's pages of tags, authors and comments per day, and its article page
cached until the worker reports a change of its counters.

Every count a page shows is checked against the ORM's own aggregate
(``annotate(Count(...))``), before the queues are drained (exact reads) and after.
"""

from __future__ import annotations

import datetime as dt
import io
import os
import re
import signal
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from blog import charts, pagecache
from blog.management.commands.blog_listen import Command as BlogListen
from blog.models import Article, Comment, Tag, User, comments_per_day
from django.core.cache import cache
from django.core.management import call_command
from django.db import connection
from django.db.models import Count, Q
from django.test import Client

import truth
from django_support import assert_exact, blog_truths, drain
from pgcounters import Bucket, Counters
from pgcounters.contrib.django.db import dsn as db_dsn
from pgcounters.contrib.django.db import psycopg_connection
from pgcounters.contrib.django.signals import counters_changed, worker
from pgcounters.notifications import CHANNEL, Changes
from pgcounters.worker import Worker, WorkerSettings
from support import running, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

PUBLIC = Q(publish_status="public")
FAST = WorkerSettings(min_interval=0.01, max_interval=0.05, log_every=0)


@pytest.fixture(autouse=True)
def empty_cache() -> Iterator[None]:
    cache.clear()
    yield
    cache.clear()


def _cells(html: str, row_class: str, cell_class: str) -> dict[int, int]:
    """``data-id`` -> the number in the row's cell of that class."""
    rows = re.findall(rf'<tr class="{row_class}" data-id="(\d+)">(.*?)</tr>', html, flags=re.DOTALL)
    out = {}
    for pk, body in rows:
        found = re.search(rf'<td class="n {cell_class}">(-?\d+)</td>', body)
        assert found is not None, body
        out[int(pk)] = int(found.group(1))
    return out


def _tagged() -> tuple[list[Tag], list[Article]]:
    tags = Tag.objects.bulk_create(Tag(name=n) for n in ("sql", "django", "python", "ops"))
    articles = Article.objects.bulk_create(
        [Article(title=f"a{i}", published=i != 2) for i in range(5)]
    )
    articles[0].tags.add(tags[0], tags[1], tags[2])
    articles[1].tags.set([tags[0], tags[1]])
    articles[2].tags.add(tags[0])  # not published: not counted for the tag
    articles[3].tags.add(tags[3])
    articles[3].tags.remove(tags[3])
    articles[4].tags.add(tags[2], tags[3])
    articles[4].tags.clear()
    tags[1].articles.add(articles[4])  # from the other side
    return tags, articles


def _tag_truth() -> dict[int, int]:
    return dict(
        Tag.objects.annotate(n=Count("articles", filter=Q(articles__published=True))).values_list(
            "pk", "n"
        )
    )


def _tags_per_article_truth() -> dict[int, int]:
    return dict(Article.objects.annotate(n=Count("tags")).values_list("pk", "n"))


@pytest.mark.parametrize("drained", [False, True])
def test_tags_pages_count_both_ways(drained: bool) -> None:
    tags, articles = _tagged()
    if drained:
        drain()
    client = Client()
    page = client.get("/tags/")
    assert page.status_code == 200
    shown = _cells(page.content.decode(), "tag", "exact")
    assert shown == _tag_truth() == {tags[0].pk: 2, tags[1].pk: 3, tags[2].pk: 1, tags[3].pk: 0}

    detail = client.get(f"/tags/{tags[0].pk}/")
    html = detail.content.decode()
    assert '<strong id="published-articles">2</strong>' in html
    per_article = _tags_per_article_truth()
    listed = _cells(html, "article", "tags")
    assert listed == {articles[0].pk: per_article[articles[0].pk], articles[1].pk: 2}
    assert articles[2].pk not in listed  # not published

    top = _cells(client.get("/").content.decode(), "article", "tags")
    assert top == per_article == {
        articles[0].pk: 3, articles[1].pk: 2, articles[2].pk: 1, articles[3].pk: 0,
        articles[4].pk: 1,
    }  # fmt: skip
    article = client.get(f"/articles/{articles[0].pk}/detail/").content.decode()
    assert '<span id="tag-count">3</span>' in article
    assert re.findall(r'<a class="tag" href="/tags/\d+/">(\w+)</a>', article) == [
        "django",
        "python",
        "sql",
    ]
    assert client.get("/tags/999999/").status_code == 404
    if drained:
        with psycopg_connection() as conn:
            truth.assert_stored(conn, blog_truths())
    assert_exact()


def _authors() -> tuple[list[User], list[Article]]:
    users = User.objects.bulk_create(User(username=n) for n in ("ann", "bob", "cid", "dan"))
    ann, bob, cid, _ = users
    articles = Article.objects.bulk_create(
        [Article(title="x", author=ann), Article(title="y", author=bob), Article(title="z")]
    )
    Comment.objects.bulk_create(
        [Comment(article=articles[0], creator=cid, publish_status="public") for _ in range(3)]
        + [Comment(article=articles[1], creator=cid, publish_status="public") for _ in range(5)]
        + [Comment(article=articles[1], creator=ann) for _ in range(4)]  # private
        + [Comment(article=articles[2], creator=bob, publish_status="public")]  # no author
    )
    return users, articles


def _leaderboard(client: Client) -> list[tuple[int, int]]:
    html = client.get("/authors/").content.decode()
    return list(_cells(html, "author", "exact").items())


def _received_truth() -> dict[int, int]:
    return dict(
        User.objects.annotate(
            n=Count("articles__comments", filter=Q(articles__comments__publish_status="public"))
        ).values_list("pk", "n")
    )


def test_authors_leaderboard_ranks_by_the_exact_path_counter() -> None:
    users, articles = _authors()
    ann, bob, _, dan = users
    client = Client()
    # before any drain: the exact values, ranked; only users who wrote articles
    assert _leaderboard(client) == [(bob.pk, 5), (ann.pk, 3)]
    # the article moves to another author: its comments move with it, in one statement
    Article.objects.filter(pk=articles[1].pk).update(author=dan)
    Comment.objects.filter(article=articles[0]).update(publish_status="public")
    board = _leaderboard(client)
    assert board == [(dan.pk, 5), (ann.pk, 3)]
    received = _received_truth()
    assert all(received[pk] == n for pk, n in board)
    drain()
    html = client.get("/authors/").content.decode()
    assert _cells(html, "author", "stored") == dict(board)
    # the author deleted: the article stays, without an author (SET NULL)
    User.objects.filter(pk=dan.pk).delete()
    assert _leaderboard(client) == [(ann.pk, 3)]
    assert {pk: n for pk, n in _received_truth().items() if n} == {ann.pk: 3}
    assert_exact()


def test_the_series_is_zero_filled_and_equals_the_truth() -> None:
    user = User.objects.create(username="ann")
    article, other = Article.objects.bulk_create([Article(title="a"), Article(title="b")])
    day = dt.date(2026, 3, 10)
    per_day = {day - dt.timedelta(days=6): 2, day - dt.timedelta(days=3): 1, day: 4}
    Comment.objects.bulk_create(
        [
            Comment(article=article, creator=user, publish_status="public", created_on=d)
            for d, n in per_day.items()
            for _ in range(n)
        ]
        + [Comment(article=article, creator=user, created_on=day)]  # private
        + [Comment(article=other, creator=user, publish_status="public", created_on=day)]
        + [Comment(article=article, creator=user, publish_status="public", created_on=day
                   + dt.timedelta(days=1))]  # after the range
    )  # fmt: skip
    series = charts.comments_per_day(article.pk, until=day, days=7)
    assert [d for d, _ in series] == [day - dt.timedelta(days=n) for n in range(6, -1, -1)]
    assert series == [(d, per_day.get(d, 0)) for d, _ in series]
    # the truth, by the ORM
    orm = dict(
        Comment.objects.filter(PUBLIC, article=article, created_on__range=(series[0][0], day))
        .values("created_on")
        .annotate(n=Count("pk"))
        .values_list("created_on", "n")
    )
    assert {d: n for d, n in series if n} == orm
    drain()
    assert charts.comments_per_day(article.pk, until=day, days=7) == series

    page = Client().get(f"/articles/{article.pk}/activity/?until=2026-03-10&days=7")
    assert page.status_code == 200
    html = page.content.decode()
    bars = re.findall(r'<rect class="bar" data-day="([\d-]+)" data-value="(\d+)"', html)
    assert [(dt.date.fromisoformat(d), int(n)) for d, n in bars] == series
    assert '<strong id="total">7</strong>' in html
    assert '<text class="top" x="24" y="28" font-size="11" text-anchor="end">4</text>' in html
    # the tallest bar fills the plot, an empty day has no height
    heights = re.findall(r'data-value="(\d+)" x="[\d.]+" y="[\d.]+" width="[\d.]+" '
                         r'height="([\d.]+)"', html)  # fmt: skip
    assert ("4", "144.0") in heights
    assert ("0", "0.0") in heights
    for bad in ("days=0", "days=400", "days=x", "until=10/03/2026"):
        assert Client().get(f"/articles/{article.pk}/activity/?{bad}").status_code == 400
    assert Client().get("/articles/999999/activity/").status_code == 404


def test_the_chart_reads_a_counter_per_day_over_a_range() -> None:
    """The chart's counter is a time bucket per day: one range read, and the articles most
    commented over the range ranked by the same counter."""
    assert comments_per_day.spec().bucket == Bucket("created_on", "day", time_zone="UTC")
    user = User.objects.create(username="ann")
    a, b = Article.objects.bulk_create([Article(title="a"), Article(title="b")])
    day = dt.date(2026, 3, 10)
    Comment.objects.bulk_create(
        [Comment(article=a, creator=user, publish_status="public", created_on=day)] * 2
        + [Comment(article=b, creator=user, publish_status="public", created_on=day)] * 3
        + [Comment(article=a, creator=user, publish_status="public",
                   created_on=day - dt.timedelta(days=7))] * 5
    )  # fmt: skip
    week = (day - dt.timedelta(days=6), day + dt.timedelta(days=1))
    assert comments_per_day.get_range(a.pk, *week) == 2
    assert comments_per_day.top_range(*week) == [((b.pk,), 3), ((a.pk,), 2)]
    drain()
    assert comments_per_day.get_range(a.pk, week[0] - dt.timedelta(days=1), week[1]) == 7


def test_the_article_page_shows_todays_chart() -> None:
    user = User.objects.create(username="ann")
    article = Article.objects.create(title="a")
    Comment.objects.create(article=article, creator=user, publish_status="public")
    html = Client().get(f"/articles/{article.pk}/detail/").content.decode()
    bars = dict(re.findall(r'<rect class="bar" data-day="([\d-]+)" data-value="(\d+)"', html))
    assert len(bars) == 14
    day = Comment.objects.get().created_on
    # the last bar is today's: the comment's day, or the next if midnight passed meanwhile
    assert max(bars) in (day.isoformat(), (day + dt.timedelta(days=1)).isoformat())
    assert bars.pop(day.isoformat()) == "1"
    assert set(bars.values()) == {"0"}


def _shown(client: Client, article: Article) -> tuple[str, int, int]:
    """The article page: whether it came from the cache, its count, its comments listed."""
    response = client.get(f"/articles/{article.pk}/detail/")
    assert response.status_code == 200
    html = response.content.decode()
    found = re.search(r'<strong id="exact">(\d+)</strong>', html)
    assert found is not None
    return response["X-Page-Cache"], int(found.group(1)), html.count(": new comment (")


@pytest.fixture
def reports() -> Iterator[list[Changes]]:
    """The change sets the worker reports (after the example's page cache had them)."""
    got: list[Changes] = []

    def receiver(sender: Any, changes: Changes, **kwargs: Any) -> None:
        got.append(changes)

    counters_changed.connect(receiver, weak=False)
    try:
        yield got
    finally:
        counters_changed.disconnect(receiver)


def _pgcounters_worker_until_reported(reports: list[Changes]) -> None:
    """``manage.py pgcounters worker`` in this process, stopped (SIGINT, as by Ctrl-C) once it
    reported a batch."""
    failures: list[BaseException] = []
    before = len(reports)

    def stop_when_reported() -> None:
        try:
            wait_for(lambda: len(reports) > before)
        except BaseException as exc:
            failures.append(exc)
        os.kill(os.getpid(), signal.SIGINT)

    stopper = threading.Thread(target=stop_when_reported)
    stopper.start()
    call_command("pgcounters", "worker", "--min-interval", "0.01", "--log-level", "warning")
    stopper.join()
    assert failures == []


def test_a_batch_of_many_keys_makes_every_cached_page_stale(reports: list[Changes]) -> None:
    """Above ``--notify-max-keys`` the signal names the counter without its keys: the
    example drops every page, those of articles the batch did not touch too."""
    user = User.objects.create(username="ann")
    a, b, untouched = Article.objects.bulk_create([Article(title=t) for t in "abc"])
    drain()
    client = Client()
    for article in (a, b, untouched):
        assert _shown(client, article) == ("miss", 0, 0)
        assert _shown(client, article) == ("hit", 0, 0)
    for article in (a, b):
        Comment.objects.create(article=article, creator=user, publish_status="public")
    before = len(reports)
    failures: list[BaseException] = []

    def stop_when_reported() -> None:
        try:
            wait_for(lambda: len(reports) > before)
        except BaseException as exc:
            failures.append(exc)
        os.kill(os.getpid(), signal.SIGINT)

    stopper = threading.Thread(target=stop_when_reported)
    stopper.start()
    call_command(
        "pgcounters", "worker", "--min-interval", "0.01", "--log-level", "warning",
        "--notify-max-keys", "1",
    )  # fmt: skip
    stopper.join()
    assert failures == []
    assert reports[-1]["blog.article.public_comments"] is None
    assert _shown(client, a) == ("miss", 1, 0)
    assert _shown(client, b) == ("miss", 1, 0)
    assert _shown(client, untouched) == ("miss", 0, 0)
    assert _shown(client, untouched) == ("hit", 0, 0)


def test_the_listener_invalidates_the_pages_a_workers_notification_names() -> None:
    """``manage.py blog_listen`` in a thread of its own, LISTENing on the real database,
    while a worker that sends NOTIFY (and no Django signal) drains: the page it names is
    rendered again, the other is still served from the cache."""
    user = User.objects.create(username="ann")
    article, other = Article.objects.bulk_create([Article(title="a"), Article(title="b")])
    Comment.objects.create(article=article, creator=user, publish_status="public")
    drain()
    client = Client()
    for shown in (article, other):
        assert _shown(client, shown)[0] == "miss"
        assert _shown(client, shown)[0] == "hit"
    out = io.StringIO()
    failures: list[BaseException] = []

    def listen() -> None:
        try:
            call_command("blog_listen", count=1, timeout=60, stdout=out)
        except BaseException as exc:
            failures.append(exc)

    listener = threading.Thread(target=listen)
    listener.start()
    with psycopg_connection() as conn:

        def listening() -> bool:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE query = %s",
                (f"LISTEN {CHANNEL}",),
            ).fetchone()
            return row is not None and row[0] == 1

        wait_for(listening)
    Comment.objects.create(
        article=article, creator=user, publish_status="public", message="new comment"
    )
    settings = WorkerSettings(
        min_interval=0.01, max_interval=0.05, log_every=0, notify=True, notify_interval=0
    )
    with running(Worker(db_dsn(), settings)) as errors:
        listener.join(timeout=60)
    assert errors == []
    assert failures == []
    assert not listener.is_alive()
    assert out.getvalue().splitlines() == [
        f"listening on {CHANNEL}",
        f"invalidated the pages of articles {article.pk}",
    ]
    assert _shown(client, article) == ("miss", 2, 1)
    assert _shown(client, other) == ("hit", 0, 0)


def test_the_listener_reads_every_form_of_notification() -> None:
    article = Article.objects.create(title="a")
    client = Client()
    assert _shown(client, article)[0] == "miss"
    invalidate = BlogListen.invalidate
    assert invalidate('{"blog.users.total": [[]]}') == "no article page shows blog.users.total"
    assert _shown(client, article)[0] == "hit"
    for payload, said in (
        ('{"blog.article.public_comments": "*"}', "many keys of blog.article.public_comments"),
        ('{"*": "*"}', "everything changed"),
        ("[]", "unreadable notification"),
    ):
        assert invalidate(payload).startswith(said)
        assert _shown(client, article)[0] == "miss"
        assert _shown(client, article)[0] == "hit"


def test_the_cached_article_page_is_fresh_after_the_workers_batch(
    reports: list[Changes],
) -> None:
    user = User.objects.create(username="ann")
    article, other = Article.objects.bulk_create([Article(title="a"), Article(title="b")])
    Comment.objects.create(article=article, creator=user, publish_status="public")
    drain()
    client = Client()
    assert _shown(client, article) == ("miss", 1, 0)
    assert _shown(client, article) == ("hit", 1, 0)
    assert _shown(client, other) == ("miss", 0, 0)

    Comment.objects.create(
        article=article, creator=user, publish_status="public", message="new comment"
    )
    # before the batch: the page is the cached one (the count it showed, no new comment)
    assert _shown(client, article) == ("hit", 1, 0)

    _pgcounters_worker_until_reported(reports)
    assert (article.pk,) in (reports[-1]["blog.article.public_comments"] or ())
    # after it: rendered again, with the new comment and its count
    assert _shown(client, article) == ("miss", 2, 1)
    assert _shown(client, article) == ("hit", 2, 1)
    # the other article's page was not touched by the batch
    assert _shown(client, other) == ("hit", 0, 0)
    truth_now = Article.objects.annotate(
        n=Count("comments", filter=Q(comments__publish_status="public"))
    )
    assert truth_now.get(pk=article.pk).n == 2


def test_a_page_rendered_before_the_batch_and_stored_after_it_is_not_served() -> None:
    """The race a cache that deletes pages would lose: a request reads the counters, the
    worker's batch commits and invalidates, then the request stores its (stale) page."""
    user = User.objects.create(username="ann")
    article = Article.objects.create(title="a")

    def render_then_batch() -> str:
        page = str(Article.objects.annotate(n=Count("comments")).get(pk=article.pk).n)
        Comment.objects.create(article=article, creator=user, publish_status="public")
        with psycopg_connection() as conn:
            result = Counters(conn).drain_queue_batch(1000, changes=True)
        assert result.changes is not None
        pagecache.invalidate_changed(None, changes=result.changes, using="default")
        return page

    page, cached = pagecache.cached_page(article.pk, render_then_batch)
    assert (page, cached) == ("0", False)
    # the page stored after the invalidation is under the old version: never read again
    page, cached = pagecache.cached_page(article.pk, lambda: "1")
    assert (page, cached) == ("1", False)
    assert pagecache.cached_page(article.pk, lambda: "never")[0] == "1"


def test_a_running_worker_renews_the_page_after_each_batch() -> None:
    user = User.objects.create(username="ann")
    article = Article.objects.create(title="a")
    client = Client()
    assert _shown(client, article)[1:] == (0, 0)
    w = worker(settings=FAST)
    assert w.reports_changes  # the example's page cache listens
    thread = threading.Thread(target=w.run)
    thread.start()
    try:
        for n in range(1, 4):
            Comment.objects.create(
                article=article, creator=user, publish_status="public", message="new comment"
            )
            # the page shows the comment once the worker applied it (observed, not slept)
            wait_for(lambda n=n: _shown(client, article)[1:] == (n, n))  # type: ignore[misc]
    finally:
        w.stop()
        thread.join(timeout=60)
    assert not thread.is_alive()
    connection.close()


def test_saving_an_article_renews_its_page() -> None:
    article = Article.objects.create(title="old title")
    client = Client()
    assert "old title" in client.get(f"/articles/{article.pk}/detail/").content.decode()
    article.title = "new title"
    article.save()
    assert "new title" in client.get(f"/articles/{article.pk}/detail/").content.decode()


def test_migrating_the_counters_over_existing_rows_backfills_them() -> None:
    """The migration adding the path, many-to-many and per-day counters runs over tables
    with rows (written here by SQL before it): ``migrate`` counts them, no drain needed.
    Migrating back first drops the many-to-many counters, whose triggers no migration
    holds."""
    call_command("migrate", "blog", "0005", verbosity=0)
    try:
        with connection.cursor() as cur:
            cur.execute(
                "INSERT INTO blog_user (username) VALUES ('ann'), ('bob'), ('cid') RETURNING id"
            )
            ann, bob, cid = (row[0] for row in cur.fetchall())
            cur.execute(
                "INSERT INTO blog_article (title, author_id, published) VALUES"
                " ('x', %s, true), ('y', %s, false), ('z', %s, true), ('w', NULL, true)"
                " RETURNING id",
                [ann, bob, bob],
            )
            x, y, z, w = (row[0] for row in cur.fetchall())
            cur.execute("INSERT INTO blog_tag (name) VALUES ('sql'), ('ops') RETURNING id")
            sql_tag, ops = (row[0] for row in cur.fetchall())
            cur.execute(
                "INSERT INTO blog_article_tags (article_id, tag_id) VALUES"
                " (%s, %s), (%s, %s), (%s, %s), (%s, %s), (%s, %s)",
                [x, sql_tag, x, ops, y, sql_tag, z, sql_tag, w, ops],
            )
            cur.execute(
                "INSERT INTO blog_comment (creator_id, article_id, message, publish_status,"
                " score, created_on)"
                " SELECT %s, a, '', CASE WHEN n %% 3 = 0 THEN 'private' ELSE 'public' END, 0,"
                " date '2026-03-01' + n %% 4"
                " FROM unnest(%s::bigint[]) AS a, generate_series(1, 10) AS n",
                [cid, [x, y, z, w]],
            )
    finally:
        call_command("migrate", "blog", verbosity=0)
    with psycopg_connection() as conn:
        truth.assert_stored(conn, blog_truths())  # the stored values, before any drain
    assert User.objects.get(pk=bob).received_comments == 14  # y and z: 7 public each
    assert Tag.objects.get(pk=sql_tag).published_articles == 2  # x and z (y unpublished)
    assert Article.objects.get(pk=x).tag_count == 2
    series = charts.comments_per_day(w, until=dt.date(2026, 3, 4), days=5)
    assert series[0] == (dt.date(2026, 2, 28), 0)
    assert [n for _, n in series[1:]] == [2, 2, 2, 1]
    assert_exact()
