"""The long-running drainer: ``pgcounters worker`` and the :class:`Worker` API.

A worker applies queued deltas batch after batch (one transaction per batch,
:meth:`pgcounters.Counters.drain_batch`), then waits when the queues are empty:

* **polling with backoff**: after an empty round it waits ``min_interval``,
  doubling up to ``max_interval`` while the queues stay empty; a round that
  filled a batch is followed by the next at once; a round that found fewer
  deltas waits ``linger`` first (so that the next batch gathers the deltas of
  that time instead of a few each: the trade between lag and the worker's
  cost), and brings the wait back to ``min_interval``. Each round first looks
  which queues hold deltas and drains only those;
* **wake-ups (opt-in)**: with ``listen=True`` it also LISTENs on the channel
  the wake-up triggers notify (``pgcounters wakeup on``), at most once per
  interval, never once per delta, and wakes at once. Polling stays on, so a
  lost notification only costs latency.

Any number of workers may run at once: the drain hands each delta to one
transaction. :meth:`Worker.stop` (SIGTERM or SIGINT in the CLI) lets the
current batch commit and returns; the CLI makes a second signal interrupt at
once (the open batch rolls back, nothing is lost). A lost connection (server
restart, network) is re-opened with exponential backoff; the first
connection is not retried, so a wrong DSN or a database without the schema
fails at once with a clear message.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import psycopg
from psycopg import errors as pg

from pgcounters import backfill, horizon, notifications, schema
from pgcounters.client import (
    INT_MAX,
    MAX_BATCH_SIZE,
    BatchResult,
    Counters,
    batch_for,
    batches_after_refusal,
    record_retry,
    retry_reason,
)
from pgcounters.config import connect, redact
from pgcounters.connection import Conn
from pgcounters.dberrors import translated
from pgcounters.errors import (
    ConfigurationError,
    ConnectionFailed,
    PermissionDenied,
    PgCountersError,
    SchemaError,
    WorkerError,
)
from pgcounters.notifications import MAX_KEYS, ChangeCallback, Notifier
from pgcounters.sqlfiles import named

logger = logging.getLogger("pgcounters.worker")

APPLICATION_NAME = "pgcounters worker"
"""The ``application_name`` of worker connections (``pgcounters status`` counts them)."""

MIN_BATCH_SIZE = 100

# what PostgreSQL aborts and a new attempt of the batch may get through
_ABORTED = (pg.DeadlockDetected, pg.SerializationFailure, pg.LockNotAvailable, pg.QueryCanceled)

# errors that retrying cannot fix: the worker stops with WorkerError
_FATAL = (pg.InsufficientPrivilege, pg.InvalidAuthorizationSpecification, pg.ReadOnlySqlTransaction)


def _ops(name: str) -> str:
    return named("operations.sql")[name]


@dataclass(frozen=True)
class WorkerSettings:
    """How a worker drains, waits and reconnects. Times are in seconds."""

    batch_size: int = 10_000
    """Deltas per batch (one transaction) while the worker keeps up."""
    max_batch_size: int = MAX_BATCH_SIZE
    """Deltas of a batch at most when a queue holds more than ``batch_size``: a backlog is
    applied in one larger batch, each key written once for all its deltas (several times
    faster over many keys), in a longer transaction that holds the rows it changes (the
    parent rows of counter columns too) until it commits. ``batch_size`` or less: every
    batch is of ``batch_size``."""
    batch_seconds: float = 0.5
    """How long a batch larger than ``batch_size`` is sized to take, from the rate of the
    batches before it: a backlog is taken in batches of about this long (the rows a batch
    changes stay locked until it commits, and a stopping worker waits for its batch),
    growing at most 4x from one batch to the next. 0: no bound but ``max_batch_size``."""
    min_interval: float = 0.05
    """Wait after a round that found some deltas; the first wait when idle."""
    max_interval: float = 2.0
    """Longest wait while the queues stay empty."""
    linger: float = 0.02
    """Wait after a round that found deltas but filled no batch: deltas arriving meanwhile
    are applied together, in fewer, larger batches. Adds up to this much lag; 0 drains
    again at once (the least lag, and a batch, a transaction, for every few deltas)."""
    listen: bool = False
    """Also wake on the wake-up notifications (``pgcounters wakeup on``)."""
    statement_timeout: float = 60.0
    """``statement_timeout`` of the worker's session (0 = none)."""
    idle_in_transaction_timeout: float = 60.0
    """``idle_in_transaction_session_timeout`` of the worker's session (0 = none)."""
    reconnect_min: float = 0.5
    """First wait before reconnecting; doubles up to ``reconnect_max``."""
    reconnect_max: float = 30.0
    """Longest wait between reconnection attempts."""
    connect_timeout: float = 10.0
    """Give up one connection attempt after this long."""
    log_every: float = 60.0
    """Log a summary line this often while deltas are applied (0 = never)."""
    notify: bool = False
    """Send the keys each batch changed to other processes: a ``NOTIFY`` on the channel
    ``pgcounters_changes`` (:mod:`pgcounters.notifications`)."""
    notify_interval: float = 1.0
    """With ``notify``: at most one notification this often (the changes of the batches
    between are sent together); 0 = one after every batch that changed something."""
    notify_max_keys: int = MAX_KEYS
    """The most keys of one counter a report lists (the callback, the Django signal, the
    ``NOTIFY``): a counter of more changed keys is reported without them, as "many keys"
    (None in Python, ``"*"`` in a notification): a cache drops all of that counter. A
    batch's keys beyond it are not decoded, nor serialised."""
    horizon_warning: float = horizon.HORIZON_WARNING
    """Log a WARNING when a snapshot has kept VACUUM from removing row versions this long
    (a ``pg_dump``, a report, a session idle in a transaction), naming what holds it; looked
    at every 10 seconds (0 = never)."""
    application_name: str = APPLICATION_NAME

    def validate(self) -> WorkerSettings:
        """Raise :class:`ConfigurationError` for a setting out of range; return self."""

        def positive(name: str, value: object, *, allow_zero: bool = False) -> None:
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            if not ok or value < 0 or (value == 0 and not allow_zero):  # type: ignore[operator]
                kind = "a non-negative" if allow_zero else "a positive"
                raise ConfigurationError(f"{name} must be {kind} number, got {value!r}")

        for name in ("batch_size", "max_batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= INT_MAX:
                raise ConfigurationError(
                    f"{name} must be a positive integer of at most {INT_MAX}, got {value!r}"
                )
        for name in ("min_interval", "max_interval", "reconnect_min", "reconnect_max"):
            positive(name, getattr(self, name))
        for name in (
            "statement_timeout",
            "idle_in_transaction_timeout",
            "log_every",
            "linger",
            "notify_interval",
            "horizon_warning",
            "batch_seconds",
        ):
            positive(name, getattr(self, name), allow_zero=True)
        positive("connect_timeout", self.connect_timeout)
        if (
            isinstance(self.notify_max_keys, bool)
            or not isinstance(self.notify_max_keys, int)
            or self.notify_max_keys < 0
        ):
            raise ConfigurationError(
                f"notify_max_keys must be a non-negative integer, got {self.notify_max_keys!r}"
            )
        if self.max_interval < self.min_interval:
            raise ConfigurationError(
                f"max_interval ({self.max_interval}) is below min_interval ({self.min_interval})"
            )
        if self.reconnect_max < self.reconnect_min:
            raise ConfigurationError(
                f"reconnect_max ({self.reconnect_max}) is below reconnect_min "
                f"({self.reconnect_min})"
            )
        return self


@dataclass
class WorkerStats:
    """What a worker has done since it started (a snapshot: see :meth:`Worker.get_stats`)."""

    batches: int = 0
    deltas: int = 0
    keys: int = 0
    rounds: int = 0
    wakeups: int = 0
    reconnects: int = 0
    errors: int = 0
    quarantined: int = 0
    """Deltas set aside because they could not be applied."""
    busy: int = 0
    """Times a queued delta was left for later because its parent row was busy."""
    batch_size: int = 0
    notifications: int = 0
    """Change notifications sent (``notify``)."""
    started_at: float = field(default_factory=time.time)
    last_batch_at: float | None = None


RETENTION_EVERY = 60.0
"""Seconds between two deletions of values of periods no longer kept (counters per period)."""
RETENTION_LIMIT = 10_000
"""The most values one deletion takes (a call that takes as many is followed by another)."""
TARGET_IDS_EVERY = 10.0
"""Seconds between two refreshes of the ids listed for the counters' triggers (a counter
created by its first write is listed at the next one)."""
GROWTH = 4
"""A batch sized by time is at most this many times the one before it (and the first one
over a backlog this many times ``batch_size``)."""
STOP_TAKES = 100
"""A stopping worker reports the direct-mode changes committed so far in at most this many
takes of a batch each."""


def _millis(seconds: float) -> str:
    return f"{round(seconds * 1000)}ms"


class Worker:
    """Drain the queues until :meth:`stop` is called.

    ``Worker(dsn).run()`` blocks; run it in a thread to drain in the
    background of another program, and call :meth:`stop` to end it after
    the current batch::

        worker = Worker(dsn, WorkerSettings(listen=True))
        thread = threading.Thread(target=worker.run)
        thread.start()
        ...
        worker.stop()
        thread.join()

    ``on_change(changes)`` is called after each batch that changed something commits,
    with a mapping counter name -> set of keys (:mod:`pgcounters.notifications`).
    """

    def __init__(
        self,
        dsn: str,
        settings: WorkerSettings | None = None,
        *,
        on_change: ChangeCallback | None = None,
    ) -> None:
        self.dsn = dsn
        self.settings = (settings or WorkerSettings()).validate()
        if on_change is not None and not callable(on_change):
            raise ConfigurationError(f"on_change must be callable, got {on_change!r}")
        self._notifier = Notifier(
            on_change,
            notify=self.settings.notify,
            interval=self.settings.notify_interval,
            max_keys=self.settings.notify_max_keys,
        )
        self._stop = threading.Event()
        self._lock = threading.Lock()
        # changes of direct-mode counters too (off when the role may not take them)
        self._report_direct = True
        self._stats = WorkerStats(batch_size=self.settings.batch_size)
        self._batch_size = self.settings.batch_size
        # the most deltas of a batch of a queue holding more (halved by a statement timeout)
        self._batch_cap = max(self.settings.batch_size, self.settings.max_batch_size)
        self._last_size = self._batch_size
        # per queue: deltas a second of the last batch larger than batch_size, and its size
        self._rate: list[float | None] = [None, None]
        self._sized = [self._batch_size, self._batch_size]
        # batches of batch_size still to take from each queue after a large one was refused
        self._small = [0, 0]
        self._halved = False  # the last failed round halved the largest batch
        self._backfills = True  # off once the role turns out unable to run them
        # counters whose backfill this role may not run (it may not read their tables)
        self._backfills_refused: dict[str, PermissionDenied] = {}
        self._listening = False
        self._summary = (time.monotonic(), 0, 0)
        # no backfill was pending when last looked: rounds that apply deltas look again
        # after this (monotonic) time, idle rounds always
        self._no_backfill_until = 0.0
        # the last round applied queued deltas without filling a batch, and ran no backfill
        # batch: the next waits the linger (a backfill goes on at once)
        self._trickle = False
        # when (monotonic) the retention of counters per period runs next; off once the
        # role turns out unable to run it
        self._retention_at = 0.0
        self._retention = True
        # when (monotonic) the ids listed for the counters' triggers are refreshed next
        self._target_ids_at = 0.0
        self._horizon = horizon.HorizonWatch(self.settings.horizon_warning)
        # this worker registered as a reporting one before (a registration after that is
        # one after a lost connection)
        self._registered_before = False

    # -- public -------------------------------------------------------------

    def stop(self) -> None:
        """Ask the worker to return from :meth:`run` after the current batch.

        Safe to call from a signal handler or another thread, and before
        :meth:`run` (which then returns at once).
        """
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def reports_changes(self) -> bool:
        """Whether the batches report their changes (a callback, or ``notify``)."""
        return self._notifier.active

    def get_stats(self) -> WorkerStats:
        """A copy of the counts so far."""
        with self._lock:
            return replace(self._stats)

    def run(self) -> WorkerStats:
        """Drain until stopped. Returns the final counts.

        Raises :class:`ConnectionFailed` when the first connection fails,
        :class:`SchemaError` when the schema is missing or of another version
        (also after a reconnection), and :class:`WorkerError` for errors that
        retrying cannot fix (e.g. missing privileges).
        """
        s = self.settings
        logger.info(
            "worker starting: %s, batches of %d (a backlog: up to %d), polling every %gs-%gs%s",
            redact(self.dsn), s.batch_size, max(s.batch_size, s.max_batch_size),
            s.min_interval, s.max_interval,
            ", woken by notifications" if s.listen else "",
        )  # fmt: skip
        conn: Conn | None = self._open()
        interval = s.min_interval
        try:
            while not self._stop.is_set():
                if conn is None:
                    conn = self._reconnect()
                    if conn is None:
                        break
                    interval = s.min_interval
                try:
                    got, full, busy = self._round(conn)
                except psycopg.Error as exc:
                    conn = self._failed(conn, exc)
                    if conn is not None and not self._stop.is_set():
                        self._wait(conn, self._retry_wait())
                    continue
                except SchemaError:
                    raise
                except PgCountersError as exc:
                    # e.g. a batch whose sum overflows a counter: it stays queued
                    self._count_error()
                    logger.error("draining failed, retrying in %gs: %s", s.max_interval, exc)
                    self._wait(conn, s.max_interval)
                    continue
                wait, notified, interval = self._pace(got, full, busy, interval)
                if wait and notified:
                    self._wait(conn, wait)
                elif wait:
                    self._stop.wait(wait)
        finally:
            if conn is not None:
                self._flush_notifications(conn)
                conn.close()
            final = self.get_stats()
            logger.info(
                "worker stopped: %d deltas applied in %d batches, %d reconnections",
                final.deltas, final.batches, final.reconnects,
            )  # fmt: skip
        return self.get_stats()

    # -- connection ---------------------------------------------------------

    def _open(self) -> Conn:
        """Connect, configure the session, check the schema, LISTEN if asked."""
        s = self.settings
        conn = connect(
            self.dsn,
            application_name=s.application_name,
            connect_timeout=max(1, round(s.connect_timeout)),
            keepalives=1,
            keepalives_idle=30,
            keepalives_interval=10,
            keepalives_count=3,
        )
        try:
            self._setup(conn)
        except psycopg.OperationalError as exc:
            conn.close()
            raise ConnectionFailed(
                f"lost the connection to {redact(self.dsn)!r} while setting it up: {exc}"
            ) from exc
        except psycopg.Error as exc:
            conn.close()
            raise WorkerError(f"could not set up the worker's session: {exc}") from exc
        except BaseException:
            conn.close()
            raise
        return conn

    def _setup(self, conn: Conn) -> None:
        s = self.settings
        conn.execute(
            _ops("worker_session"),
            {
                "statement_timeout": _millis(s.statement_timeout),
                "idle_timeout": _millis(s.idle_in_transaction_timeout),
            },
        )
        schema.check(conn)
        if self._notifier.active and self._report_direct:
            # direct-mode counters note their changes while a reporting worker is registered
            try:
                registered = notifications.listen_direct(conn)
                if registered == 1 and self._registered_before:
                    # registered again after a lost connection, and no other reporting
                    # worker was: direct writes meanwhile noted nothing, so every direct
                    # counter is reported as changed, its keys not listed
                    names = notifications.direct_counters(conn)
                    if names:
                        self._notifier.committed(conn, dict.fromkeys(names))
                self._registered_before = True
            except pg.ReadOnlySqlTransaction:
                self._report_direct = False  # a hot standby: its first drain says so
            except pg.InsufficientPrivilege as exc:
                self._report_direct = False
                logger.warning(
                    "changes of direct-mode counters are not reported: %s "
                    "(`pgcounters grant --worker ROLE` gives the right)",
                    str(exc).strip(),
                )
        else:
            forget_dead_listeners(conn)
        self._listening = False
        if s.listen:
            conn.execute(_ops("listen"))
            self._listening = True
            if conn.execute(_ops("wakeup_interval")).fetchone() == (None,):
                logger.warning(
                    "listening, but the wake-up triggers are not installed "
                    "(`pgcounters wakeup on`): polling only"
                )

    def _reconnect(self) -> Conn | None:
        """Reconnect with exponential backoff until it works or the worker is stopped."""
        s = self.settings
        delay = s.reconnect_min
        attempt = 0
        while not self._stop.wait(delay * random.uniform(0.8, 1.2)):
            attempt += 1
            try:
                conn = self._open()
            except (ConnectionFailed, psycopg.OperationalError) as exc:
                logger.warning("reconnection attempt %d failed: %s", attempt, exc)
                delay = min(delay * 2, s.reconnect_max)
                continue
            with self._lock:
                self._stats.reconnects += 1
            logger.info("reconnected after %d attempt(s)", attempt)
            return conn
        return None

    def _pace(self, got: int, full: bool, busy: bool, interval: float) -> tuple[float, bool, float]:
        """After a round: (seconds to wait now, 0 for none; whether a wake-up notification
        ends that wait early; the next idle interval)."""
        s = self.settings
        if got or full:
            # deltas found: go on, at once after a full batch. A batch may be short
            # while more are queued (the range claim skips ids of rolled-back
            # inserts and of rows other drainers took), so no round waits more than
            # the linger before looking again (a linger is not cut short by the
            # notifications of the deltas it waits for).
            if not full and s.linger and self._trickle:
                return s.linger, False, s.min_interval
            return 0.0, False, s.min_interval
        # deltas left for rows other transactions hold: look again soon (a
        # batch of them costs a few rows), so they follow the row's release
        return interval, True, s.min_interval if busy else min(interval * 2, s.max_interval)

    def _failed(self, conn: Conn, exc: psycopg.Error) -> Conn | None:
        """Handle a driver error of a round; return the connection to go on with, or None."""
        lost = conn.broken or conn.closed
        reason = self._judge_failure(exc, lost=lost)
        if lost:
            conn.close()
            return None
        if reason is not None:
            record_retry(conn, "drain", reason)
        return conn

    def _judge_failure(self, exc: psycopg.Error, *, lost: bool) -> str | None:
        """Count, log and classify a driver error of a round: raise WorkerError if retrying
        cannot fix it; return the reason of an aborted batch to record as a retry."""
        self._count_error()
        if isinstance(exc, _FATAL):
            raise WorkerError(f"the worker cannot drain: {exc}") from exc
        if lost:
            logger.warning("lost the connection to PostgreSQL: %s", str(exc).strip() or exc)
            return None
        if isinstance(exc, _ABORTED):
            # PostgreSQL aborted the batch (nothing of it was applied): a retry, counted for
            # `status` and Prometheus like recount's and verify's
            reason = retry_reason(exc)
            if isinstance(exc, pg.QueryCanceled) and self._last_size > MIN_BATCH_SIZE:
                # the batch that took too long, halved: the most of any batch from now on,
                # the next one soon
                self._halved = True
                self._batch_cap = max(MIN_BATCH_SIZE, self._last_size // 2)
                self._batch_size = min(self._batch_size, self._batch_cap)
                with self._lock:
                    self._stats.batch_size = self._batch_size
                logger.warning(
                    "a drain batch was aborted (%s) and is retried; batches are now of at "
                    "most %d deltas",
                    reason,
                    self._batch_cap,
                )
            else:
                logger.warning("a drain batch was aborted (%s) and is retried", reason)
            return reason
        logger.error("draining failed, retrying: %s", str(exc).strip() or exc)
        return None

    def _retry_wait(self) -> float:
        """The wait after a failed round: the shortest after a batch halved by a statement
        timeout (a large batch's backlog is still there), else the longest."""
        halved, self._halved = self._halved, False
        return self.settings.min_interval if halved else self.settings.max_interval

    def _count_error(self) -> None:
        with self._lock:
            self._stats.errors += 1

    # -- draining -----------------------------------------------------------

    def _round(self, conn: Conn) -> tuple[int, bool, bool]:
        """One batch from each queue. Returns (deltas applied, whether a batch was full,
        whether deltas were left queued because their parent rows were busy)."""
        pc = Counters(conn, check_schema=False)
        got = 0
        full = False
        busy = False
        try:
            spans = conn.execute(_ops("queue_spans")).fetchone() or (1, 1)
        except (pg.FeatureNotSupported, pg.ObjectNotInPrerequisiteState):
            # a standby cannot read an unlogged table: the drain says what is wrong
            spans = (1, 1)
        for unlogged in (False, True):
            if self._stop.is_set():
                break
            if not spans[unlogged]:
                continue
            size = self._size_for(int(spans[unlogged]), unlogged)
            started = time.monotonic()
            batch = pc._run(
                pc._drain_queue_batch(
                    size,
                    unlogged,
                    self._notifier.active,
                    one_statement=True,
                    max_keys=self.settings.notify_max_keys,
                    careful_limit=self._batch_size,
                )
            )
            if batch.changes:
                self._notifier.committed(conn, batch.changes)
            batch_got, batch_full, batch_busy = self._note_batch(
                batch, unlogged, size, time.monotonic() - started
            )
            got += batch_got
            full = full or batch_full
            busy = busy or batch_busy
        if self._notifier.active and self._report_direct and not self._stop.is_set():
            # what direct-mode counters changed in transactions committed since; a full
            # take is a full round (the next one at once), as a full drain batch
            direct, taken = notifications.take_direct_batch(
                conn, self._batch_size, self.settings.notify_max_keys
            )
            if direct:
                self._notifier.committed(conn, direct)
            full = full or taken >= self._batch_size
        self._trickle = got > 0
        now = time.monotonic()
        if (
            not full
            and not self._stop.is_set()
            and self._backfills
            and (not got or now >= self._no_backfill_until)
        ):
            # the queues are drained: one batch of a pending backfill, if any (while deltas
            # keep coming, looking for none costs a statement a round: once a second)
            try:
                known = len(self._backfills_refused)
                stepped = backfill.step(
                    conn, min(self._batch_size, 1000), refused=self._backfills_refused
                )
                for name, refusal in list(self._backfills_refused.items())[known:]:
                    # that counter only: the others' backfills go on
                    logger.warning(
                        "backfill of %s left to others: %s",
                        name,
                        refusal,
                    )
                got += stepped
                self._trickle = self._trickle and not stepped
                self._no_backfill_until = now + 1.0 if not stepped else 0.0
            except PermissionDenied as exc:
                # the role may not run backfills at all
                self._backfills = False
                logger.warning("backfills left to others: %s", exc)
        if self._retention_due(full):
            try:
                self._retention_done(pc.drop_expired_buckets(RETENTION_LIMIT))
            except PermissionDenied as exc:
                self._retention_refused(exc)
            except (PgCountersError, psycopg.Error) as exc:
                if conn.broken or conn.closed or isinstance(exc, SchemaError):
                    raise
                self._retention_failed(exc)
        if self._target_ids_due(full):
            try:
                conn.execute(_ops("refresh_target_ids"))
            except psycopg.Error as exc:
                if conn.broken or conn.closed:
                    raise
                self._target_ids_failed(exc)
        if self._horizon.due():
            try:
                self._horizon_seen(horizon.holders(conn))
            except psycopg.Error as exc:
                if conn.broken or conn.closed:
                    raise
                self._horizon_failed(exc)
        if self._notifier.notify:
            self._notifier.flush(conn)  # changes held back by the rate limit, once due
        self._end_round()
        return got, full, busy

    def _target_ids_due(self, full: bool) -> bool:
        """Whether this round refreshes the ids listed for the counters' triggers: once
        every ``TARGET_IDS_EVERY`` seconds, between full batches. Taking the next time now
        means a failed refresh is tried again then, as a done one."""
        now = time.monotonic()
        if full or self._stop.is_set() or now < self._target_ids_at:
            return False
        self._target_ids_at = now + TARGET_IDS_EVERY
        return True

    def _target_ids_failed(self, exc: Exception) -> None:
        """A refresh failed (a standby, a statement timeout...): the triggers of counters
        not listed look their ids up, as before; the drain goes on."""
        logger.warning(
            "refreshing the counters' ids for their triggers failed, retrying in %gs: %s",
            TARGET_IDS_EVERY, str(exc).strip() or exc,
        )  # fmt: skip

    def _horizon_seen(self, found: tuple[horizon.HorizonHolder, ...]) -> None:
        for level, message in self._horizon.seen(found):
            logger.log(level, message)

    def _horizon_failed(self, exc: Exception) -> None:
        """A look at the horizon failed (a statement timeout...): tried again at the next
        look; the drain goes on."""
        logger.warning("looking at the oldest snapshot failed: %s", str(exc).strip() or exc)

    def _retention_due(self, full: bool) -> bool:
        """Whether this round deletes values of periods no longer kept: once every
        ``RETENTION_EVERY`` seconds, between full batches (and at once again while a
        call finds a whole ``RETENTION_LIMIT`` of them)."""
        return (
            self._retention
            and not full
            and not self._stop.is_set()
            and time.monotonic() >= self._retention_at
        )

    def _retention_done(self, deleted: int) -> None:
        if deleted:
            logger.info("deleted %d values of periods no longer kept", deleted)
        more = deleted >= RETENTION_LIMIT
        self._retention_at = time.monotonic() + (0.0 if more else RETENTION_EVERY)

    def _retention_failed(self, exc: Exception) -> None:
        """A retention call failed (a lock timeout, a dropped table...): logged, tried again
        ``RETENTION_EVERY`` seconds later; the drain goes on."""
        self._retention_at = time.monotonic() + RETENTION_EVERY
        logger.warning(
            "deleting values of periods no longer kept failed, retrying in %gs: %s",
            RETENTION_EVERY, str(exc).strip() or exc,
        )  # fmt: skip

    def _retention_refused(self, exc: Exception) -> None:
        self._retention = False
        logger.warning("retention of counters per period left to others: %s", exc)

    def _size_for(self, queued: int, unlogged: bool) -> int:
        """The size of the next batch of a queue holding about ``queued`` deltas."""
        if self._small[unlogged]:
            self._small[unlogged] -= 1
            self._last_size = self._batch_size
        else:
            self._last_size = batch_for(queued, self._batch_size, self._time_cap(unlogged))
        return self._last_size

    def _time_cap(self, unlogged: bool) -> int:
        """The most deltas of the next batch of a queue: ``max_batch_size``, bounded by what
        ``batch_seconds`` allows at the rate of the last large batch, and by ``GROWTH``
        times the size of that batch (a first large batch: ``GROWTH`` times ``batch_size``)."""
        seconds = self.settings.batch_seconds
        if not seconds:
            return self._batch_cap
        cap = GROWTH * self._sized[unlogged]
        rate = self._rate[unlogged]
        if rate is not None:
            cap = min(cap, int(rate * seconds))
        return max(self._batch_size, min(self._batch_cap, cap))

    def _timed_batch(self, unlogged: bool, size: int, deltas: int, seconds: float) -> None:
        """Note how long a batch of ``deltas`` took (of at most ``size``): the rate of the
        batches larger than ``batch_size`` sizes the next ones."""
        if size <= self._batch_size or deltas <= self._batch_size or seconds <= 0:
            return
        self._rate[unlogged] = deltas / seconds
        self._sized[unlogged] = deltas

    def _note_batch(
        self, batch: BatchResult, unlogged: bool, size: int, seconds: float
    ) -> tuple[int, bool, bool]:
        """Count and log one drain batch of at most ``size`` deltas that took ``seconds``:
        (deltas it settled, whether it was full, whether it left deltas busy)."""
        deltas = batch.deltas + batch.quarantined
        self._timed_batch(unlogged, size, deltas + batch.busy, seconds)
        if batch.refused:
            # a large batch held a delta that cannot be applied: the part of the queue it
            # covered in batches of batch_size (this result is the first of them)
            size = self._batch_size
            self._small[unlogged] = batches_after_refusal(batch.refused, size)
        # deltas left busy with more queued ahead of them: go on at once; busy deltas
        # with nothing ahead are no reason to (a full batch of them, taken again and
        # again while an application holds their rows, kept the worker spinning)
        got = deltas + (batch.busy if batch.ahead else 0)
        full = got >= size
        busy = False
        queue = "unlogged" if unlogged else "logged"
        if deltas:
            with self._lock:
                st = self._stats
                st.batches += 1
                st.deltas += batch.deltas
                st.keys += batch.keys
                st.quarantined += batch.quarantined
                st.last_batch_at = time.time()
            logger.debug("applied %d deltas to %d keys (%s queue)", batch.deltas, batch.keys, queue)
        if batch.busy:
            busy = True
            with self._lock:
                self._stats.busy += batch.busy
            logger.debug(
                "%d deltas left queued: their parent rows are held by other transactions "
                "(%s queue)", batch.busy, queue,
            )  # fmt: skip
        if batch.quarantined:
            logger.warning(
                "%d deltas could not be applied and were set aside (%s queue): "
                "see `pgcounters quarantine list`", batch.quarantined, queue,
            )  # fmt: skip
        return got, full, busy

    def _end_round(self) -> None:
        with self._lock:
            self._stats.rounds += 1
            self._stats.notifications = self._notifier.notifications
        self._maybe_summarise()

    def _flush_notifications(self, conn: Conn) -> None:
        """On the way out: report the direct-mode changes committed meanwhile, unregister,
        and send the changes the rate limit held back."""
        if not self._notifier.active or conn.closed or conn.broken:
            return
        if self._report_direct:
            try:
                # everything committed so far, while writers keep noting (a bounded number
                # of takes: what is noted after them goes with the last worker to stop)
                for _ in range(STOP_TAKES):
                    direct, taken = notifications.take_direct_batch(
                        conn, self._batch_size, self.settings.notify_max_keys
                    )
                    if direct:
                        self._notifier.committed(conn, direct)
                    if taken < self._batch_size:
                        break
                notifications.unlisten_direct(conn)
            except psycopg.Error as exc:
                logger.warning("could not report the last direct-mode changes: %s", exc)
        if not self._notifier.notify:
            return
        try:
            self._notifier.flush(conn, force=True)
        except psycopg.Error as exc:
            logger.warning("could not send the last change notification: %s", exc)
        with self._lock:
            self._stats.notifications = self._notifier.notifications

    def _maybe_summarise(self) -> None:
        every = self.settings.log_every
        if not every:
            return
        since, deltas0, batches0 = self._summary
        now = time.monotonic()
        if now - since < every:
            return
        st = self.get_stats()
        if st.deltas > deltas0:
            logger.info(
                "applied %d deltas in %d batches over the last %.0fs (%.0f deltas/s)",
                st.deltas - deltas0, st.batches - batches0, now - since,
                (st.deltas - deltas0) / (now - since),
            )  # fmt: skip
        self._summary = (now, st.deltas, st.batches)

    # -- waiting ------------------------------------------------------------

    def _wait(self, conn: Conn, seconds: float) -> None:
        """Wait up to ``seconds``; return early when stopped or (listening) notified."""
        if not self._listening or conn.closed:
            self._stop.wait(seconds)
            return
        deadline = time.monotonic() + seconds
        while not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            try:
                for _ in conn.notifies(timeout=min(left, 0.25), stop_after=1):
                    with self._lock:
                        self._stats.wakeups += 1
                    return
            except psycopg.OperationalError:
                return  # the next round finds the broken connection and reconnects


class GracefulSignals:
    """SIGTERM and SIGINT for a command that works in batches.

    The first signal calls ``on_first`` (finish the current batch, then
    stop); a second one raises :class:`KeyboardInterrupt` at once, which
    rolls the open batch back. The previous handlers come back on exit.
    Outside the main thread this does nothing (signals go to the main thread).
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, on_first: Callable[[], None]) -> None:
        self.on_first = on_first
        self.received = 0
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: object) -> None:
        self.received += 1
        if self.received > 1:
            raise KeyboardInterrupt
        # no logging here: the handler may run while the main thread holds a logging lock
        os.write(2, f"pgcounters: {signal.Signals(signum).name} received, finishing the "
                    "current batch (send it again to stop at once)\n".encode())  # fmt: skip
        self.on_first()

    def __enter__(self) -> GracefulSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()


# -- wake-ups: the notifications a listening worker wakes on ---------------------------


def forget_dead_listeners(conn: Conn) -> None:
    """As a worker sets up: forget the registrations of reporting workers whose sessions
    are gone (and, when none is left, the notes nobody will report). Skipped, silently,
    for a role without the right."""
    try:
        notifications.unlisten_direct(conn)
    except (pg.InsufficientPrivilege, pg.UndefinedFunction, pg.ReadOnlySqlTransaction) as exc:
        # a role without the right, or a hot standby (whose first drain says it is read-only)
        logger.debug("dead change listeners left to others: %s", str(exc).strip())


WAKEUP_MIN, WAKEUP_MAX = 0.001, 3600.0
"""The wake-up intervals the database keeps (whole milliseconds, at most an hour)."""


def enable_wakeups(conn: Conn, interval: float = 0.1) -> None:
    """Install the wake-up triggers on both queues: a commit that queues deltas notifies
    listening workers (:attr:`WorkerSettings.listen`), at most once per ``interval``
    seconds, never once per delta. Enabling again changes the interval.

    Runs in a transaction of its own, or in the caller's (a savepoint) when one is open.
    Raises :class:`ConfigurationError` for an interval that is not a positive number, and
    :class:`~pgcounters.errors.PgCountersError` (SQLSTATE ``PC006``) for one outside 1 ms to
    1 hour; :class:`~pgcounters.errors.SchemaError` when the schema is not current.
    """
    if isinstance(interval, bool) or not isinstance(interval, int | float) or not interval > 0:
        raise ConfigurationError(f"the wake-up interval must be positive, got {interval!r}")
    if interval < WAKEUP_MIN:  # the database keeps whole milliseconds: it would round it up
        raise ConfigurationError(
            f"the wake-up interval must be between 1 ms and 1 hour, got {interval!r} seconds"
        )
    with translated(), conn.transaction():
        schema.check(conn)
        conn.execute(_ops("enable_wakeups"), {"seconds": interval})


def disable_wakeups(conn: Conn) -> bool:
    """Remove the wake-up triggers (workers keep polling); True if they were installed."""
    with translated(), conn.transaction():
        schema.check(conn)
        row = conn.execute(_ops("disable_wakeups")).fetchone()
    return bool(row and row[0])


def wakeup_interval(conn: Conn) -> float | None:
    """The wake-up interval in seconds, or None when wake-ups are off."""
    with translated(), conn.transaction():
        schema.check(conn)
        row = conn.execute(_ops("wakeup_interval")).fetchone()
    return None if row is None or row[0] is None else int(row[0]) / 1000
