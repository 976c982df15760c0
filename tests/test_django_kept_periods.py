"""Django's reads of a counter per period (the declared counter's get, get_many, top and
the module functions, on Django's own connection) read 0 for a day the counter no longer
keeps, before and after a drain, against the notes the test wrote."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection

from django_support import drain
from pgcounters.contrib.django import counters
from timeline.models import Note, Post, recent_days

pytestmark = pytest.mark.django_db(transaction=True)

UTC = dt.UTC
NOW = dt.datetime(2026, 11, 20, 12, tzinfo=UTC)


def test_django_reads_leave_out_the_days_no_longer_kept() -> None:
    """`timeline.recent_days` keeps 3 days (UTC): today and the 2 before."""
    with connection.cursor() as cur:  # the clock of Django's session
        cur.execute("SELECT set_config('pgcounters.now', %s, false)", [NOW.isoformat()])
    post = Post.objects.create(title="p")
    written = {0: 2, 2: 1, 3: 4, 10: 3}  # days before today -> notes
    for days, n in written.items():
        for _ in range(n):
            Note.objects.create(post=post, created_at=NOW - dt.timedelta(days=days))
    today = NOW.date()
    truth = {today - dt.timedelta(days=d): (n if d < 3 else 0) for d, n in written.items()}
    keys = [(post, day) for day in truth]
    for drained in (False, True):
        assert [recent_days.get(k) for k in keys] == list(truth.values()), drained
        assert recent_days.get_many(keys) == list(truth.values()), drained
        assert [counters.get("timeline.recent_days", k) for k in keys] == list(truth.values())
        assert counters.get_many("timeline.recent_days", keys) == list(truth.values())
        if drained:
            ranked = [((post.pk, today), 2), ((post.pk, today - dt.timedelta(days=2)), 1)]
            assert recent_days.top(10) == ranked
            assert counters.top("timeline.recent_days", 10) == ranked
        drain()
