"""The batching incrementer: increments buffered in the process, written in batches.

:class:`BatchingCounters` keeps increments in memory, netted per counter and
key, and writes them to PostgreSQL as one transaction (a COPY
into the queue, or :meth:`Counters.incr_many` for direct counters) when

* ``max_pending`` increments have been buffered (the background flusher is
  woken at once; without one, the ``incr`` that fills the buffer writes it),
* ``interval`` seconds have passed (a background flusher thread),
* :meth:`BatchingCounters.flush` or :meth:`BatchingCounters.close` is called,
* the interpreter exits normally (an ``atexit`` hook).

**What "acknowledged" means.** ``incr`` returned without raising: the counter
exists, the key and delta are valid, and the increment is held in this
process's memory. It is then written by one of the triggers above; until
then it is *not* in the database and is invisible to other processes' reads.

**Durability window.** An acknowledged increment is lost only if the process
ends without running its exit hooks (SIGKILL, ``os._exit``, a crash, a power
loss; note that Python's default action on SIGTERM also skips ``atexit``)
before the next successful write: normally at most ``interval`` seconds (plus
one write) or ``max_pending`` increments of this process. While PostgreSQL
refuses the writes, everything buffered since the last successful write is at
risk; the buffer then grows up to ``max_buffered`` keys, after which ``incr``
refuses new increments with :class:`BufferFull` (refused, not acknowledged).

**Failed writes** keep their batch (nothing acknowledged is dropped): the
error is raised by an explicit ``flush``, and reported by the background
flusher (logged, kept in :attr:`BatchingCounters.last_error`, passed to
``on_error``), which retries with a backoff. A batch whose COMMIT outcome is
unknown (the connection broke) is looked up by its flush id before it is
written again, so it is never counted twice.

**Transactions.** Increments made through :meth:`BatchingCounters.transaction`
(psycopg) or an :class:`IncrementGroup` committed from Django's
``transaction.on_commit`` are only buffered once the caller's transaction has
committed: a rolled-back request counts nothing.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import psycopg

from pgcounters.client import Increment
from pgcounters.connection import Conn
from pgcounters.errors import (
    BufferClosed,
    BufferFlushFailed,
    BufferFull,
    ConfigurationError,
    InvalidDelta,
)
from pgcounters.flushlog import (
    DbLink,
    EncodedIncrement,
    check_buffer_name,
    exact_with_flushes,
    flush_recorded,
    new_flush_id,
    write_flush,
)
from pgcounters.keys import BIGINT_MAX, BIGINT_MIN, check_delta, encode_key

log = logging.getLogger("pgcounters.batching")

BufferKey = tuple[str, tuple[str, ...]]
"""A counter name and a key in canonical text form."""

_CLOSE_ATTEMPTS = 3
_MAX_BACKOFF = 30.0


@dataclass
class _Batch:
    flush_id: str
    deltas: dict[BufferKey, int]
    increments: int
    in_doubt: bool = False


@dataclass(frozen=True)
class FlushStats:
    """What one :meth:`BatchingCounters.flush` wrote."""

    batches: int = 0
    keys: int = 0
    increments: int = 0


def _summed(current: int, delta: int, name: str) -> int:
    total = current + delta
    if not BIGINT_MIN <= total <= BIGINT_MAX:
        raise InvalidDelta(
            f"the buffered sum for counter {name!r} would leave the bigint range; flush first"
        )
    return total


@dataclass
class IncrementGroup:
    """Increments held back until :meth:`commit` hands them to the buffer.

    Every increment is validated when it is added. Use it with Django's
    ``transaction.on_commit(group.commit)``, or through
    :meth:`BatchingCounters.transaction` with psycopg. ``discard`` (or never
    committing) counts nothing.
    """

    owner: BatchingCounters
    deltas: dict[BufferKey, int] = field(default_factory=dict)
    increments: int = 0
    done: bool = False

    def incr(self, name: str, key: object = None, delta: int = 1) -> None:
        if self.done:
            raise BufferClosed("this increment group was already committed or discarded")
        k = self.owner.validate(name, key, delta)
        self.deltas[k] = _summed(self.deltas.get(k, 0), delta, name)
        self.increments += 1

    def commit(self) -> None:
        """Buffer the group's increments (they are acknowledged from now on)."""
        if self.done:
            return
        self.done = True
        self.owner.absorb(self.deltas, self.increments)

    def discard(self) -> None:
        self.done = True
        self.deltas.clear()


_LIVE: weakref.WeakSet[BatchingCounters] = weakref.WeakSet()


def _reset_after_fork() -> None:
    for batcher in list(_LIVE):
        batcher._forget_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


class BatchingCounters:
    """Increments buffered in this process and written to PostgreSQL in batches.

    ``database`` is a DSN (the buffer opens and owns its connection, and
    reconnects after a failure) or a psycopg connection used only by this
    buffer. Thread-safe: any number of threads may call :meth:`incr`.

    ``interval=None`` runs no background thread: writes then happen on size
    (in the calling thread), on :meth:`flush`, on :meth:`close` and at exit.
    """

    def __init__(
        self,
        database: str | Conn,
        *,
        max_pending: int = 10_000,
        interval: float | None = 1.0,
        max_buffered: int = 1_000_000,
        flush_at_exit: bool = True,
        buffer: str = "batching",
        on_error: Callable[[BaseException], object] | None = None,
    ) -> None:
        for label, value in (("max_pending", max_pending), ("max_buffered", max_buffered)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(f"{label} must be a positive int, got {value!r}")
        if interval is not None and (
            isinstance(interval, bool) or not isinstance(interval, int | float) or interval <= 0
        ):
            raise ConfigurationError(
                f"interval must be a positive number or None, got {interval!r}"
            )
        self.max_pending = max_pending
        self.max_buffered = max_buffered
        self.interval = interval
        self.buffer = check_buffer_name(buffer)
        self.on_error = on_error
        self.last_error: BaseException | None = None
        self._link = DbLink(database)
        self._lock = threading.Lock()  # guards the buffer and the batch list
        self._flush_lock = threading.Lock()  # one write at a time
        self._buf: dict[BufferKey, int] = {}
        self._count = 0
        self._batches: list[_Batch] = []
        self._batched_keys = 0
        self._closed = False
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._at_exit_registered = flush_at_exit
        if flush_at_exit:
            atexit.register(self._at_exit)
        _LIVE.add(self)
        self._start_thread()

    # -- validation ---------------------------------------------------------

    def validate(self, name: str, key: object = None, delta: int = 0) -> BufferKey:
        """Check an increment (counter declared, key and delta valid); its buffer key."""
        counter = self._link.counter(name)
        encoded = tuple(encode_key(key, counter.key_types, name))
        check_delta(delta)
        return name, encoded

    # -- increments ---------------------------------------------------------

    def incr(self, name: str, key: object = None, delta: int = 1) -> None:
        """Buffer one increment (acknowledged when this returns; see the module docs)."""
        k = self.validate(name, key, delta)
        with self._lock:
            self._check_room(0 if k in self._buf else 1)
            self._buf[k] = _summed(self._buf.get(k, 0), delta, name)
            self._count += 1
            full = self._count >= self.max_pending
        if full:
            self._on_full()

    def incr_many(self, items: Iterable[Increment]) -> None:
        """Buffer many increments, all or none (every item is validated first)."""
        netted: dict[BufferKey, int] = {}
        n = 0
        for name, key, delta in items:
            k = self.validate(name, key, delta)
            netted[k] = _summed(netted.get(k, 0), delta, name)
            n += 1
        self.absorb(netted, n)

    def absorb(self, deltas: dict[BufferKey, int], increments: int) -> None:
        """Buffer already validated, netted increments, all or none."""
        if not deltas:
            return
        with self._lock:
            self._check_room(sum(1 for k in deltas if k not in self._buf))
            merged = {k: _summed(self._buf.get(k, 0), d, k[0]) for k, d in deltas.items()}
            self._buf.update(merged)
            self._count += increments
            full = self._count >= self.max_pending
        if full:
            self._on_full()

    def group(self) -> IncrementGroup:
        """A group of increments buffered only when it is committed."""
        return IncrementGroup(self)

    @contextmanager
    def transaction(self, conn: Conn) -> Iterator[IncrementGroup]:
        """A transaction on ``conn`` whose increments are buffered only if it commits.

        ``conn`` must not already be in a transaction: an inner block would be a
        savepoint, and the outer transaction could still roll back.
        """
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            raise ConfigurationError(
                "BatchingCounters.transaction() must open the outermost transaction"
            )
        group = self.group()
        rolled_back = False
        with conn.transaction():
            try:
                yield group
            except psycopg.Rollback:
                # psycopg ends the block quietly, rolled back: count nothing
                rolled_back = True
                raise
        if rolled_back:
            group.discard()
        else:
            group.commit()

    def _check_room(self, new_keys: int) -> None:
        if self._closed:
            raise BufferClosed()
        if new_keys and len(self._buf) + self._batched_keys + new_keys > self.max_buffered:
            raise BufferFull(
                f"{len(self._buf) + self._batched_keys} keys are buffered and not written "
                f"(max_buffered={self.max_buffered}); last error: {self.last_error}"
            )

    def _on_full(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            self._wake.set()
            return
        try:
            self.flush()
        except BufferFlushFailed as exc:
            # the increment itself is buffered (acknowledged); the write failed
            self._report(exc)

    # -- writing ------------------------------------------------------------

    def flush(self) -> FlushStats:
        """Write everything buffered now. Raises BufferFlushFailed (keeping it) on failure."""
        with self._flush_lock:
            with self._lock:
                if self._buf:
                    batch = _Batch(new_flush_id(), self._buf, self._count)
                    self._batches.append(batch)
                    self._batched_keys += len(batch.deltas)
                    self._buf = {}
                    self._count = 0
                batches = list(self._batches)
            keys = increments = 0
            for batch in batches:
                try:
                    self._write(batch)
                except BufferFlushFailed as exc:
                    self.last_error = exc
                    raise
                with self._lock:
                    self._batches.remove(batch)
                    self._batched_keys -= len(batch.deltas)
                keys += len(batch.deltas)
                increments += batch.increments
            self.last_error = None
            return FlushStats(len(batches), keys, increments)

    def _items(self, batch: _Batch) -> list[EncodedIncrement]:
        return [
            (self._link.counter(name), encoded, delta)
            for (name, encoded), delta in batch.deltas.items()
            if delta != 0
        ]

    def _write(self, batch: _Batch) -> None:
        items = self._items(batch)
        with self._link.lock:
            try:
                pc = self._link.counters()
                if batch.in_doubt and flush_recorded(pc, batch.flush_id):
                    log.info(
                        "batch %s had been committed before its connection broke", batch.flush_id
                    )
                    return
                write_flush(
                    pc,
                    batch.flush_id,
                    self.buffer,
                    items,
                    redeclared=self._link.redeclared,
                )
            except BaseException as exc:
                # whatever happened, the batch may or may not have been committed:
                # look its id up before writing it again
                batch.in_doubt = True
                self._link.reset()
                if not isinstance(exc, Exception):
                    raise
                raise BufferFlushFailed(
                    f"could not write {batch.increments} buffered increments "
                    f"({len(items)} keys): {exc}; they are kept and retried"
                ) from exc

    def pending(self) -> int:
        """Acknowledged increments not yet written (in this process)."""
        with self._lock:
            return self._count + sum(b.increments for b in self._batches)

    def get(self, name: str, key: object = None) -> int:
        """Exact value: the database's exact value plus what this process has not written yet."""
        k = self.validate(name, key, 0)
        counter = self._link.counter(name)
        with self._flush_lock:  # no write in progress
            with self._lock:
                unwritten = [(b.flush_id, b.deltas.get(k, 0), b.in_doubt) for b in self._batches]
                local = self._buf.get(k, 0)
            doubtful = [fid for fid, _, doubt in unwritten if doubt]
            with self._link.lock:
                value, recorded = exact_with_flushes(self._link.counters(), counter, k[1], doubtful)
        return value + local + sum(d for fid, d, _ in unwritten if fid not in recorded)

    # -- the background flusher and the end of life ---------------------------

    def _start_thread(self) -> None:
        if self.interval is None:
            return
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, name=f"pgcounters-batching-{self.buffer}", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        backoff = 0.0
        interval = self.interval
        assert interval is not None
        while True:
            if backoff:
                self._stop.wait(backoff)
            else:
                self._wake.wait(interval)
            if self._stop.is_set():
                return
            self._wake.clear()
            try:
                self.flush()
                backoff = 0.0
            except Exception as exc:
                self._report(exc)
                backoff = min(max(backoff * 2, min(interval, 0.5)), _MAX_BACKOFF)

    def _report(self, exc: BaseException) -> None:
        self.last_error = exc
        log.error("pgcounters batching buffer %r: %s", self.buffer, exc)
        if self.on_error is not None:
            try:
                self.on_error(exc)
            except Exception:
                log.exception("the on_error callback of buffer %r failed", self.buffer)

    def close(self) -> FlushStats:
        """Stop the flusher, write what is buffered and refuse further increments.

        Raises BufferFlushFailed if the last writes fail (after a few attempts);
        the increments then stay in memory, and :meth:`flush` may be tried again.
        """
        with self._lock:
            self._closed = True
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        if self._at_exit_registered:
            atexit.unregister(self._at_exit)
            self._at_exit_registered = False
        for attempt in range(_CLOSE_ATTEMPTS):
            try:
                stats = self.flush()
            except BufferFlushFailed:
                if attempt == _CLOSE_ATTEMPTS - 1:
                    log.critical(
                        "pgcounters batching buffer %r: %d acknowledged increments could not be "
                        "written to PostgreSQL",
                        self.buffer,
                        self.pending(),
                    )
                    raise
                time.sleep(0.2 * (attempt + 1))
            else:
                self._link.close()
                return stats
        raise AssertionError("unreachable")

    def _at_exit(self) -> None:
        if os.getpid() != self._pid:
            return
        self.close()

    def _forget_after_fork(self) -> None:
        """In a forked child: the parent writes what it buffered; the child starts empty."""
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._buf = {}
        self._count = 0
        self._batches = []
        self._batched_keys = 0
        self._link = DbLink.after_fork(self._link)
        self._pid = os.getpid()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = None
        if not self._closed:
            self._start_thread()

    def __enter__(self) -> BatchingCounters:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
