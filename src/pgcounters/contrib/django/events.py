"""Event counters from Django views: page views and the like, counted on commit.

``count_event(name, key)`` sends an increment through the path chosen by the
``PGCOUNTERS_EVENTS`` setting:

* ``"direct"`` (default): an INSERT into the queue inside the current
  transaction (``Counters.incr`` on Django's own connection): it commits or
  rolls back with the request;
* ``"batching"``: the process's :class:`~pgcounters.batching.BatchingCounters`,
  handed the increment by ``transaction.on_commit``;
* ``"redis"``: the process's :class:`~pgcounters.redis_buffer.RedisBuffer`,
  handed the increment by ``transaction.on_commit``.

In every mode a rolled-back transaction counts nothing, and bad input (an
undeclared counter, a wrong key) raises at the call, inside the request.

Settings (all optional):

``PGCOUNTERS_EVENTS``            ``"direct"`` | ``"batching"`` | ``"redis"``
``PGCOUNTERS_BATCHING``          keyword arguments of ``BatchingCounters``
                                 (``max_pending``, ``interval``, ``max_buffered``, ...)
``PGCOUNTERS_REDIS_URL``         the Redis of the buffer (else the environment variable)
``PGCOUNTERS_REDIS_BUFFER``      buffer name (default ``"default"``)
``PGCOUNTERS_REDIS_PREFIX``      Redis key prefix (default ``"pgcounters"``)
``PGCOUNTERS_REDIS_FALLBACK``    ``"raise"`` (default) or ``"database"``

``manage.py pgcounters flush [--worker]`` flushes the buffer these settings name.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from typing import Any, Literal, cast

from django.conf import settings
from django.core.signals import setting_changed
from django.db import transaction

from pgcounters.batching import BatchingCounters
from pgcounters.client import Counters
from pgcounters.contrib.django.db import dsn, psycopg_connection
from pgcounters.contrib.django.errors import SettingsError
from pgcounters.errors import ConfigurationError
from pgcounters.keys import check_delta

EventPath = Literal["direct", "batching", "redis"]
PATHS: tuple[EventPath, ...] = ("direct", "batching", "redis")

_lock = threading.Lock()
_clients: weakref.WeakKeyDictionary[Any, Counters] = weakref.WeakKeyDictionary()
_batchers: dict[str, BatchingCounters] = {}
_buffers: dict[str, Any] = {}  # alias -> RedisBuffer (imported on use: the redis extra)


def event_path() -> EventPath:
    """The configured path, ``PGCOUNTERS_EVENTS``."""
    value = getattr(settings, "PGCOUNTERS_EVENTS", "direct")
    if value not in PATHS:
        raise SettingsError(f"PGCOUNTERS_EVENTS must be one of {', '.join(PATHS)}, got {value!r}")
    return cast(EventPath, value)


def redis_options() -> dict[str, Any]:
    """The Redis buffer's settings: url (None = environment), name, prefix, fallback."""
    fallback = getattr(settings, "PGCOUNTERS_REDIS_FALLBACK", "raise")
    if fallback not in ("raise", "database"):
        raise SettingsError(
            f'PGCOUNTERS_REDIS_FALLBACK must be "raise" or "database", got {fallback!r}'
        )
    return {
        "url": getattr(settings, "PGCOUNTERS_REDIS_URL", None) or None,
        "name": getattr(settings, "PGCOUNTERS_REDIS_BUFFER", "default"),
        "prefix": getattr(settings, "PGCOUNTERS_REDIS_PREFIX", "pgcounters"),
        "fallback": fallback,
    }


def batching_options() -> dict[str, Any]:
    """``PGCOUNTERS_BATCHING``: keyword arguments of ``BatchingCounters`` (its DSN aside)."""
    import inspect

    options = getattr(settings, "PGCOUNTERS_BATCHING", {})
    if not isinstance(options, dict):
        raise SettingsError(f"PGCOUNTERS_BATCHING must be a dict, got {options!r}")
    known = set(inspect.signature(BatchingCounters).parameters) - {"dsn"}
    unknown = sorted(str(k) for k in options if k not in known)
    if unknown:
        raise SettingsError(
            f"PGCOUNTERS_BATCHING: unknown option {', '.join(map(repr, unknown))} "
            f"(options: {', '.join(sorted(known))})"
        )
    return dict(options)


def batcher(using: str = "default") -> BatchingCounters:
    """This process's batching incrementer for the database ``using`` (created on first use)."""
    with _lock:
        found = _batchers.get(using)
        if found is None:
            try:
                found = BatchingCounters(dsn(using), **batching_options())
            except ConfigurationError as exc:
                raise SettingsError(f"PGCOUNTERS_BATCHING: {exc}") from None
            _batchers[using] = found
        return found


def redis_buffer(using: str = "default") -> Any:
    """This process's Redis buffer for the database ``using`` (a ``RedisBuffer``)."""
    from pgcounters.redis_buffer import RedisBuffer

    with _lock:
        found = _buffers.get(using)
        if found is None:
            o = redis_options()
            found = RedisBuffer(
                dsn(using), o["url"], name=o["name"], prefix=o["prefix"], fallback=o["fallback"]
            )
            _buffers[using] = found
        return found


def _client(using: str) -> Counters:
    """A client on Django's own connection (cached per connection: declarations, schema check)."""
    with psycopg_connection(using) as conn:
        found = _clients.get(conn)
        if found is None:
            found = _clients[conn] = Counters(conn)
        return found


def count_event(name: str, key: object = None, delta: int = 1, *, using: str = "default") -> None:
    """Count one event; it counts only if the current transaction commits."""
    check_delta(delta)
    path = event_path()
    if path == "direct":
        _client(using).incr(name, key, delta)
        return
    if path == "batching":
        b = batcher(using)
        k = b.validate(name, key, delta)
        transaction.on_commit(lambda: b.absorb({k: delta}, 1), using=using)
        return
    buf = redis_buffer(using)
    buf.field(name, key)  # validated now, inside the request
    transaction.on_commit(lambda: buf.incr(name, key, delta), using=using)


def event_value(name: str, key: object = None, *, using: str = "default") -> int:
    """The exact value, including what the configured path still buffers."""
    path = event_path()
    if path == "batching":
        return batcher(using).get(name, key)
    if path == "redis":
        return int(redis_buffer(using).get(name, key))
    return _client(using).get(name, key)


def flush_arguments(args: Sequence[str]) -> list[str]:
    """``args`` of ``manage.py pgcounters``, with the buffer settings added to ``flush``."""
    out = list(args)
    if not out or out[0] != "flush":
        return out
    o = redis_options()
    for option, value in (
        ("--redis-url", o["url"]),
        ("--buffer", o["name"]),
        ("--prefix", o["prefix"]),
    ):
        if value and not any(a == option or a.startswith(option + "=") for a in out):
            out += [option, str(value)]
    return out


def reset() -> None:
    """Close this process's buffers (writing what they hold); the next use makes new ones."""
    with _lock:
        batchers, buffers = list(_batchers.values()), list(_buffers.values())
        _batchers.clear()
        _buffers.clear()
    for b in batchers:
        b.close()
    for buf in buffers:
        buf.close()


def _on_setting_changed(setting: str, **kwargs: Any) -> None:
    if setting.startswith("PGCOUNTERS_") or setting == "DATABASES":
        reset()


setting_changed.connect(_on_setting_changed)
