"""Helpers of the Django tests on the blog example.

The truth of every counter the example (and the oddnames test app) declares is
the ORM's own aggregate, ``annotate(Count(..., filter=Q(...)))`` or ``Sum``,
written here by hand: it shares no code with the triggers, ``verify`` or
``recount``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

from blog.models import Article, Comment, Tag, User
from django.db.models import Count, Q, Sum
from django.db.models.functions import TruncDay, TruncMonth, TruncWeek

import truth
from ledger.models import Invoice, Line
from members.models import Member, Post
from oddnames.models import Item, Owner
from pgcounters import Counters
from pgcounters.connection import Conn
from pgcounters.contrib.django import declared_counters
from pgcounters.contrib.django.db import psycopg_connection
from press.models import Label, Story, Writer
from timeline.models import Note


def drain() -> None:
    with psycopg_connection() as conn:
        Counters(conn).drain()


def _per_pk(rows: Callable[[], Iterable[tuple[Any, Any]]]) -> truth.Reader:
    def read(conn: Conn) -> truth.Values:
        # a sum of a DecimalField stays a Decimal (exact), anything else is an int
        return {
            (pk,): value if isinstance(value, Decimal) else int(value or 0) for pk, value in rows()
        }

    return read


def _column(counter: str, model: Any, field: str, aggregate: Any) -> truth.Truth:
    """A counter column: the ORM's aggregate per parent, and the column as stored."""
    return truth.from_rows(
        counter,
        _per_pk(lambda: model.objects.annotate(truth=aggregate).values_list("pk", "truth")),
        _per_pk(lambda: model.objects.values_list("pk", field)),
    )


def orm_truths() -> list[truth.Truth]:
    """The truth of every declared counter, by the ORM's own aggregates."""
    public = Q(comments__publish_status="public")
    return [
        _column(
            "blog.user.public_comments", User, "public_comments", Count("comments", filter=public)
        ),
        _column(
            "blog.user.unread_notifications",
            User,
            "unread_notifications",
            Count("notifications", filter=Q(notifications__read=False)),
        ),
        _column(
            "blog.article.public_comments",
            Article,
            "public_comments",
            Count("comments", filter=public),
        ),
        _column(
            "blog.article.public_score",
            Article,
            "public_score",
            Sum("comments__score", filter=public),
        ),
        truth.from_rows("blog.users.total", lambda conn: {(): User.objects.count()}),
        *blog_truths(),
        _column(
            "oddnames.owner.items_on",
            Owner,
            "items_on",
            Count("items", filter=Q(items__state="on")),
        ),
        _column("oddnames.owner.total_size", Owner, "total_size", Sum("items__size")),
        _column(
            "members.member.published_posts",
            Member,
            "published_posts",
            Count("posts", filter=Q(posts__published=True)),
        ),
        _column("members.member.all_posts", Member, "all_posts", Count("posts")),
        truth.from_rows(
            "members.posts.per_user",
            lambda conn: {
                (user,): n
                for user, n in Post.objects.filter(user__isnull=False)
                .values("user")
                .annotate(n=Count("pk"))
                .values_list("user", "n")
            },
        ),
        *(
            _column(f"ledger.invoice.{field}", Invoice, field, Sum("lines__amount"))
            for field in ("total", "total_unlogged", "total_direct")
        ),
        _column("ledger.invoice.lines_count", Invoice, "lines_count", Sum("lines__quantity")),
        _column("ledger.invoice.replicated_lines", Invoice, "replicated_lines", Count("lines")),
        truth.from_rows(
            "ledger.amount_per_day",
            lambda conn: {
                (day,): total
                for day, total in Line.objects.filter(amount__isnull=False)
                .values("day")
                .annotate(total=Sum("amount"))
                .values_list("day", "total")
            },
        ),
        *press_truths(),
        *_timeline_truths(),
        truth.from_rows(
            "oddnames.items.by_state",
            lambda conn: {
                (state,): n
                for state, n in Item.objects.values("state")
                .annotate(n=Count("pk"))
                .values_list("state", "n")
            },
        ),
        *generic_truths(),
    ]


def blog_truths() -> list[truth.Truth]:
    """The blog's counters through a path, a many-to-many and per day."""
    return [
        _column(
            "blog.user.received_comments",
            User,
            "received_comments",
            Count("articles__comments", filter=Q(articles__comments__publish_status="public")),
        ),
        _column("blog.article.tag_count", Article, "tag_count", Count("tags")),
        _column(
            "blog.tag.published_articles",
            Tag,
            "published_articles",
            Count("articles", filter=Q(articles__published=True)),
        ),
        truth.from_rows(
            "blog.article.comments_per_day",
            lambda conn: {
                (article, day): n
                for article, day, n in Comment.objects.filter(
                    publish_status="public", article__isnull=False
                )
                .order_by()
                .values("article", "created_on")
                .annotate(n=Count("pk"))
                .values_list("article", "created_on", "n")
            },
        ),
    ]


def press_truths() -> list[truth.Truth]:
    """The counters through paths and many-to-many relations (the press test app)."""
    return [
        _column(
            "press.writer.public_remarks",
            Writer,
            "public_remarks",
            Count(
                "stories__remarks",
                filter=Q(stories__remarks__public=True, stories__published=True),
            ),
        ),
        _column(
            "press.writer.remark_score", Writer, "remark_score", Sum("stories__remarks__score")
        ),
        _column(
            "press.writer.public_remarks_direct",
            Writer,
            "public_remarks_direct",
            Count("stories__remarks", filter=Q(stories__remarks__public=True)),
        ),
        _column(
            "press.label.published_stories",
            Label,
            "published_stories",
            Count("stories", filter=Q(stories__published=True)),
        ),
        _column("press.label.stories_unlogged", Label, "stories_unlogged", Count("stories")),
        _column(
            "press.writer.published_label_links",
            Writer,
            "published_label_links",
            Count("stories__labels", filter=Q(stories__published=True)),
        ),
        _column(
            "press.writer.label_links_direct",
            Writer,
            "label_links_direct",
            Count("stories__labels"),
        ),
        _column("press.story.label_count", Story, "label_count", Count("labels")),
        _column(
            "press.story.active_labels",
            Story,
            "active_labels",
            Count("labels", filter=Q(labels__active=True)),
        ),
    ]


def generic_truths() -> list[truth.Truth]:
    """The counters over generic relations of the attached test app."""
    from attached.models import Note, Photo
    from attached.models import Post as AttachedPost

    out = [
        _column(f"attached.post.{name}", AttachedPost, name, aggregate)
        for name, aggregate in (
            ("notes_count", Count("notes")),
            ("public_notes", Count("notes", filter=Q(notes__public=True))),
            ("notes_unlogged", Count("notes")),
            ("notes_direct", Count("notes")),
            ("score_total", Sum("notes__score")),
            ("votes_count", Count("votes")),
        )
    ]
    out.append(_column("attached.photo.notes_count", Photo, "notes_count", Count("notes")))
    out.append(
        truth.from_rows(
            "attached.notes_per_object",
            lambda conn: {
                (ct, object_id): n
                for ct, object_id, n in Note.objects.order_by()
                .values("content_type", "object_id")
                .annotate(n=Count("pk"))
                .values_list("content_type", "object_id", "n")
            },
        )
    )
    return out


def _timeline_truths() -> list[truth.Truth]:
    """Notes per period: days, weeks and months by the ORM's Trunc in their zone; hours
    from each note's time (the two 02:00 of the night Paris clocks go back stay two)."""
    paris, new_york = ZoneInfo("Europe/Paris"), ZoneInfo("America/New_York")

    def hours(conn: Conn) -> truth.Values:
        out: truth.Values = {}
        for post, at in Note.objects.filter(post__isnull=False).values_list("post", "created_at"):
            local = at.astimezone(paris)
            start = at.astimezone(dt.UTC) - dt.timedelta(
                minutes=local.minute, seconds=local.second, microseconds=local.microsecond
            )
            key = (post, start.strftime("%Y-%m-%dT%H:%M:%SZ"))
            out[key] = out.get(key, 0) + 1
        return out

    return [
        truth.from_rows(
            "timeline.public_per_day",
            lambda conn: {
                (post, day.date()): n
                for post, day, n in Note.objects.filter(public=True, post__isnull=False)
                .annotate(day=TruncDay("created_at", tzinfo=paris))
                .values("post", "day")
                .annotate(n=Count("pk"))
                .values_list("post", "day", "n")
            },
        ),
        truth.from_rows("timeline.per_hour", hours),
        truth.from_rows(
            "timeline.score_per_week",
            lambda conn: {
                (post, week.date()): total
                for post, week, total in Note.objects.filter(public=True, post__isnull=False)
                .annotate(week=TruncWeek("created_at", tzinfo=paris))
                .values("post", "week")
                .annotate(total=Sum("score"))
                .values_list("post", "week", "total")
            },
        ),
        truth.from_rows(
            "timeline.per_month",
            lambda conn: {
                (month.date(),): n
                for month, n in Note.objects.annotate(
                    month=TruncMonth("created_at", tzinfo=new_york)
                )
                .values("month")
                .annotate(n=Count("pk"))
                .values_list("month", "n")
            },
        ),
        truth.from_rows("timeline.recent_days", _recent_days),
    ]


def _recent_days(conn: Conn) -> truth.Values:
    """Notes per post per UTC day, the 3 days kept (today and the 2 before): an older day
    reads 0, its value deleted by the worker."""
    row = conn.execute("SELECT (now() AT TIME ZONE 'UTC')::date").fetchone()
    assert row is not None
    first = row[0] - dt.timedelta(days=2)
    return {
        (post, day.date()): n
        for post, day, n in Note.objects.filter(post__isnull=False)
        .annotate(day=TruncDay("created_at", tzinfo=dt.UTC))
        .filter(day__date__gte=first)
        .values("post", "day")
        .annotate(n=Count("pk"))
        .values_list("post", "day", "n")
    }


def assert_exact(*, stored: bool = False) -> None:
    """Every declared counter's exact values equal the ORM's aggregates, key by key (and,
    with ``stored``, after a drain the test made, the stored values too)."""
    truths = orm_truths()
    # a counter declared without a truth here would go unjudged
    assert {t.counter for t in truths} == {spec.name for _, spec in declared_counters()}
    with psycopg_connection() as conn:
        truth.assert_exact(conn, truths)
        if stored:
            truth.assert_stored(conn, truths)
