"""The batching incrementer, on a real PostgreSQL."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

import psycopg
import pytest

from pgcounters import Counters
from pgcounters.batching import BatchingCounters
from pgcounters.connection import Conn
from pgcounters.errors import (
    BufferClosed,
    BufferFlushFailed,
    BufferFull,
    ConfigurationError,
    InvalidDelta,
    InvalidKey,
    UnknownCounter,
)


def block_queue_writes(conn: Conn) -> None:
    """Make every INSERT of a positive delta into the queue fail."""
    conn.execute(
        "ALTER TABLE pgcounters.queue ADD CONSTRAINT block_writes CHECK (delta < 0) NOT VALID"
    )


def unblock_queue_writes(conn: Conn) -> None:
    conn.execute("ALTER TABLE pgcounters.queue DROP CONSTRAINT block_writes")


def test_threads_incrementing_are_counted_exactly(dsn: str, pc: Counters) -> None:
    pc.create_counter("views", key=int)
    pc.create_counter("hits")
    threads, per_thread, keys = 8, 1500, 13
    batcher = BatchingCounters(dsn, max_pending=500, interval=0.01)

    def work(t: int) -> None:
        for i in range(per_thread):
            batcher.incr("views", (t * per_thread + i) % keys)
            batcher.incr("hits")

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    batcher.close()
    assert batcher.pending() == 0
    expected = [0] * keys
    for n in range(threads * per_thread):
        expected[n % keys] += 1
    assert pc.get_many("views", range(keys)) == expected
    assert pc.get("hits") == threads * per_thread
    # written as batches of netted deltas, not one row per increment
    logged, _ = pc.pending()
    assert logged < threads * per_thread
    pc.drain()
    assert pc.get_many("views", range(keys), exact=False) == expected


def test_writes_on_size_without_a_flusher_thread(dsn: str, pc: Counters) -> None:
    pc.create_counter("c")
    batcher = BatchingCounters(dsn, max_pending=10, interval=None, flush_at_exit=False)
    for _ in range(25):
        batcher.incr("c")
    assert pc.get("c") == 20
    assert batcher.pending() == 5
    assert batcher.get("c") == 25  # the database plus what this process holds
    batcher.close()
    assert pc.get("c") == 25


def test_writes_on_time(dsn: str, pc: Counters) -> None:
    pc.create_counter("c")
    with BatchingCounters(dsn, max_pending=1_000_000, interval=0.05) as batcher:
        batcher.incr("c", delta=7)
        deadline = time.monotonic() + 10
        while pc.get("c") != 7 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert pc.get("c") == 7
        assert batcher.pending() == 0


def test_a_failed_write_keeps_the_deltas(dsn: str, pc: Counters, conn: Conn) -> None:
    pc.create_counter("c", key=int)
    errors: list[BaseException] = []
    batcher = BatchingCounters(
        dsn, interval=None, flush_at_exit=False, on_error=errors.append, max_pending=5
    )
    block_queue_writes(conn)
    batcher.incr_many([("c", 1, 2), ("c", 2, 3)])
    with pytest.raises(BufferFlushFailed, match="they are kept"):
        batcher.flush()
    for _ in range(5):  # reaching max_pending tries a write, which fails and is reported
        batcher.incr("c", 1)
    assert errors
    assert isinstance(errors[-1], BufferFlushFailed)
    assert batcher.last_error is errors[-1]
    assert batcher.pending() == 7
    assert pc.get("c", 1) == 0
    unblock_queue_writes(conn)
    stats = batcher.flush()
    assert stats.increments == 7
    assert (pc.get("c", 1), pc.get("c", 2)) == (7, 3)
    assert batcher.last_error is None
    batcher.close()
    # each batch recorded once in the flush log
    rows = conn.execute("SELECT count(*) FROM pgcounters.buffer_flushes").fetchone()
    assert rows is not None
    assert rows[0] == stats.batches


def test_a_broken_connection_is_reopened(dsn: str, pc: Counters) -> None:
    pc.create_counter("c")
    batcher = BatchingCounters(dsn, interval=None, flush_at_exit=False)
    batcher.incr("c")
    batcher.flush()
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() AND pid <> %s",
            (pc.conn.info.backend_pid,),
        )
    batcher.incr("c", delta=2)
    try:
        batcher.flush()
    except BufferFlushFailed:
        batcher.flush()  # the failed batch is looked up and written once
    assert pc.get("c") == 3
    batcher.close()


def test_when_writes_keep_failing_the_buffer_refuses_new_keys(
    dsn: str, pc: Counters, conn: Conn
) -> None:
    pc.create_counter("c", key=int)
    batcher = BatchingCounters(dsn, interval=None, flush_at_exit=False, max_buffered=4)
    block_queue_writes(conn)
    for k in range(3):
        batcher.incr("c", k)
    with pytest.raises(BufferFlushFailed):
        batcher.flush()
    batcher.incr("c", 0)  # the failed batch holds 3 keys; the buffer takes a 4th
    batcher.incr("c", 0)  # an existing key still nets in
    with pytest.raises(BufferFull, match=r"max_buffered=4.*block_writes"):
        batcher.incr("c", 99)
    assert batcher.pending() == 5
    unblock_queue_writes(conn)
    batcher.close()
    assert [pc.get("c", k) for k in (0, 1, 2, 99)] == [3, 1, 1, 0]


def test_bad_input_is_refused_at_incr_and_nothing_is_buffered(dsn: str, pc: Counters) -> None:
    pc.create_counter("c", key=int)
    batcher = BatchingCounters(dsn, interval=None, flush_at_exit=False)
    with pytest.raises(UnknownCounter):
        batcher.incr("missing")
    with pytest.raises(InvalidKey):
        batcher.incr("c", "not an int")
    with pytest.raises(InvalidDelta):
        batcher.incr("c", 1, 2**63)
    with pytest.raises(InvalidKey):  # all or none
        batcher.incr_many([("c", 1, 1), ("c", None, 1)])
    batcher.incr("c", 1, 2**63 - 1)
    with pytest.raises(InvalidDelta, match="flush first"):
        batcher.incr("c", 1, 1)
    assert batcher.pending() == 1
    with pytest.raises(ConfigurationError):
        BatchingCounters(dsn, max_pending=0)
    with pytest.raises(ConfigurationError):
        BatchingCounters(dsn, interval=0)
    batcher.close()
    with pytest.raises(BufferClosed):
        batcher.incr("c", 1)


def test_increments_in_a_transaction_count_only_if_it_commits(
    dsn: str, pc: Counters, conn: Conn
) -> None:
    pc.create_counter("c")
    conn.execute("CREATE TABLE page (id int)")
    batcher = BatchingCounters(dsn, interval=None, flush_at_exit=False)

    def failing_request() -> None:
        with batcher.transaction(conn) as group:
            conn.execute("INSERT INTO page VALUES (1)")
            group.incr("c")
            raise RuntimeError("the request failed")

    with pytest.raises(RuntimeError):
        failing_request()
    with batcher.transaction(conn) as group:
        group.incr("c")
        raise psycopg.Rollback()
    assert batcher.pending() == 0
    with batcher.transaction(conn) as group:
        conn.execute("INSERT INTO page VALUES (2)")
        group.incr("c", delta=5)
        assert batcher.pending() == 0  # not before COMMIT
    assert batcher.pending() == 1
    with conn.transaction(), pytest.raises(ConfigurationError, match="outermost"):  # noqa: SIM117
        with batcher.transaction(conn):
            pass
    batcher.close()
    assert pc.get("c") == 5
    row = conn.execute("SELECT array_agg(id) FROM page").fetchone()
    assert row == ([2],)


def _python(code: str, dsn: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), dsn],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_process_exit_writes_the_buffer_and_sigkill_loses_only_the_unflushed(
    dsn: str, pc: Counters
) -> None:
    pc.create_counter("c")
    done = _python(
        """
        import sys
        from pgcounters.batching import BatchingCounters
        b = BatchingCounters(sys.argv[1], interval=None, max_pending=10**6)
        for _ in range(100):
            b.incr("c")
        """,
        dsn,
    )
    assert done.returncode == 0, done.stderr
    assert pc.get("c") == 100  # written by the atexit hook
    killed = _python(
        """
        import os, signal, sys
        from pgcounters.batching import BatchingCounters
        b = BatchingCounters(sys.argv[1], interval=None, max_pending=10**6)
        for _ in range(30):
            b.incr("c")
        b.flush()
        for _ in range(5):
            b.incr("c")
        os.kill(os.getpid(), signal.SIGKILL)
        """,
        dsn,
    )
    assert killed.returncode == -9
    # the documented window: what was not flushed when the process died
    assert pc.get("c") == 130


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_does_not_write_the_parents_buffer(dsn: str, pc: Counters) -> None:
    pc.create_counter("c")
    batcher = BatchingCounters(dsn, interval=None, flush_at_exit=False)
    batcher.incr("c", delta=10)
    pid = os.fork()
    if pid == 0:  # the child
        code = 1
        try:
            batcher.incr("c", delta=1)
            batcher.flush()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert batcher.pending() == 1
    batcher.close()
    assert pc.get("c") == 11


def test_a_dropped_counter_holds_back_only_its_own_increments(dsn: str, pc: Counters) -> None:
    """One counter dropped while its increments were buffered used to stop every flush:
    the other counters' acknowledged increments were never written."""
    pc.create_counter("a", key=int)
    pc.create_counter("b", key=int)
    batcher = BatchingCounters(dsn, max_pending=1000, interval=None, flush_at_exit=False)
    try:
        batcher.incr("a", 1, 3)
        batcher.incr("b", 1, 4)
        pc.drop_counter("b")
        with pytest.raises(BufferFlushFailed, match="'b' was dropped"):
            batcher.flush()
        assert pc.get("a", 1) == 3  # written all the same
        assert batcher.pending() == 1  # b's, kept
        batcher.incr("a", 2, 5)
        with pytest.raises(BufferFlushFailed, match="'b' was dropped"):
            batcher.flush()
        assert pc.get("a", 2) == 5  # not held up by b either
        pc.create_counter("b", key=int)
        batcher.flush()
        assert (pc.get("b", 1), batcher.pending()) == (4, 0)
    finally:
        batcher.close()


def test_a_counter_dropped_and_recreated_meanwhile_gets_the_buffered_increments(
    dsn: str, pc: Counters
) -> None:
    """The batcher looked the counter up before another program dropped and re-created
    it: its buffered increments used to go to the old id and vanish in the drain."""
    pc.create_counter("c", key=int)
    batcher = BatchingCounters(dsn, max_pending=1000, interval=None, flush_at_exit=False)
    try:
        batcher.incr("c", 1, 5)
        batcher.flush()
        pc.drop_counter("c")
        pc.create_counter("c", key=int)
        batcher.incr("c", 1, 7)
        batcher.flush()
        pc.drain()
        assert pc.get("c", 1) == 7
        # dropped for good: the flush is refused and the increment stays buffered
        pc.drop_counter("c")
        batcher.incr("c", 1, 3)
        with pytest.raises(BufferFlushFailed, match="was dropped"):
            batcher.flush()
        assert batcher.pending() == 1
        pc.create_counter("c", key=int)
        batcher.flush()
        assert pc.get("c", 1) == 3
    finally:
        batcher.close()


def test_a_batch_committed_before_its_counter_was_dropped_is_not_kept_again(
    dsn: str, pc: Counters
) -> None:
    """A batch whose commit went through but whose bookkeeping did not (the flush was
    interrupted between the two) is written again later, after one of its counters was
    dropped: its id is recorded, so nothing of it is written or kept again (the dropped
    counter's increments went with it, and a counter declared again under its name does
    not get them a second time)."""
    from pgcounters.flushlog import write_flush

    pc.create_counter("a", key=int)
    pc.create_counter("b", key=int)
    events = BatchingCounters(dsn, interval=None, flush_at_exit=False)
    events.incr("a", 1, 3)
    events.incr("b", 1, 4)
    (batch,) = events._pending.cut()
    rows = [(pc.counter(n), ("1",), d) for n, d in (("a", 3), ("b", 4))]
    written, held = write_flush(pc, batch.flush_id, events.buffer, rows)
    assert (written, held) == (True, [])
    pc.drop_counter("b")
    stats = events.flush()  # the same batch again, not in doubt as far as it knows
    assert (stats.batches, events.pending()) == (1, 0)
    pc.create_counter("b", key=int)
    events.close()
    assert (pc.get("a", 1), pc.get("b", 1)) == (3, 0)
