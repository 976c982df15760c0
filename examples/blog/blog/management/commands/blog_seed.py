"""``manage.py blog_seed``: sample users, articles (with authors and tags), comments over
the last 30 days and notifications."""

from __future__ import annotations

import datetime as dt
import random
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction
from django.utils import timezone

from blog.apps import define_api_quota
from blog.models import Article, Comment, Notification, Tag, User
from pgcounters import Counters
from pgcounters.contrib.django import psycopg_connection

TAGS = ("postgresql", "django", "python", "performance", "sql", "operations", "testing")


class Command(BaseCommand):
    help = (
        "Replace the blog's rows with sample data (the counters follow through their "
        "triggers), drain the counter queues, define the API quota and an admin login."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--users", type=int, default=50)
        parser.add_argument("--articles", type=int, default=20)
        parser.add_argument("--comments", type=int, default=2000)
        parser.add_argument("--notifications", type=int, default=500)
        parser.add_argument("--days", type=int, default=30, help="comments over these days")
        parser.add_argument("--seed", type=int, default=1, help="random seed")
        parser.add_argument(
            "--no-admin", action="store_true", help="do not create the admin/admin login"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        rng = random.Random(options["seed"])
        sizes = {k: int(options[k]) for k in ("users", "articles", "comments", "notifications")}
        if min(sizes.values()) < 0 or sizes["users"] < 1 or sizes["articles"] < 1:
            self.stderr.write("sizes must be non-negative, with at least one user and article")
            raise SystemExit(2)
        with transaction.atomic():
            # deleted through the ORM: the triggers take the old rows off the counters
            Comment.objects.all().delete()
            Notification.objects.all().delete()
            Article.objects.all().delete()
            Tag.objects.all().delete()
            User.objects.all().delete()
            users = User.objects.bulk_create(
                User(username=f"user{i}") for i in range(1, sizes["users"] + 1)
            )
            tags = Tag.objects.bulk_create(Tag(name=name) for name in TAGS)
            # a few users write the articles; some articles are not published
            writers = users[: max(1, len(users) // 5)]
            articles = Article.objects.bulk_create(
                Article(
                    title=f"Article {i}",
                    author=rng.choice(writers),
                    published=rng.random() < 0.85,
                )
                for i in range(1, sizes["articles"] + 1)
            )
            Article.tags.through.objects.bulk_create(
                Article.tags.through(article=article, tag=tag)
                for article in articles
                for tag in rng.sample(tags, rng.randint(0, 3))
            )
            today = timezone.localdate()
            days = max(1, int(options["days"]))
            # a few popular articles and talkative users, like a real blog
            weights = [1 / (i + 1) for i in range(len(articles))]
            Comment.objects.bulk_create(
                (
                    Comment(
                        article=rng.choices(articles, weights)[0],
                        creator=rng.choice(users),
                        message=f"comment {i}",
                        publish_status="public" if rng.random() < 0.7 else "private",
                        score=rng.randint(0, 5),
                        # more comments on recent days
                        created_on=today
                        - dt.timedelta(days=min(days - 1, int(rng.triangular(0, days, 0)))),
                    )
                    for i in range(sizes["comments"])
                ),
                batch_size=1000,
            )
            Notification.objects.bulk_create(
                (
                    Notification(
                        user=rng.choice(users), message=f"notification {i}", read=rng.random() < 0.5
                    )
                    for i in range(sizes["notifications"])
                ),
                batch_size=1000,
            )
        with psycopg_connection() as conn:
            drained = Counters(conn).drain()
        define_api_quota()
        cache.clear()  # the cached pages of the articles replaced
        if not options["no_admin"]:
            auth_user = get_user_model()
            if not auth_user.objects.filter(username="admin").exists():
                auth_user.objects.create_superuser("admin", "admin@example.com", "admin")
                self.stdout.write("admin login: admin / admin (an example only)")
        self.stdout.write(
            f"{sizes['users']} users, {sizes['articles']} articles, {len(TAGS)} tags, "
            f"{sizes['comments']} "
            f"comments, {sizes['notifications']} notifications; {drained.deltas} counter deltas "
            f"drained; quota {settings.BLOG_API_QUOTA}: {settings.BLOG_API_LIMIT} calls a minute"
        )
