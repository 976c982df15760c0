"""Counters per period declared on Django models: random ORM, bulk and raw-SQL writes with
times across the DST changes of Paris, against the ORM's own count per period
(``Trunc...(tzinfo=...)``), in every mode; reads over a range; the admin's values."""

from __future__ import annotations

import datetime as dt
from collections import Counter as Tally
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.db import connection
from django.db.models import Count, Sum
from django.db.models.functions import TruncDay, TruncMonth, TruncWeek
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_support import drain
from pgcounters import verify
from pgcounters.contrib.django import verify_orm
from pgcounters.contrib.django.db import psycopg_connection
from pgcounters.contrib.django.models import CounterValue
from support import set_clock
from timeline.models import Note, Post, per_hour, per_month, public_per_day, score_per_week

pytestmark = pytest.mark.django_db(transaction=True)

PARIS = ZoneInfo("Europe/Paris")
NEW_YORK = ZoneInfo("America/New_York")
UTC = dt.UTC
TIMELINE = ("timeline.public_per_day", "timeline.per_hour", "timeline.score_per_week",
            "timeline.per_month")  # fmt: skip
# two days either side of each DST change of 2026 in Paris (and one of New York's)
CHANGES = (
    dt.datetime(2026, 3, 29, 1, tzinfo=UTC),
    dt.datetime(2026, 10, 25, 1, tzinfo=UTC),
    dt.datetime(2026, 11, 1, 6, tzinfo=UTC),
)

instants = st.builds(
    lambda change, minutes: change + dt.timedelta(minutes=minutes),
    st.sampled_from(CHANGES),
    st.integers(-48 * 60, 48 * 60),
)
posts = st.integers(0, 2)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("create"), posts, instants, st.booleans(), st.integers(-3, 9)),
        st.tuples(st.just("bulk"), st.lists(st.tuples(posts, instants, st.booleans()), max_size=8)),
        st.tuples(st.just("raw_insert"), posts, instants, st.integers(1, 4)),
        st.tuples(st.just("move"), st.integers(0, 30), instants),
        st.tuples(st.just("flip"), st.integers(0, 30)),
        st.tuples(st.just("repost"), st.integers(0, 30), posts),
        st.tuples(st.just("raw_update"), instants, instants),
        st.tuples(st.just("delete"), st.integers(0, 30)),
        st.tuples(st.just("bulk_delete"), instants),
        st.tuples(st.just("drain")),
    ),
    max_size=14,
)


def _nth(i: int) -> Note | None:
    return Note.objects.order_by("pk")[i : i + 1].first()


def _apply(op: tuple[Any, ...], targets: list[Post]) -> None:
    kind = op[0]
    if kind == "create":
        _, p, at, public, score = op
        Note.objects.create(post=targets[p], created_at=at, public=public, score=score)
    elif kind == "bulk":
        Note.objects.bulk_create(
            [Note(post=targets[p], created_at=at, public=public) for p, at, public in op[1]]
        )
    elif kind == "raw_insert":
        _, p, at, n = op
        with connection.cursor() as cur:
            # a raw statement of a session in another time zone
            cur.execute("SET LOCAL TimeZone = 'Pacific/Auckland'")
            cur.execute(
                "INSERT INTO timeline_note (post_id, public, created_at, score) "
                "SELECT %s, true, %s, 2 FROM generate_series(1, %s)",
                [targets[p].pk, at, n],
            )
    elif kind in ("move", "flip", "repost", "delete"):
        note = _nth(op[1])
        if note is None:
            return
        if kind == "move":
            note.created_at = op[2]
            note.save()
        elif kind == "flip":
            Note.objects.filter(pk=note.pk).update(public=not note.public)
        elif kind == "repost":
            note.post = targets[op[2]]
            note.save(update_fields=["post"])
        else:
            note.delete()
    elif kind == "raw_update":
        _, before, to = op
        with connection.cursor() as cur:
            cur.execute(
                "UPDATE timeline_note SET created_at = created_at"
                " + (%s::timestamptz - %s::timestamptz) WHERE created_at < %s",
                [to, before, before],
            )
    elif kind == "bulk_delete":
        Note.objects.filter(created_at__gte=op[1]).delete()
    else:
        drain()


def _reset() -> list[Post]:
    with connection.cursor() as cur:
        # TRUNCATE resets every counter of the table (its triggers)
        cur.execute("TRUNCATE timeline_note, timeline_post")
    return list(Post.objects.bulk_create([Post(title=f"p{i}") for i in range(3)]))


def _days() -> list[dt.date]:
    days: list[dt.date] = []
    for change in CHANGES:
        local = change.astimezone(PARIS).date()
        days += [local + dt.timedelta(days=d) for d in range(-3, 4)]
    return sorted(set(days))


def _check(targets: list[Post]) -> None:
    days = _days()
    # public notes per post per day: the ORM's TruncDay in Paris
    truth = Tally(
        {
            (r["post_id"], r["day"].date()): r["n"]
            for r in Note.objects.filter(public=True)
            .annotate(day=TruncDay("created_at", tzinfo=PARIS))
            .values("post_id", "day")
            .annotate(n=Count("pk"))
        }
    )
    for post in targets:
        for first in (days[0], days[7], days[14]):
            series = public_per_day.get_series(post, first, first + dt.timedelta(days=7))
            assert series == [(d, truth[(post.pk, d)]) for d, _ in series]
            # the range over the same days: exact too
            assert public_per_day.get_range(post, first, first + dt.timedelta(days=7)) == sum(
                v for _, v in series
            )
    weeks = {
        (r["post_id"], r["week"].date()): r["s"]
        for r in Note.objects.filter(public=True)
        .annotate(week=TruncWeek("created_at", tzinfo=PARIS))
        .values("post_id", "week")
        .annotate(s=Sum("score"))
    }
    for (post_pk, monday), total in weeks.items():
        assert score_per_week.get((post_pk, monday)) == total
    months = {
        r["month"].date(): r["n"]
        for r in Note.objects.annotate(month=TruncMonth("created_at", tzinfo=NEW_YORK))
        .values("month")
        .annotate(n=Count("pk"))
    }
    got = per_month.get_series(None, dt.date(2020, 1, 1), dt.date(2032, 1, 1))
    assert [(m, n) for m, n in got if n] == sorted(months.items())
    # hours: from every note's own time, in Python (two 02:00 the night clocks go back)
    hours: Tally[tuple[int, dt.datetime]] = Tally()
    for post_pk, at in Note.objects.values_list("post_id", "created_at"):
        local = at.astimezone(PARIS)
        hours[(post_pk, at - dt.timedelta(minutes=local.minute, seconds=local.second))] += 1
    for post in targets:
        day = CHANGES[1].astimezone(PARIS).date()
        series_h = per_hour.get_series(post, day - dt.timedelta(days=1), day + dt.timedelta(days=2))
        assert len(series_h) == 24 + 25 + 24
        starts = [s for s, _ in series_h if isinstance(s, dt.datetime)]  # an hour's: a datetime
        assert [v for _, v in series_h] == [hours[(post.pk, s.astimezone(UTC))] for s in starts]
    top = public_per_day.top_range(days[0], days[-1] + dt.timedelta(days=1), 3)
    per_post = Tally({post.pk: 0 for post in targets})
    for (post_pk, day), n in truth.items():
        if days[0] <= day <= days[-1]:
            per_post[post_pk] += n
    assert [v for _, v in top] == sorted(per_post.values(), reverse=True)[: len(top)]
    for (key,), value in top:
        assert isinstance(key, int)
        assert per_post[key] == value


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=ops)
def test_random_writes_are_counted_per_period_as_the_orm_counts(ops: list[Any]) -> None:
    targets = _reset()
    for op in ops:
        _apply(op, targets)
    _check(targets)
    assert all(r.ok for r in verify_orm(TIMELINE))
    with psycopg_connection() as conn:
        for name in TIMELINE:
            assert verify(conn, name).ok, name
    drain()
    _check(targets)


def test_the_admin_shows_stored_pending_and_exact_values_per_period(
    admin_client: Client,
) -> None:
    post = Post.objects.create(title="p")
    at = dt.datetime(2026, 10, 24, 22, 30, tzinfo=UTC)  # 25 October in Paris
    Note.objects.create(post=post, created_at=at)
    drain()
    Note.objects.bulk_create([Note(post=post, created_at=at) for _ in range(2)])
    response = admin_client.get("/admin/pgcounters/countervalue/", {"q": "2026-10-25"})
    assert response.status_code == 200
    found = {
        (v.counter.name, tuple(v.key)): (v.value, v.__dict__["pending"], v.__dict__["exact"])
        for v in response.context["cl"].result_list
        if isinstance(v, CounterValue)
    }
    assert found[("timeline.public_per_day", (str(post.pk), "2026-10-25"))] == (1, 2, 3)
    assert public_per_day.get((post, dt.date(2026, 10, 25))) == 3


def test_verify_orm_leaves_out_the_periods_a_counter_no_longer_keeps() -> None:
    """`timeline.recent_days` keeps 3 days: once the worker's retention deletes an older
    day's value, the ORM (which still has the notes) does not call it a mismatch."""
    from pgcounters import Counters

    now = dt.datetime(2026, 11, 21, 12, tzinfo=UTC)
    with psycopg_connection() as conn:
        # the periods' clock of this session (Django's connection), not the wall clock
        set_clock(conn, now)
    try:
        post = Post.objects.create(title="p")
        Note.objects.create(post=post, created_at=now)
        Note.objects.create(post=post, created_at=now - dt.timedelta(days=10))
        drain()
        with psycopg_connection() as conn:
            # the one value older than the 3 days kept: the day 10 days ago
            assert Counters(conn).drop_expired_buckets() == 1
            stored = conn.execute(
                "SELECT c.key, c.value FROM pgcounters.counters AS c"
                " JOIN pgcounters.targets AS t ON t.id = c.target_id"
                " WHERE t.name = 'timeline.recent_days'"
            ).fetchall()
            assert stored == [([str(post.pk), "2026-11-21"], 1)]
            assert verify(conn, "timeline.recent_days").ok
        [result] = verify_orm(["timeline.recent_days"])
        assert result.ok, result.mismatches
        assert result.keys_checked == 1  # today's value; the day 10 days ago is not compared
    finally:
        with psycopg_connection() as conn:
            set_clock(conn, None)
