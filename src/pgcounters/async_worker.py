"""The drainer for an event loop: :class:`AsyncWorker`.

It drains as :class:`pgcounters.worker.Worker` does (same settings, same
batches, same backoff while the queues are empty, same wake-ups through
LISTEN/NOTIFY, same handling of aborted batches, quarantined deltas and lost
connections) on a psycopg ``AsyncConnection``, so that it can run as a task of
an application's event loop (a FastAPI/Starlette lifespan) or alone
(``asyncio.run(worker.run())``). The decisions and the bookkeeping are the
sync worker's own methods; each batch is the client's drain plan, run by the
async executor. Backfills of declared counters are left to a sync worker or to
``pgcounters backfill``.

    async with AsyncWorker(dsn, WorkerSettings(listen=True)):
        ...  # the application runs; the worker drains beside it

"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from types import TracebackType
from typing import Any

import psycopg
from psycopg import errors as pg

from pgcounters import horizon, notifications, schema
from pgcounters.client import _CounterPlans, record_retry_plan
from pgcounters.config import connection_failed, redact
from pgcounters.errors import (
    ConfigurationError,
    ConnectionFailed,
    PermissionDenied,
    PgCountersError,
    SchemaError,
    WorkerError,
)
from pgcounters.plans import AsyncConn, run_async
from pgcounters.worker import (
    RETENTION_LIMIT,
    Worker,
    WorkerSettings,
    WorkerStats,
    _millis,
    _ops,
)

logger = logging.getLogger("pgcounters.worker")


class AsyncWorker:
    """Drain the queues in the running event loop until :meth:`stop` is called.

    ``await worker.run()`` drains until stopped. :meth:`start` runs it as a
    task of the current loop and :meth:`aclose` stops it and waits for the
    current batch to commit; ``async with AsyncWorker(dsn):`` does both.
    :meth:`stop` may be called from any thread or a signal handler.
    """

    def __init__(self, dsn: str, settings: WorkerSettings | None = None) -> None:
        # the sync worker keeps the settings, the counts and the decisions: one implementation
        self._core = Worker(dsn, settings)
        if self._core.settings.notify:
            # refused rather than ignored: listeners would wait for reports that never come
            raise ConfigurationError(
                "the async worker does not report changes (notify): run a Worker "
                "(`pgcounters worker --notify`) instead of it (the changes of the batches "
                "another drainer applies are not reported), or this one without notify"
            )
        self.dsn = dsn
        self.settings = self._core.settings
        self._plans = _CounterPlans(check_schema=False)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[WorkerStats] | None = None
        self._listening = False

    # -- public -------------------------------------------------------------

    def stop(self) -> None:
        """Ask the worker to return from :meth:`run` after the current batch (thread-safe)."""
        self._core.stop()
        loop, wake = self._loop, self._wake
        if loop is None or wake is None or loop.is_closed():
            return
        try:
            current = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        if current is loop:
            wake.set()
        else:
            loop.call_soon_threadsafe(wake.set)

    @property
    def stopping(self) -> bool:
        return self._core.stopping

    def get_stats(self) -> WorkerStats:
        """A copy of the counts so far."""
        return self._core.get_stats()

    def start(self) -> asyncio.Task[WorkerStats]:
        """Run the worker as a task of the running event loop (once); return the task."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self.run(), name="pgcounters worker"
            )
        return self._task

    async def aclose(self) -> WorkerStats:
        """Stop the worker started by :meth:`start` and wait for it; its final counts.

        Re-raises what ended the worker, if it failed (e.g. ConnectionFailed).
        """
        self.stop()
        if self._task is None:
            return self.get_stats()
        return await self._task

    async def __aenter__(self) -> AsyncWorker:
        self.start()
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def run(self) -> WorkerStats:
        """Drain until stopped. Returns the final counts.

        Raises as :meth:`pgcounters.worker.Worker.run` does: ConnectionFailed when the
        first connection fails, SchemaError, WorkerError for errors retrying cannot fix.
        """
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        if self.stopping:
            self._wake.set()
        s = self.settings
        logger.info(
            "async worker starting: %s, batches of %d (a backlog: up to %d), polling every "
            "%gs-%gs%s",
            redact(self.dsn), s.batch_size, max(s.batch_size, s.max_batch_size),
            s.min_interval, s.max_interval,
            ", woken by notifications" if s.listen else "",
        )  # fmt: skip
        conn: AsyncConn | None = await self._open()
        interval = s.min_interval
        try:
            while not self.stopping:
                if conn is None:
                    conn = await self._reconnect()
                    if conn is None:
                        break
                    interval = s.min_interval
                try:
                    got, full, busy = await self._round(conn)
                except psycopg.Error as exc:
                    lost = conn.broken or conn.closed
                    reason = self._core._judge_failure(exc, lost=lost)
                    if lost:
                        await conn.close()
                        conn = None
                        continue
                    if reason is not None:
                        await run_async(record_retry_plan("drain", reason), conn)
                    if not self.stopping:
                        await self._wait(conn, self._core._retry_wait())
                    continue
                except SchemaError:
                    raise
                except PgCountersError as exc:
                    # e.g. a batch whose sum overflows a counter: it stays queued
                    self._core._count_error()
                    logger.error("draining failed, retrying in %gs: %s", s.max_interval, exc)
                    await self._wait(conn, s.max_interval)
                    continue
                wait, notified, interval = self._core._pace(got, full, busy, interval)
                if wait and notified:
                    await self._wait(conn, wait)
                elif wait:
                    await self._sleep(wait)
        finally:
            if conn is not None:
                await conn.close()
            final = self.get_stats()
            logger.info(
                "async worker stopped: %d deltas applied in %d batches, %d reconnections",
                final.deltas, final.batches, final.reconnects,
            )  # fmt: skip
        return self.get_stats()

    # -- connection ---------------------------------------------------------

    async def _open(self) -> AsyncConn:
        """Connect, configure the session, check the schema, LISTEN if asked."""
        s = self.settings
        options: dict[str, Any] = {
            "application_name": s.application_name,
            "connect_timeout": max(1, round(s.connect_timeout)),
            "keepalives": 1,
            "keepalives_idle": 30,
            "keepalives_interval": 10,
            "keepalives_count": 3,
        }
        try:
            conn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True, **options)
        except (psycopg.OperationalError, psycopg.ProgrammingError) as exc:
            raise connection_failed(self.dsn, exc) from exc
        try:
            await self._setup(conn)
        except psycopg.OperationalError as exc:
            await conn.close()
            raise ConnectionFailed(
                f"lost the connection to {redact(self.dsn)!r} while setting it up: {exc}"
            ) from exc
        except psycopg.Error as exc:
            await conn.close()
            raise WorkerError(f"could not set up the worker's session: {exc}") from exc
        except BaseException:
            await conn.close()
            raise
        return conn

    async def _setup(self, conn: AsyncConn) -> None:
        s = self.settings
        await conn.execute(
            _ops("worker_session"),
            {
                "statement_timeout": _millis(s.statement_timeout),
                "idle_timeout": _millis(s.idle_in_transaction_timeout),
            },
        )
        await run_async(schema.check_plan(), conn)
        # forget the registrations of reporting workers whose sessions are gone
        try:
            await conn.execute(notifications.statement("unlisten_direct_changes"))
        except (pg.InsufficientPrivilege, pg.UndefinedFunction, pg.ReadOnlySqlTransaction) as exc:
            # a role without the right, or a hot standby (whose first drain says it is
            # read-only)
            logger.debug("dead change listeners left to others: %s", str(exc).strip())
        self._listening = False
        if s.listen:
            await conn.execute(_ops("listen"))
            self._listening = True
            cur = await conn.execute(_ops("wakeup_interval"))
            if await cur.fetchone() == (None,):
                logger.warning(
                    "listening, but the wake-up triggers are not installed "
                    "(`pgcounters wakeup on`): polling only"
                )

    async def _reconnect(self) -> AsyncConn | None:
        """Reconnect with exponential backoff until it works or the worker is stopped."""
        s = self.settings
        delay = s.reconnect_min
        attempt = 0
        while not await self._sleep(delay * random.uniform(0.8, 1.2)):
            attempt += 1
            try:
                conn = await self._open()
            except (ConnectionFailed, psycopg.OperationalError) as exc:
                logger.warning("reconnection attempt %d failed: %s", attempt, exc)
                delay = min(delay * 2, s.reconnect_max)
                continue
            with self._core._lock:
                self._core._stats.reconnects += 1
            logger.info("reconnected after %d attempt(s)", attempt)
            return conn
        return None

    # -- draining -----------------------------------------------------------

    async def _round(self, conn: AsyncConn) -> tuple[int, bool, bool]:
        """One batch from each queue, as the sync worker's round (backfills excepted)."""
        got = 0
        full = busy = False
        try:
            cur = await conn.execute(_ops("queue_spans"))
            spans = await cur.fetchone() or (1, 1)
        except (pg.FeatureNotSupported, pg.ObjectNotInPrerequisiteState):
            # a standby cannot read an unlogged table: the drain says what is wrong
            spans = (1, 1)
        for unlogged in (False, True):
            if self.stopping:
                break
            if not spans[unlogged]:
                continue
            size = self._core._size_for(int(spans[unlogged]), unlogged)
            started = time.monotonic()
            batch = await run_async(
                self._plans._drain_queue_batch(
                    size, unlogged, one_statement=True, careful_limit=self._core._batch_size
                ),
                conn,
            )
            batch_got, batch_full, batch_busy = self._core._note_batch(
                batch, unlogged, size, time.monotonic() - started
            )
            got += batch_got
            full = full or batch_full
            busy = busy or batch_busy
        # a round that found a trickle of deltas lingers before the next, as the sync one
        self._core._trickle = got > 0
        if self._core._retention_due(full):
            try:
                self._core._retention_done(
                    await run_async(self._plans._drop_expired_buckets(RETENTION_LIMIT), conn)
                )
            except PermissionDenied as exc:
                self._core._retention_refused(exc)
            except (PgCountersError, psycopg.Error) as exc:
                # a failing retention never stops the drain: tried again later
                if conn.broken or conn.closed or isinstance(exc, SchemaError):
                    raise
                self._core._retention_failed(exc)
        if self._core._target_ids_due(full):
            try:
                await conn.execute(_ops("refresh_target_ids"))
            except psycopg.Error as exc:
                if conn.broken or conn.closed:
                    raise
                self._core._target_ids_failed(exc)
        if self._core._horizon.due():
            try:
                self._core._horizon_seen(await horizon.aholders(conn))
            except psycopg.Error as exc:
                if conn.broken or conn.closed:
                    raise
                self._core._horizon_failed(exc)
        self._core._end_round()
        return got, full, busy

    # -- waiting ------------------------------------------------------------

    async def _sleep(self, seconds: float) -> bool:
        """Wait up to ``seconds`` or until stopped; True when stopped."""
        assert self._wake is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout=seconds)
        return self.stopping

    async def _wait(self, conn: AsyncConn, seconds: float) -> None:
        """Wait up to ``seconds``; return early when stopped or (listening) notified."""
        if not self._listening or conn.closed:
            await self._sleep(seconds)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while not self.stopping:
            left = deadline - loop.time()
            if left <= 0:
                return
            try:
                async for _ in conn.notifies(timeout=min(left, 0.25), stop_after=1):
                    with self._core._lock:
                        self._core._stats.wakeups += 1
                    return
            except psycopg.OperationalError:
                return  # the next round finds the broken connection and reconnects
