"""The async worker: in the application's event loop or alone, against a real PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import psycopg
import pytest

from pgcounters import AsyncCounters, Counters
from pgcounters.async_worker import AsyncWorker
from pgcounters.connection import Conn
from pgcounters.errors import ConfigurationError, ConnectionFailed, SchemaNotInstalled
from pgcounters.worker import WorkerSettings
from support import queued


async def until(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """Yield to the loop until ``condition()`` holds; fail the test after ``timeout``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"not reached in time: {what}")
        await asyncio.sleep(0.02)


def test_the_worker_drains_beside_the_application_in_its_loop(dsn: str, conn: Conn) -> None:
    Counters(conn).create_counter("views", int)
    Counters(conn).create_counter("hits", None, mode="unlogged")

    async def main() -> None:
        aconn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        async with (
            aconn,
            AsyncWorker(dsn, WorkerSettings(batch_size=50, max_batch_size=50)) as worker,
        ):
            pc = AsyncCounters(aconn)
            for i in range(300):
                await pc.incr("views", i % 7)
                await pc.incr("hits")
            await until(lambda: worker.get_stats().deltas == 600, "every delta applied")
            assert await pc.pending() == (0, 0)
            assert await pc.get_many("views", range(7), exact=False) == [
                len(range(k, 300, 7)) for k in range(7)
            ]
            assert await pc.get("hits", exact=False) == 300
            # it lists the counters' ids for the triggers of declared counters, as the sync
            # worker does
            await until(
                lambda: (
                    conn.execute(
                        "SELECT pgcounters._target_id(pgcounters._target_identity('views',"
                        " '{bigint}', 'queued', NULL, NULL, NULL, NULL))"
                        " = (SELECT id FROM pgcounters.targets WHERE name = 'views')"
                    ).fetchone()
                    == (True,)
                ),
                "the counter listed",
            )
        stats = worker.get_stats()
        assert stats.deltas == 600
        assert stats.batches >= 12  # batches of at most 50
        assert stats.errors == 0

    asyncio.run(main())
    assert queued(conn) == 0


def test_a_listening_worker_wakes_on_a_notification_and_stops_at_once(dsn: str, conn: Conn) -> None:
    pc = Counters(conn)
    pc.create_counter("c", int)
    conn.execute("SELECT pgcounters.enable_wakeups(interval '10 milliseconds')")

    async def main() -> None:
        # polling alone would not come back for an hour
        worker = AsyncWorker(dsn, WorkerSettings(listen=True, min_interval=3600, max_interval=3600))
        worker.start()
        await until(lambda: worker.get_stats().rounds >= 1, "a first round")
        pc.incr("c", 1, 5)
        await until(lambda: queued(conn) == 0, "the delta drained after the notification")
        assert worker.get_stats().wakeups >= 1
        # stopping interrupts the hour-long wait: the task ends well within the bound
        stats = await asyncio.wait_for(worker.aclose(), timeout=30)
        assert stats.deltas == 1

    asyncio.run(main())
    assert pc.get("c", 1, exact=False) == 5


def test_a_polling_worker_stopped_from_another_thread(dsn: str, conn: Conn) -> None:
    Counters(conn).create_counter("c", int)
    worker = AsyncWorker(dsn, WorkerSettings(min_interval=3600, max_interval=3600))

    async def main() -> None:
        task = worker.start()
        await until(lambda: worker.get_stats().rounds >= 1, "a first round")
        # as a signal handler or another thread would
        await asyncio.get_running_loop().run_in_executor(None, worker.stop)
        await asyncio.wait_for(task, timeout=30)

    asyncio.run(main())
    assert worker.get_stats().rounds == 1


def test_a_worker_stopped_before_it_starts_returns_at_once(dsn: str) -> None:
    worker = AsyncWorker(dsn)
    worker.stop()
    stats = asyncio.run(worker.run())
    assert stats.rounds == 0


def test_the_worker_reconnects_after_losing_its_connection(dsn: str, conn: Conn) -> None:
    pc = Counters(conn)
    pc.create_counter("c", int)
    settings = WorkerSettings(
        min_interval=0.01, max_interval=0.05, reconnect_min=0.01, reconnect_max=0.05
    )

    async def main() -> None:
        async with AsyncWorker(dsn, settings) as worker:
            await until(lambda: worker.get_stats().rounds >= 1, "a first round")
            killed = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = %s AND pid <> pg_backend_pid()",
                (settings.application_name,),
            ).fetchall()
            assert killed == [(True,)]
            await until(lambda: worker.get_stats().reconnects >= 1, "a reconnection")
            pc.incr("c", 1, 3)
            await until(lambda: queued(conn) == 0, "the delta drained after the reconnection")

    asyncio.run(main())
    assert pc.get("c", 1, exact=False) == 3


def test_the_first_connection_fails_clearly(dsn: str, empty_dsn: str) -> None:
    with pytest.raises(ConnectionFailed, match="invalid DSN"):
        asyncio.run(AsyncWorker("not a dsn at all").run())
    with pytest.raises(SchemaNotInstalled):
        asyncio.run(AsyncWorker(empty_dsn).run())


def test_a_lingering_worker_gathers_the_deltas_of_its_linger_in_one_batch(
    dsn: str, conn: Conn
) -> None:
    Counters(conn).create_counter("views", int)
    settings = WorkerSettings(min_interval=0.01, max_interval=0.05, linger=5.0)

    async def main() -> None:
        aconn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        async with aconn, AsyncWorker(dsn, settings) as worker:
            pc = AsyncCounters(aconn)
            await pc.incr("views", 1)
            await until(lambda: worker.get_stats().batches == 1, "the first batch")
            first = worker.get_stats().rounds  # the round of that batch, or the one before it
            # the worker now lingers: the deltas written meanwhile (each awaited, so the
            # worker's task could run between them) wait for one batch
            for i in range(20):
                await pc.incr("views", i % 4)
            await until(lambda: queued(conn) == 0, "every delta applied")
        stats = worker.get_stats()
        assert (stats.batches, stats.deltas, stats.errors) == (2, 21, 0)
        assert stats.rounds <= first + 2

    asyncio.run(main())
    assert [Counters(conn).get("views", k) for k in range(4)] == [5, 6, 5, 5]


def test_stopping_a_lingering_worker_does_not_wait_for_the_linger(dsn: str, conn: Conn) -> None:
    pc = Counters(conn)
    pc.create_counter("views", int)
    settings = WorkerSettings(min_interval=0.01, max_interval=0.05, linger=600.0)

    async def main() -> None:
        worker = AsyncWorker(dsn, settings)
        worker.start()
        pc.incr("views", 1)
        await until(lambda: worker.get_stats().batches == 1, "the first batch")
        # the worker lingers now; closing it ends the linger (the test's own timeout,
        # far below the linger, fails it otherwise)
        await asyncio.wait_for(worker.aclose(), timeout=30)

    asyncio.run(main())


def test_a_worker_asked_to_report_changes_is_refused(dsn: str) -> None:
    """The async worker reports no changes: asked to, it says so rather than leave
    listeners waiting."""
    with pytest.raises(ConfigurationError, match="does not report changes"):
        AsyncWorker(dsn, WorkerSettings(notify=True))
    assert AsyncWorker(dsn, WorkerSettings(notify=False)).settings.notify is False
