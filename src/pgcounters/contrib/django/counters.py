"""Named counters from Django code: read, rank and increment on Django's own connection.

``register_counter`` returns a :class:`~pgcounters.contrib.django.declarations.NamedCounter`
whose methods call these; both run on the psycopg connection behind a Django
database alias, so they join the current ``transaction.atomic()`` block (an
increment rolled back with it is gone) and need no connection of their own::

    posts_per_user = register_counter("blog.posts.per_user", Post, keys=("author",))

    posts_per_user.get(request.user)        # exact: stored + pending
    posts_per_user.get_many([u1, u2])       # one statement
    posts_per_user.top(10)                  # [((user_id,), n), ...] by stored value
    posts_per_user.incr(request.user, 2)    # by hand (declared counters count rows by themselves)

In an async view, ``aget``, ``aget_many``, ``atop`` and ``aincr`` are awaited: as
Django's own async ORM methods do, they run the call in the thread that holds
Django's connection (``sync_to_async``, thread-sensitive), so they see and join
the same connection and transaction as the ORM calls of the request::

    value = await posts_per_user.aget(request.user)

A key is what the counter is keyed by: a model instance (its primary key is
used), a value, a tuple for a composite key, nothing for a global counter.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable

from asgiref.sync import sync_to_async
from django.db import models

from pgcounters.client import Counters
from pgcounters.connection import Conn
from pgcounters.contrib.django.db import raw_connection
from pgcounters.keys import Key

_clients: weakref.WeakKeyDictionary[Conn, Counters] = weakref.WeakKeyDictionary()


def client(using: str = "default") -> Counters:
    """The :class:`~pgcounters.Counters` of Django's connection ``using`` (made once per
    underlying connection: its schema check and counter lookups are cached)."""
    raw = raw_connection(using)
    found = _clients.get(raw)
    if found is None:
        found = _clients[raw] = Counters(raw)
    return found


def key_of(key: object) -> object:
    """A counter key from Django values: model instances become their primary key."""
    if isinstance(key, models.Model):
        return key.pk
    if isinstance(key, tuple):
        return tuple(part.pk if isinstance(part, models.Model) else part for part in key)
    return key


def get(name: str, key: object = None, *, exact: bool = True, using: str = "default") -> int:
    """The value of a named counter (exact: stored + pending, in one statement)."""
    return client(using).get(name, key_of(key), exact=exact)


def get_many(
    name: str, keys: Iterable[object], *, exact: bool = True, using: str = "default"
) -> list[int]:
    """The values of a named counter for many keys, in the order given."""
    return client(using).get_many(name, [key_of(k) for k in keys], exact=exact)


def top(name: str, n: int = 10, *, using: str = "default") -> list[tuple[Key, int]]:
    """The ``n`` keys with the highest stored values (an index scan; drain for fresh ranks)."""
    return client(using).top(name, n)


def incr(name: str, key: object = None, delta: int = 1, *, using: str = "default") -> int | None:
    """Add ``delta`` to a named counter, in the current transaction."""
    return client(using).incr(name, key_of(key), delta)


async def aget(name: str, key: object = None, *, exact: bool = True, using: str = "default") -> int:
    """:func:`get` from async code, on Django's connection (see the module's docstring)."""
    return await sync_to_async(get, thread_sensitive=True)(name, key, exact=exact, using=using)


async def aget_many(
    name: str, keys: Iterable[object], *, exact: bool = True, using: str = "default"
) -> list[int]:
    """:func:`get_many` from async code, on Django's connection."""
    keys = list(keys)  # an iterable of the caller's, consumed here, not in the other thread
    return await sync_to_async(get_many, thread_sensitive=True)(
        name, keys, exact=exact, using=using
    )


async def atop(name: str, n: int = 10, *, using: str = "default") -> list[tuple[Key, int]]:
    """:func:`top` from async code, on Django's connection."""
    return await sync_to_async(top, thread_sensitive=True)(name, n, using=using)


async def aincr(
    name: str, key: object = None, delta: int = 1, *, using: str = "default"
) -> int | None:
    """:func:`incr` from async code, on Django's connection (in its current transaction)."""
    return await sync_to_async(incr, thread_sensitive=True)(name, key, delta, using=using)
