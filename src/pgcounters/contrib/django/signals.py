"""Django signals of pgcounters.

``counters_changed`` is sent after drain batches commit, by a worker started
from Django (``manage.py pgcounters worker``, or :func:`worker` in your own
process), with the keyword arguments

* ``changes``: counter name -> set of the keys the batch changed (keys as
  :meth:`pgcounters.Counters.get` takes them, e.g. ``(42,)``; a counter
  column's key is its row's primary key);
* ``using``: the database alias the worker drains.

Counters in ``direct`` mode are reported by the same worker, after the transaction that
wrote them commits (:mod:`pgcounters.notifications`).

Connect receivers in ``AppConfig.ready()``: the worker asks the drain for its
changes only when the signal has receivers as it starts. A receiver that
raises is logged (``pgcounters.notifications``) and the others still run; the
worker goes on. Delivery is at least once, batched per drain batch, never per
delta (:mod:`pgcounters.notifications`).
"""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import Signal

from pgcounters.notifications import ChangeCallback, Changes
from pgcounters.worker import Worker, WorkerSettings

logger = logging.getLogger("pgcounters.notifications")

counters_changed = Signal()
"""Sent with ``changes`` and ``using`` after a drain batch that changed counters commits."""


def send_counters_changed(changes: Changes, *, using: str = "default") -> None:
    """Send :data:`counters_changed` (sender: :class:`~pgcounters.Worker`); each receiver
    that raises is logged."""
    for receiver, result in counters_changed.send_robust(Worker, changes=changes, using=using):
        if isinstance(result, Exception):
            logger.error("a receiver of counters_changed failed: %r", receiver, exc_info=result)


def signal_callback(using: str = "default") -> ChangeCallback | None:
    """The worker's ``on_change`` that sends :data:`counters_changed`; None when the
    signal has no receivers (the drain then does not look for its changes)."""
    if not counters_changed.has_listeners(Worker):
        return None

    def send(changes: Changes) -> None:
        send_counters_changed(changes, using=using)

    return send


def worker(using: str = "default", settings: WorkerSettings | None = None, **kwargs: Any) -> Worker:
    """A :class:`~pgcounters.Worker` on a Django database that sends
    :data:`counters_changed` after each batch that changed counters."""
    from pgcounters.contrib.django.db import dsn

    return Worker(dsn(using), settings, on_change=signal_callback(using), **kwargs)
