"""The blog: users, articles, comments with a publish status, tags, notifications.

Every counter below is kept by statement-level triggers, whatever writes the
rows: ``save``, ``bulk_create``, ``QuerySet.update``/``delete``, raw SQL, COPY.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils import timezone

from pgcounters import Bucket
from pgcounters.contrib.django import CountField, SumField, register_counter

PUBLIC = Q(publish_status="public")


class User(models.Model):
    username = models.CharField(max_length=150)
    # public comments per user
    public_comments = CountField("comments", filter=PUBLIC)
    # unread notifications per user
    unread_notifications = CountField("notifications", filter=Q(read=False))
    # public comments on the articles the user wrote: a two-level path,
    # User <- Article (author) <- Comment
    received_comments = CountField("articles__comments", filter=PUBLIC)

    def __str__(self) -> str:
        return self.username


class Tag(models.Model):
    name = models.CharField(max_length=50, unique=True)
    # published articles carrying the tag: a many-to-many counter filtered on the other side
    published_articles = CountField("articles", filter=Q(published=True))

    def __str__(self) -> str:
        return self.name


class Article(models.Model):
    title = models.CharField(max_length=200, default="")
    author = models.ForeignKey(
        User, related_name="articles", on_delete=models.SET_NULL, null=True, blank=True
    )
    published = models.BooleanField(default=True)
    tags = models.ManyToManyField(Tag, related_name="articles", blank=True)
    # tags per article: the rows of the automatic through table
    tag_count = CountField("tags")
    # public comments per article
    public_comments = CountField("comments", filter=PUBLIC)
    # a sum: the total score of the article's public comments
    public_score = SumField("comments", "score", filter=PUBLIC)

    def __str__(self) -> str:
        return self.title


class Comment(models.Model):
    creator = models.ForeignKey(User, related_name="comments", on_delete=models.CASCADE)
    article = models.ForeignKey(
        Article, related_name="comments", on_delete=models.CASCADE, null=True
    )
    message = models.TextField(default="")
    publish_status = models.CharField(
        max_length=100,
        choices=[("public", "Public"), ("private", "Private")],
        default="private",
    )
    score = models.IntegerField(default=0)
    created_on = models.DateField(default=timezone.localdate)


class Notification(models.Model):
    user = models.ForeignKey(User, related_name="notifications", on_delete=models.CASCADE)
    message = models.TextField(default="")
    read = models.BooleanField(default=False)


# a global counter: the number of users
register_counter("blog.users.total", User)
# public comments per article per day: a counter per period (a time bucket of the comment's
# day), read over a range as a zero-filled series for the article's chart (blog.charts)
comments_per_day = register_counter(
    "blog.article.comments_per_day",
    Comment,
    keys=("article",),
    filter=PUBLIC,
    bucket=Bucket("created_on", "day", time_zone="UTC"),
)
