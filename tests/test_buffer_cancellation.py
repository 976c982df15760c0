"""Buffers interrupted at every step of a flush: nothing acknowledged is lost or doubled.

The async buffer's flush is cancelled at each of its waits on the connection in turn (the
statement under way, or its result just in), on a plain pool (not autocommit, as most
applications create it), an autocommit pool, and a single connection with and without
autocommit; the sync buffer's flush is interrupted (``KeyboardInterrupt``) at each line of
pgcounters it runs. Each case is judged against the increments the test acknowledged.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import linecache
import sys
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

import pgcounters
from pgcounters import AsyncBatchingCounters, Counters
from pgcounters.batching import BatchingCounters
from pgcounters.connection import Conn

Truth = collections.Counter[tuple[str, int]]
NAMES = ("q", "u", "d")  # one counter of each mode: queued, unlogged, direct
KINDS = ("pool", "autocommit pool", "connection", "autocommit connection")
SETTINGS = ("serializable pool", "serializable connection")
"""Other connection settings a pool or a connection may come with: the same flushes."""


class _Arm:
    """Which task to cancel, at which wait on a connection (of any task), and how."""

    def __init__(self) -> None:
        self.task: asyncio.Task[Any] | None = None
        self.at = 0
        self.mode = "after"
        self.target = "caller"
        self.seen = 0
        self.fired = False

    def set(self, task: asyncio.Task[Any], at: int, mode: str, target: str) -> None:
        self.task, self.at, self.mode, self.target = task, at, mode, target
        self.seen, self.fired = 0, False

    def victim(self) -> asyncio.Task[Any]:
        """The task cancelled: the one that called flush(), or the one waiting now."""
        victim = self.task if self.target == "caller" else asyncio.current_task()
        assert victim is not None
        return victim

    def clear(self) -> bool:
        fired, self.task = self.fired, None
        return fired


ARM = _Arm()


class InterruptedConnection(psycopg.AsyncConnection[Any]):
    """A real connection; at the armed wait a task is cancelled: ``during`` (the statement is
    under way, as ``task.cancel()`` from elsewhere would do) or ``after`` (its result came
    in, and the task is cancelled before it goes on)."""

    async def wait(self, gen: Any, *args: Any, **kwargs: Any) -> Any:
        arm = ARM
        mine = arm.task is not None and not arm.fired
        if mine:
            arm.seen += 1
            mine = arm.seen == arm.at
        if mine and arm.mode == "during":
            arm.fired = True
            arm.victim().cancel()
        result = await super().wait(gen, *args, **kwargs)
        if mine and arm.mode == "after":
            arm.fired = True
            arm.victim().cancel()
            await asyncio.sleep(0)  # delivered here when the victim is the waiting task
        return result


@asynccontextmanager
async def database(
    kind: str, dsn: str
) -> AsyncIterator[AsyncConnectionPool[Any] | psycopg.AsyncConnection[Any]]:
    autocommit = kind.startswith("autocommit")
    kwargs: dict[str, Any] = {"autocommit": True} if autocommit else {}
    if kind.startswith("serializable"):
        # every transaction serializable, statements prepared at once, a short timeout
        kwargs["options"] = (
            "-c default_transaction_isolation=serializable -c statement_timeout=30000"
        )
        kwargs["prepare_threshold"] = 0
    if kind.endswith("pool"):
        async with AsyncConnectionPool(
            dsn,
            min_size=1,
            max_size=2,
            open=False,
            connection_class=InterruptedConnection,
            kwargs=kwargs,
        ) as pool:
            yield pool
    else:
        aconn = await InterruptedConnection.connect(dsn, **kwargs)
        async with aconn:
            yield aconn


def declare(pc: Counters) -> None:
    pc.create_counter("q", key=int)
    pc.create_counter("u", key=int, mode="unlogged")
    pc.create_counter("d", key=int, mode="direct")


def values(pc: Counters) -> Truth:
    found: Truth = collections.Counter()
    for name in NAMES:
        for k in range(3):
            value = pc.get(name, k)
            if value:
                found[(name, k)] = value
    return found


def open_transactions(conn: Conn) -> int:
    """Sessions of the test's database left inside a transaction."""
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND state LIKE 'idle in transaction%%' AND pid <> pg_backend_pid()"
    ).fetchone()
    assert row is not None
    return int(row[0])


async def acknowledge(events: AsyncBatchingCounters, truth: Truth, delta: int) -> None:
    for name in NAMES:
        for k in range(3):
            await events.incr(name, k, delta)
            truth[(name, k)] += delta


async def cancelled_at(
    flush: Callable[[], Any], at: int, mode: str, target: str = "caller"
) -> bool:
    """Run ``flush()`` as a task cancelled (or its write cancelled: ``target="writer"``) at
    the ``at``-th wait of the flush on a connection; whether it was."""
    task = asyncio.create_task(flush())
    ARM.set(task, at, mode, target)
    with contextlib.suppress(asyncio.CancelledError):
        await task
    fired = ARM.clear()
    assert task.cancelled() == fired  # a cancellation is never swallowed
    return fired


@pytest.mark.parametrize("target", ["caller", "writer"])
@pytest.mark.parametrize("mode", ["during", "after"])
@pytest.mark.parametrize("kind", KINDS + SETTINGS)
def test_a_flush_cancelled_at_any_wait_loses_and_doubles_nothing(
    dsn: str, pc: Counters, conn: Conn, kind: str, mode: str, target: str
) -> None:
    """``caller``: the task awaiting ``flush()`` is cancelled (the write goes on, shielded);
    ``writer``: the write itself is cancelled, as when every task of the loop is cancelled
    at shutdown before ``aclose()`` runs."""
    declare(pc)
    truth: Truth = collections.Counter()
    cases = 0

    async def main() -> None:
        nonlocal cases
        async with database(kind, dsn) as db:
            events = AsyncBatchingCounters(db, interval=None)
            at = 1
            while True:
                await acknowledge(events, truth, at)
                fired = await cancelled_at(events.flush, at, mode, target)
                await events.flush()  # the next flush works (after the one cancelled)
                assert open_transactions(conn) == 0
                assert events.pending() == 0
                assert values(pc) == truth, f"cancelled at wait {at}"
                if not fired:
                    break
                cases += 1
                at += 1
            await events.aclose()

    asyncio.run(main())
    assert cases >= 4  # BEGIN, statements, COPY, COMMIT: every wait of a flush was tried
    assert values(pc) == truth


@pytest.mark.parametrize("kind", KINDS)
def test_the_retry_of_a_batch_in_doubt_cancelled_at_any_wait_counts_it_once(
    dsn: str, pc: Counters, conn: Conn, kind: str
) -> None:
    """A batch cancelled after its COMMIT was sent is in doubt; its retry is cancelled in
    turn at each of its waits (the lookup of its flush id among them); then it is written
    or found, once."""
    declare(pc)
    truth: Truth = collections.Counter()
    commits = 0

    async def main() -> None:
        nonlocal commits
        async with database(kind, dsn) as db:
            events = AsyncBatchingCounters(db, interval=None)
            # the wait of the COMMIT: the last one of a flush without lookups
            await acknowledge(events, truth, 1)
            await events.flush()
            waits = 1
            while True:
                await acknowledge(events, truth, 1)
                if not await cancelled_at(events.flush, waits, "during", "writer"):
                    break
                await events.flush()
                waits += 1
            commit_wait = waits - 1
            at = 1
            while True:
                await acknowledge(events, truth, 1)
                assert await cancelled_at(events.flush, commit_wait, "during", "writer")
                fired = await cancelled_at(events.flush, at, "after", "writer")
                await events.flush()
                assert open_transactions(conn) == 0
                assert values(pc) == truth, f"retry cancelled at wait {at}"
                if not fired:
                    break
                at += 1
            await events.aclose()

    asyncio.run(main())
    assert values(pc) == truth


def block_with_lock(conn: Conn) -> None:
    """Make writes to the queue wait: ``conn`` holds a lock on it until it commits."""
    conn.execute("BEGIN")
    conn.execute("LOCK TABLE pgcounters.queue IN ACCESS EXCLUSIVE MODE")


def waiting_writers(conn: Conn) -> int:
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND wait_event_type = 'Lock'"
    ).fetchone()
    assert row is not None
    return int(row[0])


async def until(condition: Callable[[], bool], seconds: float = 30.0) -> None:
    for _ in range(int(seconds * 100)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached in time")


def test_a_flush_cancelled_mid_write_on_a_plain_pool_then_flush_again(
    dsn: str, pc: Counters, conn: Conn
) -> None:
    """The report's repro: a flush task cancelled while its write waits, then flush()."""
    pc.create_counter("c", key=int)

    async def main() -> None:
        with psycopg.connect(dsn, autocommit=True) as locker:
            async with AsyncConnectionPool(dsn, min_size=1, max_size=2, open=False) as pool:
                events = AsyncBatchingCounters(pool, interval=None)
                for i in range(100):
                    await events.incr("c", i % 4)
                block_with_lock(locker)
                task = asyncio.create_task(events.flush())
                await until(lambda: waiting_writers(conn) == 1)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                locker.execute("COMMIT")
                # the write the cancelled flush began goes on, and commits on its own
                await until(lambda: [pc.get("c", k) for k in range(4)] == [25] * 4, 10.0)
                await events.flush()
                assert events.pending() == 0
                await events.aclose()

    asyncio.run(main())
    assert [pc.get("c", k) for k in range(4)] == [25, 25, 25, 25]
    assert open_transactions(conn) == 0


@pytest.mark.parametrize("kind", KINDS)
def test_aclose_while_the_flusher_writes_writes_everything_acknowledged(
    dsn: str, pc: Counters, conn: Conn, kind: str
) -> None:
    """A service's lifespan ends while its flusher's write waits: ``aclose()`` writes
    everything acknowledged, every time."""
    pc.create_counter("c", key=int)
    acknowledged = 0

    async def main() -> None:
        nonlocal acknowledged
        with psycopg.connect(dsn, autocommit=True) as locker:
            for _ in range(3):
                async with database(kind, dsn) as db:
                    events = AsyncBatchingCounters(db, interval=0.01, max_pending=50)
                    events.start()
                    for i in range(120):
                        await events.incr("c", i % 3)
                        acknowledged += 1
                    block_with_lock(locker)
                    await events.incr("c", 0)  # the flusher is woken and waits on the lock
                    acknowledged += 1
                    await until(lambda: waiting_writers(conn) == 1)
                    closing = asyncio.create_task(events.aclose())
                    await asyncio.sleep(0.05)
                    locker.execute("COMMIT")
                    await closing
                    assert events.pending() == 0

    asyncio.run(main())
    assert sum(pc.get("c", k) for k in range(3)) == acknowledged
    assert open_transactions(conn) == 0


def test_a_flush_cancelled_while_waiting_for_a_pool_connection(
    dsn: str, pc: Counters, conn: Conn
) -> None:
    pc.create_counter("c")

    async def main() -> None:
        async with AsyncConnectionPool(dsn, min_size=1, max_size=1, open=False) as pool:
            events = AsyncBatchingCounters(pool, interval=None)
            await events.incr("c", delta=7)
            async with pool.connection():  # the pool's only connection is held
                task = asyncio.create_task(events.flush())
                await asyncio.sleep(0.05)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            await events.flush()
            assert events.pending() == 0
            await events.aclose()

    asyncio.run(main())
    assert pc.get("c") == 7


# -- the thread-based buffer: interrupted at every line ------------------------------

PACKAGE = str(Path(pgcounters.__file__).parent)


class _Interrupt:
    """A tracer raising KeyboardInterrupt (as a Ctrl-C would) at the first line of
    pgcounters' code run by this thread that is not in ``done``, which it adds there."""

    def __init__(self, done: set[tuple[str, int]]) -> None:
        self.done = done
        self.fired = False

    def __call__(self, frame: FrameType, event: str, arg: object) -> Any:
        if self.fired or not frame.f_code.co_filename.startswith(PACKAGE):
            return None
        if event == "line":
            where = (frame.f_code.co_filename, frame.f_lineno)
            # a bare ``try:`` is a no-op where no signal is delivered (and CPython does not
            # unwind an enclosing ``with`` for an exception a tracer raises there)
            if where not in self.done and linecache.getline(*where).strip() != "try:":
                self.done.add(where)
                self.fired = True
                raise KeyboardInterrupt(f"line {where[0]}:{where[1]}")
        return self


def interrupted(call: Callable[[], object], done: set[tuple[str, int]]) -> bool:
    """Run ``call()`` interrupted at the first line of pgcounters not in ``done``; whether
    it was (False: it ran to its end without a new line)."""
    tracer = _Interrupt(done)
    sys.settrace(tracer)
    try:
        call()
    except KeyboardInterrupt:
        pass
    finally:
        sys.settrace(None)
    return tracer.fired


@pytest.mark.parametrize("given", ["dsn", "connection", "autocommit connection"])
def test_a_sync_flush_interrupted_at_any_line_loses_and_doubles_nothing(
    dsn: str, pc: Counters, conn: Conn, given: str
) -> None:
    declare(pc)
    truth: Truth = collections.Counter()
    own = None if given == "dsn" else psycopg.connect(dsn, autocommit=given != "connection")
    events = BatchingCounters(own or dsn, interval=None, flush_at_exit=False)
    done: set[tuple[str, int]] = set()
    try:
        while True:
            for name in NAMES:
                for k in range(3):
                    events.incr(name, k, len(done) + 1)
                    truth[(name, k)] += len(done) + 1
            fired = interrupted(events.flush, done)
            assert open_transactions(conn) == 0
            events.flush()
            assert events.pending() == 0
            assert values(pc) == truth, f"interrupted at the {len(done)}th line"
            if not fired:
                break
        events.close()
    finally:
        if own is not None:
            own.close()
    assert len(done) > 50  # every line a flush runs was interrupted once
    assert values(pc) == truth


def test_close_while_the_flusher_thread_writes_writes_everything(
    dsn: str, pc: Counters, conn: Conn
) -> None:
    pc.create_counter("c", key=int)
    with psycopg.connect(dsn, autocommit=True) as locker:
        events = BatchingCounters(dsn, interval=0.01, max_pending=50, flush_at_exit=False)
        for i in range(120):
            events.incr("c", i % 3)
        block_with_lock(locker)
        events.incr("c", 0)
        deadline = 3000
        while waiting_writers(conn) != 1 and deadline:
            threading.Event().wait(0.01)
            deadline -= 1
        closing = threading.Thread(target=events.close)
        closing.start()
        threading.Event().wait(0.05)
        locker.execute("COMMIT")
        closing.join()
    assert sum(pc.get("c", k) for k in range(3)) == 121
    assert events.pending() == 0


@pytest.mark.parametrize("given", ["dsn", "connection"])
def test_a_redis_flush_interrupted_at_any_line_loses_and_doubles_nothing(
    dsn: str, pc: Counters, conn: Conn, tmp_path: Path, given: str
) -> None:
    from pgcounters.demos.redis_server import EmbeddedRedis
    from pgcounters.redis_buffer import RedisBuffer

    declare(pc)
    truth: Truth = collections.Counter()
    own = None if given == "dsn" else psycopg.connect(dsn)  # not in autocommit mode
    done: set[tuple[str, int]] = set()
    try:
        with (
            EmbeddedRedis(tmp_path / "redis") as server,
            RedisBuffer(own or dsn, server.url()) as buf,
        ):
            while True:
                for name in NAMES:
                    for k in range(3):
                        buf.incr(name, k, len(done) + 1)
                        truth[(name, k)] += len(done) + 1
                fired = interrupted(buf.flush, done)
                assert open_transactions(conn) == 0
                buf.flush()
                assert buf.pending() == (0, 0)
                assert values(pc) == truth, f"interrupted at the {len(done)}th line"
                if not fired:
                    break
    finally:
        if own is not None:
            own.close()
    assert len(done) > 50
    assert values(pc) == truth


def test_a_service_shutting_down_on_a_plain_pool_writes_everything_it_acknowledged(
    dsn: str, pc: Counters, conn: Conn
) -> None:
    """The report's service: request tasks incrementing while the flusher writes, and the
    lifespan's ``aclose()`` at an arbitrary moment, fifteen times."""
    pc.create_counter("views", key=int)
    acknowledged: collections.Counter[int] = collections.Counter()

    async def request(events: AsyncBatchingCounters, r: int) -> None:
        for i in range(60):
            await events.incr("views", (r + i) % 5)
            acknowledged[(r + i) % 5] += 1
            if i % 7 == 0:
                await asyncio.sleep(0.001)

    async def main() -> None:
        async with AsyncConnectionPool(dsn, min_size=2, max_size=2, open=False) as pool:
            for run in range(15):
                events = AsyncBatchingCounters(pool, interval=0.002, max_pending=40)
                events.start()
                await asyncio.gather(*(request(events, r) for r in range(8)))
                await asyncio.sleep(0.001 * run)  # the flusher caught at another point
                await events.aclose()
                assert events.pending() == 0

    asyncio.run(main())
    assert {k: pc.get("views", k) for k in range(5)} == dict(acknowledged)
    assert open_transactions(conn) == 0


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_flusher_thread_that_dies_loses_nothing(dsn: str, pc: Counters, conn: Conn) -> None:
    """The background thread dies (its ``on_error`` raised SystemExit): the buffer keeps the
    batch it failed to write, a full buffer is written by the ``incr`` that fills it, and
    ``close()`` writes the rest."""
    from test_batching import block_queue_writes, unblock_queue_writes

    pc.create_counter("c", key=int)

    def die(exc: BaseException) -> None:
        raise SystemExit(f"the flusher's error handler ended its thread: {exc}")

    block_queue_writes(conn)
    events = BatchingCounters(dsn, interval=0.01, max_pending=30, on_error=die)
    for i in range(10):
        events.incr("c", i % 2)
    thread = events._thread
    assert thread is not None
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert events.pending() == 10  # the failed batch is kept
    unblock_queue_writes(conn)
    for i in range(30):  # the 30th new increment fills the buffer: written by that incr
        events.incr("c", i % 2)
    assert events.pending() == 0
    assert (pc.get("c", 0), pc.get("c", 1)) == (20, 20)
    for _ in range(4):
        events.incr("c", 0)
    events.close()
    assert (pc.get("c", 0), pc.get("c", 1)) == (24, 20)


@pytest.mark.parametrize("given", ["dsn", "connection", "autocommit connection"])
def test_ctrl_c_while_a_sync_flush_waits_for_the_database(
    dsn: str, pc: Counters, conn: Conn, given: str
) -> None:
    """A real KeyboardInterrupt (``_thread.interrupt_main``, as Ctrl-C) while the flush's
    write waits on a lock: the driver cancels the statement, the batch is kept, and the
    next flush writes it once."""
    import _thread

    pc.create_counter("c", key=int)
    own = None if given == "dsn" else psycopg.connect(dsn, autocommit=given != "connection")
    events = BatchingCounters(own or dsn, interval=None, flush_at_exit=False)
    try:
        for i in range(90):
            events.incr("c", i % 3)
        with psycopg.connect(dsn, autocommit=True) as locker:
            block_with_lock(locker)

            stop = threading.Event()

            def interrupt_when_waiting() -> None:
                with psycopg.connect(dsn, autocommit=True) as observer:
                    while not stop.wait(0.01):
                        if waiting_writers(observer) == 1:
                            _thread.interrupt_main()
                            return

            watcher = threading.Thread(target=interrupt_when_waiting)
            watcher.start()
            try:
                with pytest.raises(KeyboardInterrupt):
                    events.flush()
            finally:
                stop.set()
                watcher.join()
            locker.execute("COMMIT")
        assert events.pending() == 90
        events.flush()
        assert open_transactions(conn) == 0
        assert [pc.get("c", k) for k in range(3)] == [30, 30, 30]
        events.close()
    finally:
        if own is not None:
            own.close()


class InterruptedSyncConnection(psycopg.Connection[Any]):
    """A real connection raising KeyboardInterrupt right after its ``interrupt_at``-th wait
    (a Ctrl-C arriving as a result comes in); 0: never."""

    interrupt_at = 0
    seen = 0
    fired = False

    def wait(self, gen: Any, *args: Any, **kwargs: Any) -> Any:
        result = super().wait(gen, *args, **kwargs)
        if self.interrupt_at and not self.fired:
            self.seen += 1
            if self.seen == self.interrupt_at:
                self.fired = True
                raise KeyboardInterrupt(f"after wait {self.seen}")
        return result


@pytest.mark.parametrize("autocommit", [False, True])
def test_ctrl_c_after_any_wait_of_a_sync_flush_on_a_given_connection(
    dsn: str, pc: Counters, conn: Conn, autocommit: bool
) -> None:
    """A given connection is left as the interrupt found it (mid-COPY, in a transaction):
    the buffer brings it back to idle, and the next flush writes everything once."""
    declare(pc)
    truth: Truth = collections.Counter()
    given = InterruptedSyncConnection.connect(dsn, autocommit=autocommit)
    events = BatchingCounters(given, interval=None, flush_at_exit=False)
    at = 1
    try:
        while True:
            for name in NAMES:
                for k in range(3):
                    events.incr(name, k, at)
                    truth[(name, k)] += at
            given.interrupt_at, given.seen, given.fired = at, 0, False
            with contextlib.suppress(KeyboardInterrupt):
                events.flush()
            fired, given.interrupt_at = given.fired, 0
            events.flush()
            assert open_transactions(conn) == 0
            assert values(pc) == truth, f"interrupted after wait {at}"
            if not fired:
                break
            at += 1
        events.close()
    finally:
        given.close()
    assert at > 4
    assert values(pc) == truth
