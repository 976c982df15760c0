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
unknown (the connection broke, the write was interrupted or cancelled) is
looked up by its flush id, in the transaction that would write it again, so it
is never counted twice. An exception at any point of a flush (``KeyboardInterrupt``,
a task's cancellation) loses and doubles nothing: see :class:`_Pending`.

**Transactions.** Increments made through :meth:`BatchingCounters.transaction`
(psycopg) or an :class:`IncrementGroup` committed from Django's
``transaction.on_commit`` are only buffered once the caller's transaction has
committed: a rolled-back request counts nothing.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from pgcounters import plans
from pgcounters.client import Counter, Increment
from pgcounters.connection import Conn
from pgcounters.errors import (
    BufferClosed,
    BufferFlushFailed,
    BufferFull,
    ConfigurationError,
    InvalidCounterDefinition,
    InvalidDelta,
)
from pgcounters.flushlog import (
    DbLink,
    EncodedIncrement,
    check_buffer_name,
    exact_with_flushes,
    exact_with_flushes_plan,
    new_flush_id,
    own_transaction,
    settle_async,
    write_flush,
    write_flush_plan,
)
from pgcounters.keys import BIGINT_MAX, BIGINT_MIN, check_delta, encode_key
from pgcounters.plans import AsyncConn

log = logging.getLogger("pgcounters.batching")

BufferKey = tuple[str, tuple[str, ...]]
"""A counter name and a key in canonical text form."""

_CLOSE_ATTEMPTS = 3
_MAX_BACKOFF = 30.0


def _check_settings(max_pending: int, interval: float | None, max_buffered: int) -> None:
    """Refuse a buffer's settings that are not positive numbers (interval: or None)."""
    for label, value in (("max_pending", max_pending), ("max_buffered", max_buffered)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigurationError(f"{label} must be a positive int, got {value!r}")
    if interval is not None and (
        isinstance(interval, bool) or not isinstance(interval, int | float) or interval <= 0
    ):
        raise ConfigurationError(f"interval must be a positive number or None, got {interval!r}")


@dataclass
class _Batch:
    flush_id: str
    deltas: dict[BufferKey, int]
    increments: int
    in_doubt: bool = False
    sealed: bool = False
    """Cut for a write: it takes no more increments (an open batch is never written)."""


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


class _Pending:
    """The increments a buffer holds, netted per counter and key, as batches (oldest first):
    the last one is open (it takes the new increments) unless it is sealed; the sealed ones
    are cut for a write and not written yet. What the sync and the async buffers share; a
    short ``threading.Lock`` guards it (held for dictionary updates only, never across I/O).

    Every increment lives in exactly one batch, and every change of state is one step (a
    batch appended, removed or sealed; a dictionary updated), so that an exception raised
    between any two lines (``KeyboardInterrupt``, a task's cancellation) leaves an increment
    either in a batch or not acknowledged, never in two.
    """

    def __init__(self, max_pending: int, max_buffered: int) -> None:
        self.max_pending = max_pending
        self.max_buffered = max_buffered
        self.lock = threading.Lock()
        self.batches: list[_Batch] = []
        self.closed = False

    def _open(self) -> _Batch:
        """The batch taking increments (a new one when the last is sealed)."""
        if self.batches and not self.batches[-1].sealed:
            return self.batches[-1]
        batch = _Batch(new_flush_id(), {}, 0)
        self.batches.append(batch)
        return batch

    def check_room(self, new_keys: int, last_error: BaseException | None) -> None:
        """Refuse an increment to a closed or full buffer (call with the lock held)."""
        if self.closed:
            raise BufferClosed()
        if new_keys:
            held = sum(len(b.deltas) for b in self.batches)
            if held + new_keys > self.max_buffered:
                raise BufferFull(
                    f"{held} keys are buffered and not written "
                    f"(max_buffered={self.max_buffered}); last error: {last_error}"
                )

    def absorb(
        self, deltas: dict[BufferKey, int], increments: int, last_error: BaseException | None
    ) -> bool:
        """Add validated, netted increments, all or none; True when the buffer is full."""
        with self.lock:
            self.check_room(0, last_error)
            batch = self._open()
            self.check_room(sum(1 for k in deltas if k not in batch.deltas), last_error)
            merged = {k: _summed(batch.deltas.get(k, 0), d, k[0]) for k, d in deltas.items()}
            batch.deltas.update(merged)
            batch.increments += increments
            return batch.increments >= self.max_pending

    def add(self, k: BufferKey, delta: int, last_error: BaseException | None) -> bool:
        """Add one validated increment; True when the buffer is full."""
        with self.lock:
            self.check_room(0, last_error)
            batch = self._open()
            self.check_room(0 if k in batch.deltas else 1, last_error)
            batch.deltas[k] = _summed(batch.deltas.get(k, 0), delta, k[0])
            batch.increments += 1
            return batch.increments >= self.max_pending

    def cut(self) -> list[_Batch]:
        """Seal the open batch (if it holds anything); every sealed batch, oldest first."""
        with self.lock:
            if self.batches and self.batches[-1].deltas:
                self.batches[-1].sealed = True
            return [b for b in self.batches if b.sealed]

    def written(self, batch: _Batch) -> None:
        with self.lock:
            if batch in self.batches:
                self.batches.remove(batch)

    def written_but(self, batch: _Batch, held: list[EncodedIncrement]) -> BufferFlushFailed:
        """``batch`` was written but for ``held`` (increments of counters dropped meanwhile):
        those are buffered again, to be written if their counter is declared again, and
        no longer stand in the way of the others. The error to raise."""
        with self.lock:
            # held first, then the batch removed: interrupted between the two, the batch is
            # written again, found recorded, and nothing of it is written twice
            again = self._open()
            merged = {
                (c.name, encoded): _summed(again.deltas.get((c.name, encoded), 0), d, c.name)
                for c, encoded, d in held
            }
            again.deltas.update(merged)
            again.increments += len(held)
            if batch in self.batches:
                self.batches.remove(batch)
        names = ", ".join(sorted({repr(c.name) for c, _, _ in held}))
        return BufferFlushFailed(
            f"counter {names} was dropped after increments to it were buffered: {len(held)} "
            "keys kept, written once it is declared again (the other counters' increments "
            "were written)"
        )

    def pending(self) -> int:
        with self.lock:
            return sum(b.increments for b in self.batches)

    def in_doubt(self) -> list[str]:
        """The flush ids of the batches whose write may have committed."""
        with self.lock:
            return [b.flush_id for b in self.batches if b.in_doubt]

    def unwritten(self, k: BufferKey) -> list[tuple[str, int, bool]]:
        """``(flush id, delta of k, in doubt)`` of each batch not written (the open one too)."""
        with self.lock:
            return [(b.flush_id, b.deltas.get(k, 0), b.in_doubt) for b in self.batches]

    def close(self) -> None:
        with self.lock:
            self.closed = True


def _items(link_counter: Callable[[str], Counter], batch: _Batch) -> list[EncodedIncrement]:
    return [
        (link_counter(name), encoded, delta)
        for (name, encoded), delta in batch.deltas.items()
        if delta != 0
    ]


class _Group:
    """What a group of increments holds: netted deltas, validated, not yet buffered."""

    def __init__(self) -> None:
        self.deltas: dict[BufferKey, int] = {}
        self.increments = 0
        self.done = False

    def _check_open(self) -> None:
        if self.done:
            raise BufferClosed("this increment group was already committed or discarded")

    def _hold(self, k: BufferKey, delta: int) -> None:
        self.deltas[k] = _summed(self.deltas.get(k, 0), delta, k[0])
        self.increments += 1

    def _take(self) -> dict[BufferKey, int] | None:
        """The deltas to buffer, once (None when already committed or discarded)."""
        if self.done:
            return None
        self.done = True
        return self.deltas

    def discard(self) -> None:
        """Count nothing of the group (it takes no more increments)."""
        self.done = True
        self.deltas.clear()


class IncrementGroup(_Group):
    """Increments held back until :meth:`commit` hands them to the buffer.

    Every increment is validated when it is added. Use it with Django's
    ``transaction.on_commit(group.commit)``, or through
    :meth:`BatchingCounters.transaction` with psycopg. ``discard`` (or never
    committing) counts nothing.
    """

    def __init__(self, owner: BatchingCounters) -> None:
        super().__init__()
        self.owner = owner

    def incr(self, name: str, key: object = None, delta: int = 1) -> None:
        self._check_open()
        self._hold(self.owner.validate(name, key, delta), delta)

    def commit(self) -> None:
        """Buffer the group's increments (they are acknowledged from now on)."""
        deltas = self._take()
        if deltas is not None:
            self.owner.absorb(deltas, self.increments)


class AsyncIncrementGroup(_Group):
    """:class:`IncrementGroup` of an :class:`AsyncBatchingCounters`: the same increments held
    back until ``await group.commit()``, each validated when it is added
    (``await group.incr(...)``). Use it through :meth:`AsyncBatchingCounters.transaction`
    with psycopg's ``AsyncConnection``; ``discard`` (or never committing) counts nothing."""

    def __init__(self, owner: AsyncBatchingCounters, conn: AsyncConn | None = None) -> None:
        super().__init__()
        self.owner = owner
        self.conn = conn
        """The transaction's connection: a counter's declaration, read once, is read on it
        (not on a connection of the buffer's pool, which the caller's tasks may all hold)."""

    async def incr(self, name: str, key: object = None, delta: int = 1) -> None:
        self._check_open()
        self._hold(await self.owner.validate(name, key, delta, conn=self.conn), delta)

    async def commit(self) -> None:
        """Buffer the group's increments (they are acknowledged from now on)."""
        deltas = self._take()
        if deltas is not None:
            await self.owner.absorb(deltas, self.increments)


def _check_outermost(conn: Conn | AsyncConn, owner: str) -> None:
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        raise ConfigurationError(f"{owner}.transaction() must open the outermost transaction")


_LIVE: weakref.WeakSet[BatchingCounters] = weakref.WeakSet()


def _reset_after_fork() -> None:
    for batcher in list(_LIVE):
        batcher._forget_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


class _ErrorReports:
    """A buffer's flusher errors: logged, kept as ``last_error``, passed to ``on_error``."""

    buffer: str
    last_error: BaseException | None
    on_error: Callable[[BaseException], object] | None

    def _report(self, exc: BaseException) -> None:
        self.last_error = exc
        log.error("pgcounters batching buffer %r: %s", self.buffer, exc)
        if self.on_error is not None:
            try:
                self.on_error(exc)
            except Exception:
                log.exception("the on_error callback of buffer %r failed", self.buffer)


class BatchingCounters(_ErrorReports):
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
        _check_settings(max_pending, interval, max_buffered)
        self.max_pending = max_pending
        self.max_buffered = max_buffered
        self.interval = interval
        self.buffer = check_buffer_name(buffer)
        self.on_error = on_error
        self.last_error: BaseException | None = None
        self._link = DbLink(database)
        self._pending = _Pending(max_pending, max_buffered)
        self._flush_lock = threading.Lock()  # one write at a time
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
        if self._pending.add(k, delta, self.last_error):
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
        if self._pending.absorb(deltas, increments, self.last_error):
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
        _check_outermost(conn, "BatchingCounters")
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
            batches = self._pending.cut()
            keys = increments = 0
            for batch in batches:
                try:
                    self._write(batch)
                except BufferFlushFailed as exc:
                    self.last_error = exc
                    raise
                self._pending.written(batch)
                keys += len(batch.deltas)
                increments += batch.increments
            self.last_error = None
            return FlushStats(len(batches), keys, increments)

    def _write(self, batch: _Batch) -> None:
        items = _items(self._link.counter, batch)
        with self._link.lock:
            try:
                pc = self._link.counters()
                # a batch in doubt is looked up first, in the write's own transaction
                written, held = write_flush(
                    pc,
                    batch.flush_id,
                    self.buffer,
                    items,
                    keep=self._pending.in_doubt(),
                    look_up=batch.in_doubt,
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
        if not written:
            log.info("batch %s had been committed already; not written again", batch.flush_id)
        if held:  # the rest is committed: only these stay
            raise self._pending.written_but(batch, held)

    def pending(self) -> int:
        """Acknowledged increments not yet written (in this process)."""
        return self._pending.pending()

    def get(self, name: str, key: object = None) -> int:
        """Exact value: the database's exact value plus what this process has not written yet."""
        k = self.validate(name, key, 0)
        counter = self._link.counter(name)
        with self._flush_lock:  # no write in progress
            unwritten = self._pending.unwritten(k)
            doubtful = [fid for fid, _, doubt in unwritten if doubt]
            with self._link.lock:
                value, recorded = exact_with_flushes(self._link.counters(), counter, k[1], doubtful)
        return value + sum(d for fid, d, _ in unwritten if fid not in recorded)

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

    def close(self) -> FlushStats:
        """Stop the flusher, write what is buffered and refuse further increments.

        Raises BufferFlushFailed if the last writes fail (after a few attempts);
        the increments then stay in memory, and :meth:`flush` may be tried again.
        """
        self._pending.close()
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
        closed = self._pending.closed
        self._pending = _Pending(self.max_pending, self.max_buffered)
        self._pending.closed = closed
        self._flush_lock = threading.Lock()
        self._link = DbLink.after_fork(self._link)
        self._pid = os.getpid()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = None
        if not self._pending.closed:
            self._start_thread()

    def __enter__(self) -> BatchingCounters:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncBatchingCounters(_ErrorReports):
    """:class:`BatchingCounters` for an event loop: increments buffered in this process,
    written by a task of the loop, on psycopg's ``AsyncConnectionPool`` or ``AsyncConnection``.

    The same buffer (netted per counter and key, ``max_pending``, ``max_buffered``), the
    same write (one transaction: COPY into the queues, the flush id recorded, a batch in
    doubt looked up before it is written again) and the same exact ``get``, awaited:
    ``await events.incr(name, key)`` validates the increment (the counter's declaration is
    read once) and buffers it. The writes happen when ``max_pending`` increments are
    buffered (the flusher task is woken), every ``interval`` seconds, on ``flush()`` and on
    ``aclose()``. The flusher runs inside ``async with AsyncBatchingCounters(...)`` (or
    between ``start()`` and ``aclose()``); there is no exit hook: what is buffered when the
    loop ends without ``aclose()`` is lost, like a sync buffer's on SIGKILL.

    On a pool (autocommit or not) each write borrows a connection; a connection given
    alone (autocommit or not) must be used by this buffer only. Each write runs in a
    shielded task of its own: a cancelled ``flush()`` (or flusher, or ``aclose()``) never
    interrupts a write half-way (see docs/event-counters.md, "Cancellation").
    """

    def __init__(
        self,
        database: AsyncConn | AsyncConnectionPool[Any],
        *,
        max_pending: int = 10_000,
        interval: float | None = 1.0,
        max_buffered: int = 1_000_000,
        buffer: str = "batching",
        on_error: Callable[[BaseException], object] | None = None,
    ) -> None:
        from pgcounters.client import AsyncCounters

        _check_settings(max_pending, interval, max_buffered)
        self.client = AsyncCounters(database)
        self.max_pending = max_pending
        self.max_buffered = max_buffered
        self.interval = interval
        self.buffer = check_buffer_name(buffer)
        self.on_error = on_error
        self.last_error: BaseException | None = None
        self._pending = _Pending(max_pending, max_buffered)
        self._declared: dict[str, Counter] = {}
        self._flush_lock: asyncio.Lock | None = None
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._writes: set[asyncio.Task[FlushStats]] = set()
        self._unsettled = False
        """A write was interrupted on the buffer's single connection: settle it first."""

    async def counter(self, name: str, *, conn: AsyncConn | None = None) -> Counter:
        """A counter's declaration, read once (as :class:`BatchingCounters` does): on
        ``conn`` if given (in its current transaction), else on the buffer's database."""
        found = self._declared.get(name)
        if found is None:
            if conn is None:
                found = await self.client._run(own_transaction(self.client._counter(name)))
            else:
                found = await plans.run_async(self.client._counter(name), conn)
            if found.scale is not None:
                raise InvalidCounterDefinition(
                    f"counter {name} sums decimals: event counters take whole deltas, add to "
                    "it with AsyncCounters.incr_decimal"
                )
            self._declared[name] = found
        return found

    async def validate(
        self, name: str, key: object = None, delta: int = 0, *, conn: AsyncConn | None = None
    ) -> BufferKey:
        """Check an increment (counter declared, key and delta valid); its buffer key. The
        declaration is read once, on ``conn`` if given (see :meth:`counter`)."""
        counter = await self.counter(name, conn=conn)
        encoded = tuple(encode_key(key, counter.key_types, name))
        check_delta(delta)
        return name, encoded

    async def incr(self, name: str, key: object = None, delta: int = 1) -> None:
        """Buffer one increment (acknowledged when this returns)."""
        k = await self.validate(name, key, delta)
        if self._pending.add(k, delta, self.last_error):
            await self._on_full()

    async def incr_many(self, items: Iterable[Increment]) -> None:
        """Buffer many increments, all or none (every item is validated first)."""
        netted: dict[BufferKey, int] = {}
        n = 0
        for name, key, delta in items:
            k = await self.validate(name, key, delta)
            netted[k] = _summed(netted.get(k, 0), delta, name)
            n += 1
        await self.absorb(netted, n)

    async def absorb(self, deltas: dict[BufferKey, int], increments: int) -> None:
        """Buffer already validated, netted increments, all or none."""
        if deltas and self._pending.absorb(deltas, increments, self.last_error):
            await self._on_full()

    def group(self, conn: AsyncConn | None = None) -> AsyncIncrementGroup:
        """A group of increments buffered only when it is committed (the declarations it
        needs read on ``conn`` if given)."""
        return AsyncIncrementGroup(self, conn)

    @contextlib.asynccontextmanager
    async def transaction(self, conn: AsyncConn) -> AsyncIterator[AsyncIncrementGroup]:
        """A transaction on ``conn`` whose increments are buffered only if it commits:
        ``async with events.transaction(conn) as group: ... await group.incr(...)``.

        ``conn`` must not already be in a transaction: an inner block would be a
        savepoint, and the outer transaction could still roll back.
        """
        _check_outermost(conn, "AsyncBatchingCounters")
        group = self.group(conn)
        rolled_back = False
        async with conn.transaction():
            try:
                yield group
            except psycopg.Rollback:
                # psycopg ends the block quietly, rolled back: count nothing
                rolled_back = True
                raise
        if rolled_back:
            group.discard()
        else:
            await group.commit()

    def pending(self) -> int:
        """Acknowledged increments not yet written (in this process)."""
        return self._pending.pending()

    async def _on_full(self) -> None:
        if self._task is not None and not self._task.done() and self._wake is not None:
            self._wake.set()
            return
        try:
            await self.flush()
        except BufferFlushFailed as exc:
            self._report(exc)

    def _lock(self) -> asyncio.Lock:
        if self._flush_lock is None:
            self._flush_lock = asyncio.Lock()
        return self._flush_lock

    async def flush(self) -> FlushStats:
        """Write everything buffered now. Raises BufferFlushFailed (keeping it) on failure.

        The write runs in a task of its own, shielded: cancelling ``flush()`` (or the task
        awaiting it) at any point never interrupts a write half-way; the write goes on,
        and the next ``flush()``, ``get()`` or ``aclose()`` waits for it first.
        """
        write = asyncio.get_running_loop().create_task(
            self._flush_now(), name=f"pgcounters-batching-{self.buffer}-write"
        )
        self._writes.add(write)
        write.add_done_callback(self._write_done)
        return await asyncio.shield(write)

    def _write_done(self, write: asyncio.Task[FlushStats]) -> None:
        self._writes.discard(write)
        if write.cancelled():
            return
        exc = write.exception()  # retrieved: its caller may have left (cancelled)
        if exc is not None and not isinstance(exc, BufferFlushFailed):
            log.error("pgcounters batching buffer %r: a write failed: %r", self.buffer, exc)

    async def _settle(self) -> None:
        conn = self.client._conn
        if self._unsettled and conn is not None:
            await settle_async(conn)
        self._unsettled = False

    async def _flush_now(self) -> FlushStats:
        async with self._lock():  # one write at a time, in the order they were asked for
            await self._settle()
            batches = self._pending.cut()
            keys = increments = 0
            for batch in batches:
                try:
                    await self._write(batch)
                except BufferFlushFailed as exc:
                    self.last_error = exc
                    raise
                self._pending.written(batch)
                keys += len(batch.deltas)
                increments += batch.increments
            self.last_error = None
            return FlushStats(len(batches), keys, increments)

    def _redeclared(self, counter: Counter) -> None:
        self._declared[counter.name] = counter

    async def _write(self, batch: _Batch) -> None:
        items = [
            (self._declared[name], encoded, delta)
            for (name, encoded), delta in batch.deltas.items()
            if delta != 0
        ]
        try:
            # a batch in doubt is looked up first, in the write's own transaction
            written, held = await self.client._run(
                write_flush_plan(
                    self.client,
                    batch.flush_id,
                    self.buffer,
                    items,
                    keep=self._pending.in_doubt(),
                    look_up=batch.in_doubt,
                    redeclared=self._redeclared,
                )
            )
        except BaseException as exc:
            # whatever happened, the batch may or may not have been committed: look its
            # id up before writing it again
            batch.in_doubt = True
            self._unsettled = True
            if not isinstance(exc, Exception):
                raise
            raise BufferFlushFailed(
                f"could not write {batch.increments} buffered increments "
                f"({len(items)} keys): {exc}; they are kept and retried"
            ) from exc
        if not written:
            log.info("batch %s had been committed already; not written again", batch.flush_id)
        if held:  # the rest is committed: only these stay
            raise self._pending.written_but(batch, held)

    async def get(self, name: str, key: object = None) -> int:
        """Exact value: the database's exact value plus what this process has not written."""
        k = await self.validate(name, key, 0)
        counter = self._declared[name]
        async with self._lock():  # no write in progress
            await self._settle()
            unwritten = self._pending.unwritten(k)
            doubtful = [fid for fid, _, doubt in unwritten if doubt]
            value, recorded = await self.client._run(
                own_transaction(exact_with_flushes_plan(counter, k[1], doubtful))
            )
        return value + sum(d for fid, d, _ in unwritten if fid not in recorded)

    # -- the flusher task ---------------------------------------------------------

    def start(self) -> None:
        """Start the flusher task in the running loop (nothing without an ``interval``)."""
        if self.interval is None or (self._task is not None and not self._task.done()):
            return
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"pgcounters-batching-{self.buffer}"
        )

    async def _run(self) -> None:
        backoff = 0.0
        interval = self.interval
        assert interval is not None
        assert self._wake is not None
        while not self._pending.closed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), backoff or interval)
            self._wake.clear()
            try:
                await self.flush()
                backoff = 0.0
            except Exception as exc:
                self._report(exc)
                backoff = min(max(backoff * 2, min(interval, 0.5)), _MAX_BACKOFF)

    async def aclose(self) -> FlushStats:
        """Stop the flusher, write what is buffered and refuse further increments (a write
        in progress goes on: the flusher's cancellation does not reach it, and this waits
        for it before writing the rest).

        Raises BufferFlushFailed if the last writes fail (after a few attempts); the
        increments then stay in memory, and :meth:`flush` may be tried again.
        """
        self._pending.close()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for attempt in range(_CLOSE_ATTEMPTS):
            try:
                return await self.flush()
            except BufferFlushFailed:
                if attempt == _CLOSE_ATTEMPTS - 1:
                    log.critical(
                        "pgcounters batching buffer %r: %d acknowledged increments could not be "
                        "written to PostgreSQL",
                        self.buffer,
                        self.pending(),
                    )
                    raise
                await asyncio.sleep(0.2 * (attempt + 1))
        raise AssertionError("unreachable")

    async def __aenter__(self) -> AsyncBatchingCounters:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
