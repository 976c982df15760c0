"""Notes counted per period of their time (Paris days and hours across DST changes), in
every mode."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from pgcounters import Bucket
from pgcounters.contrib.django import register_counter

PARIS = "Europe/Paris"


class Post(models.Model):
    title = models.CharField(max_length=40, default="")


class Note(models.Model):
    post = models.ForeignKey(Post, related_name="notes", on_delete=models.CASCADE, null=True)
    public = models.BooleanField(default=True)
    created_at = models.DateTimeField()
    score = models.IntegerField(default=1)


# public notes per post per day in Paris
public_per_day = register_counter(
    "timeline.public_per_day",
    Note,
    keys=("post",),
    filter=Q(public=True),
    bucket=Bucket("created_at", "day", time_zone=PARIS),
)
# every note per post per hour in Paris, through the unlogged queue
per_hour = register_counter(
    "timeline.per_hour",
    Note,
    keys=("post",),
    mode="unlogged",
    bucket=Bucket("created_at", "hour", time_zone=PARIS),
)
# the score of public notes per post per week (from Monday), applied in the writing transaction
score_per_week = register_counter(
    "timeline.score_per_week",
    Note,
    keys=("post",),
    filter=Q(public=True),
    sum="score",
    mode="direct",
    bucket=Bucket("created_at", "week", time_zone=PARIS),
)
# every note per month in New York (a global counter per period)
per_month = register_counter(
    "timeline.per_month", Note, bucket=Bucket("created_at", "month", time_zone="America/New_York")
)
# every note per post per day in UTC, the last 3 days kept (older values are deleted)
recent_days = register_counter(
    "timeline.recent_days",
    Note,
    keys=("post",),
    bucket=Bucket("created_at", "day", time_zone="UTC", keep=3),
)
