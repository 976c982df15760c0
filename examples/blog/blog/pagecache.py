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
whose counters the batch changed. A batch that changed many keys of a counter (more than
the worker's ``notify_max_keys``) reports that counter without its keys: every page is
made stale at once, by renewing a version all pages share (``article-version:*``).
Another process may do the same from the ``NOTIFY`` the worker sends (``manage.py
blog_listen``). A page is therefore never stale for longer than the batch
that applies the change; ``BLOG_PAGE_CACHE_SECONDS`` bounds it in any case (a worker killed
between its commit and its report reports nothing).

The receivers run in the worker's process: the cache must be shared by the processes
(the example uses the file-based cache; Redis or Memcached in production).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping
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


ALL_PAGES = "article-version:*"
"""The version every page shares: renewed when a counter changed too many keys to list."""


def _version_key(article_id: int) -> str:
    return f"article-version:{article_id}"


def version(article_id: int) -> str:
    """The article's current page version (created on first use): its own and the one
    every page shares."""
    keys = [ALL_PAGES, _version_key(article_id)]
    found = cache.get_many(keys)
    for key in keys:
        if key not in found:
            cache.add(key, uuid.uuid4().hex, timeout=None)
            found[key] = cache.get(key)
    return f"{found[ALL_PAGES]}.{found[_version_key(article_id)]}"


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


def invalidate(article_ids: Iterable[int] | None) -> None:
    """Renew the versions of these articles (None: of every article): their cached pages
    are never served again."""
    if article_ids is None:
        cache.set(ALL_PAGES, uuid.uuid4().hex, timeout=None)
        return
    cache.set_many({_version_key(pk): uuid.uuid4().hex for pk in set(article_ids)}, timeout=None)


def articles_changed(changes: Mapping[str, Iterable[tuple[Any, ...]] | None]) -> set[int] | None:
    """The articles whose page shows a counter the change set names; None for every
    article (a counter shown on the page changed too many keys to list them)."""
    out: set[int] = set()
    for counter, article_of in ARTICLE_COUNTERS.items():
        if counter not in changes:
            continue
        keys = changes[counter]
        if keys is None:
            return None
        out.update(article_of(key) for key in keys)
    return out


def invalidate_changed(sender: Any, changes: Changes, using: str, **kwargs: Any) -> None:
    """The receiver of ``counters_changed``: the pages of the articles the batch changed."""
    changed = articles_changed(changes)
    if changed is None or changed:
        invalidate(changed)


def invalidate_saved(sender: Any, instance: Any, **kwargs: Any) -> None:
    """The receiver of ``post_save`` of an article: its title may have changed."""
    invalidate([instance.pk])
