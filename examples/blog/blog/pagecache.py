"""The article page in Django's cache, made fresh by the counters' change notifications.

A page is cached under a *version* of its article: ``article-page:<id>:<version>``. The
version is a random token kept under ``article-version:<id>``; invalidating an article
writes a new token, so every page rendered before is never served again.

Why a version rather than deleting the page: a request that read the counters before a
batch committed may store its page *after* the worker invalidated it. Deleting would keep
that stale page until its timeout; with versions, the request read the version before the
counters, so it stores the stale page under the old version, which nobody reads any more.

Invalidation comes from the counters: :func:`invalidate_changed` receives
``counters_changed`` (sent by ``manage.py pgcounters worker``, or by the worker ``runserver``
runs in a thread) after each drain batch commits, and renews the version of every article
whose counters the batch changed. A page is therefore never stale for longer than the batch
that applies the change; ``BLOG_PAGE_CACHE_SECONDS`` bounds it in any case (a worker killed
between its commit and its report reports nothing).

The receivers run in the worker's process: the cache must be shared by the processes
(the example uses the file-based cache; Redis or Memcached in production).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from typing import Any

from django.conf import settings
from django.core.cache import cache

from pgcounters.notifications import Changes

# the counters shown on the article page, and how each key names its article
ARTICLE_COUNTERS: dict[str, Callable[[tuple[Any, ...]], int]] = {
    "blog.article.public_comments": lambda key: int(key[0]),
    "blog.article.public_score": lambda key: int(key[0]),
    "blog.article.tag_count": lambda key: int(key[0]),
    "blog.article.comments_per_day": lambda key: int(key[0]),  # (article, day)
}


def _version_key(article_id: int) -> str:
    return f"article-version:{article_id}"


def version(article_id: int) -> str:
    """The article's current page version (created on first use)."""
    key = _version_key(article_id)
    found = cache.get(key)
    if found is None:
        cache.add(key, uuid.uuid4().hex, timeout=None)
        found = cache.get(key)
    return str(found)


def page_key(article_id: int, current: str) -> str:
    return f"article-page:{article_id}:{current}"


def cached_page(article_id: int, render: Callable[[], str]) -> tuple[str, bool]:
    """The article's page from the cache, or rendered and stored; True when it was cached.

    The version is read before ``render`` reads the database (see the module's notes)."""
    key = page_key(article_id, version(article_id))
    page = cache.get(key)
    if isinstance(page, str):
        return page, True
    page = render()
    cache.set(key, page, timeout=settings.BLOG_PAGE_CACHE_SECONDS)
    return page, False


def invalidate(article_ids: Iterable[int]) -> None:
    """Renew the versions of these articles: their cached pages are never served again."""
    cache.set_many({_version_key(pk): uuid.uuid4().hex for pk in set(article_ids)}, timeout=None)


def articles_changed(changes: Changes) -> set[int]:
    """The articles whose page shows a counter the change set names."""
    out: set[int] = set()
    for counter, article_of in ARTICLE_COUNTERS.items():
        out.update(article_of(key) for key in changes.get(counter, ()))
    return out


def invalidate_changed(sender: Any, changes: Changes, using: str, **kwargs: Any) -> None:
    """The receiver of ``counters_changed``: the pages of the articles the batch changed."""
    changed = articles_changed(changes)
    if changed:
        invalidate(changed)


def invalidate_saved(sender: Any, instance: Any, **kwargs: Any) -> None:
    """The receiver of ``post_save`` of an article: its title may have changed."""
    invalidate([instance.pk])
