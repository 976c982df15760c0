from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate, post_save


class BlogConfig(AppConfig):
    name = "blog"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from blog import pagecache
        from blog.models import Article
        from pgcounters.contrib.django import counters_changed

        post_migrate.connect(define_api_quota, sender=self)
        # the article page's cache: fresh after each worker batch that changed its counters
        counters_changed.connect(pagecache.invalidate_changed, dispatch_uid="blog-article-pages")
        post_save.connect(pagecache.invalidate_saved, sender=Article, dispatch_uid="blog-article")


def define_api_quota(using: str = "default", **kwargs: Any) -> None:
    """After migrate: the quota of the rate-limited API view (idempotent)."""
    from django.conf import settings

    from pgcounters import Quotas
    from pgcounters.contrib.django import psycopg_connection

    with psycopg_connection(using) as conn:
        Quotas(conn).define_quota(settings.BLOG_API_QUOTA, settings.BLOG_API_LIMIT, window="minute")
