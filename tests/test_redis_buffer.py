"""The Redis write-behind buffer, against a real Redis server and a real PostgreSQL."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pgcounters import Counters
from pgcounters.connection import Conn
from pgcounters.demos.redis_server import EmbeddedRedis, free_port
from pgcounters.errors import BufferFlushFailed, ConfigurationError, RedisUnavailable
from pgcounters.redis_buffer import RedisBuffer, redis_url


@pytest.fixture
def server(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis(tmp_path / "redis") as running:
        yield running


@pytest.fixture
def buf(dsn: str, server: EmbeddedRedis) -> Iterator[RedisBuffer]:
    with RedisBuffer(dsn, server.url()) as b:
        yield b


def flush_count(conn: Conn) -> int:
    row = conn.execute("SELECT count(*) FROM pgcounters.buffer_flushes").fetchone()
    assert row is not None
    return int(row[0])


def test_increments_go_to_redis_and_a_flush_moves_them(
    buf: RedisBuffer, pc: Counters, conn: Conn
) -> None:
    pc.create_counter("views", key=int)
    pc.create_counter("total")
    buf.incr("views", 7)
    buf.incr("views", 7, 2)
    buf.incr_many([("views", 8, 5), ("total", None, 1)])
    assert pc.get("views", 7) == 0  # not in the database yet
    assert (buf.get("views", 7), buf.get("views", 8), buf.get("total")) == (3, 5, 1)
    assert buf.pending() == (3, 0)
    result = buf.flush()
    assert (result.flushes, result.keys, result.total) == (1, 3, 9)
    assert buf.pending() == (0, 0)
    assert (pc.get("views", 7), pc.get("views", 8), pc.get("total")) == (3, 5, 1)
    assert (buf.get("views", 7), buf.get("views", 8)) == (3, 5)
    assert buf.flush().flushes == 0  # nothing pending
    assert flush_count(conn) == 1
    pc.drain()
    assert pc.get("views", 7, exact=False) == 3


def test_bad_input_is_refused_before_redis(buf: RedisBuffer, pc: Counters) -> None:
    from pgcounters.errors import InvalidDelta, InvalidKey, UnknownCounter

    pc.create_counter("c", key=int)
    with pytest.raises(UnknownCounter):
        buf.incr("missing")
    with pytest.raises(InvalidKey):
        buf.incr("c", "x")
    with pytest.raises(InvalidDelta):
        buf.incr("c", 1, 2**63)
    with pytest.raises(InvalidKey):  # all or none
        buf.incr_many([("c", 1, 1), ("c", "x", 1)])
    assert buf.pending() == (0, 0)
    with pytest.raises(ConfigurationError):
        RedisBuffer(pc.conn, "redis://127.0.0.1:1/0", name="bad name")


def test_fields_a_flush_cannot_apply_are_kept_aside(
    buf: RedisBuffer, pc: Counters, caplog: pytest.LogCaptureFixture
) -> None:
    pc.create_counter("c", key=int)
    buf.incr("c", 1, 4)
    # written by something else: an undeclared counter, garbage, a non-canonical key
    buf.redis.hincrby(buf.pending_key, '["gone",[]]', 1)
    buf.redis.hincrby(buf.pending_key, "not json", 3)
    buf.redis.hincrby(buf.pending_key, '["c",["01"]]', 2)  # not canonical
    with caplog.at_level(logging.ERROR, logger="pgcounters.redis_buffer"):
        result = buf.flush()
    assert (result.flushes, result.keys, result.rejected) == (1, 1, 3)
    assert pc.get("c", 1) == 4
    raw: dict[bytes, bytes] = buf.redis.hgetall(buf.rejected_key)  # type: ignore[assignment]
    rejected = {k.decode(): int(v) for k, v in raw.items()}
    assert rejected == {'["gone",[]]': 1, "not json": 3, '["c",["01"]]': 2}
    assert "were not applied" in caplog.text


def test_a_flusher_dying_after_commit_is_never_counted_twice(
    dsn: str, server: EmbeddedRedis, buf: RedisBuffer, pc: Counters, conn: Conn
) -> None:
    pc.create_counter("c", key=int)
    buf.incr("c", 1, 10)
    buf.incr("c", 2, 1)

    def die(flush_id: str) -> None:
        raise SystemExit(f"flusher died after committing {flush_id}")

    buf.after_commit = die
    with pytest.raises(SystemExit):
        buf.flush()
    # committed in PostgreSQL, still in flight in Redis
    assert pc.get("c", 1) == 10
    assert buf.pending() == (0, 1)
    buf.incr("c", 1, 5)
    # an exact read in this state counts the flush once
    assert buf.get("c", 1) == 15
    with RedisBuffer(dsn, server.url()) as other:
        result = other.flush()
    assert (result.recovered, result.skipped, result.flushes) == (1, 1, 1)
    assert (pc.get("c", 1), pc.get("c", 2)) == (15, 1)
    assert buf.pending() == (0, 0)
    assert flush_count(conn) == 2


def test_a_sigkilled_flusher_process_is_recovered_once(
    dsn: str, server: EmbeddedRedis, buf: RedisBuffer, pc: Counters
) -> None:
    pc.create_counter("c")
    buf.incr("c", delta=42)
    flusher = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                """
                import sys, time
                from pgcounters.redis_buffer import RedisBuffer
                b = RedisBuffer(sys.argv[1], sys.argv[2])
                def wait(flush_id):
                    print("committed", flush_id, flush=True)
                    time.sleep(60)
                b.after_commit = wait
                b.flush()
                """
            ),
            dsn,
            server.url(),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert flusher.stdout is not None
    line = flusher.stdout.readline()
    assert line.startswith("committed"), line
    flusher.send_signal(signal.SIGKILL)
    flusher.wait(10)
    flusher.stdout.close()
    assert pc.get("c") == 42
    assert buf.get("c") == 42
    result = buf.flush()
    assert (result.recovered, result.skipped) == (1, 1)
    assert pc.get("c") == 42
    assert buf.get("c") == 42


def test_a_failed_database_write_stays_in_flight_and_is_applied_later(
    buf: RedisBuffer, pc: Counters, conn: Conn
) -> None:
    pc.create_counter("c")
    buf.incr("c", delta=3)
    conn.execute(
        "ALTER TABLE pgcounters.queue ADD CONSTRAINT block_writes CHECK (delta < 0) NOT VALID"
    )
    with pytest.raises(BufferFlushFailed, match="stays in Redis"):
        buf.flush()
    assert buf.pending() == (0, 1)
    assert buf.get("c") == 3
    conn.execute("ALTER TABLE pgcounters.queue DROP CONSTRAINT block_writes")
    result = buf.flush()
    assert (result.recovered, result.flushes, result.skipped) == (1, 1, 0)
    assert pc.get("c") == 3


INCR_PROCESS = """
import sys
from pgcounters.redis_buffer import RedisBuffer
with RedisBuffer(sys.argv[1], sys.argv[2]) as b:
    for i in range(int(sys.argv[3])):
        b.incr("views", i % 7)
"""


def test_threads_and_processes_incrementing_while_flushes_run(
    dsn: str, server: EmbeddedRedis, buf: RedisBuffer, pc: Counters
) -> None:
    pc.create_counter("views", key=int)
    per_thread, threads, per_process, processes = 1500, 4, 2000, 2
    procs = [
        subprocess.Popen([sys.executable, "-c", INCR_PROCESS, dsn, server.url(), str(per_process)])
        for _ in range(processes)
    ]

    def incr_thread() -> None:
        with RedisBuffer(dsn, server.url()) as mine:
            for i in range(per_thread):
                mine.incr("views", i % 7)

    workers = [threading.Thread(target=incr_thread) for _ in range(threads)]
    for w in workers:
        w.start()

    seen: list[int] = []
    read_errors: list[str] = []
    done = threading.Event()

    def reader() -> None:
        # exact reads while increments and flushes run: never backwards
        with RedisBuffer(dsn, server.url()) as mine:
            while not done.is_set():
                value = mine.get("views", 0)
                if seen and value < seen[-1]:
                    read_errors.append(f"{value} after {seen[-1]}")
                seen.append(value)

    watcher = threading.Thread(target=reader)
    watcher.start()
    flushes = 0
    with RedisBuffer(dsn, server.url()) as second:
        while any(w.is_alive() for w in workers) or any(p.poll() is None for p in procs):
            flushes += buf.flush().flushes + second.flush().flushes
    for w in workers:
        w.join()
    for p in procs:
        assert p.wait(60) == 0
    done.set()
    watcher.join()
    flushes += buf.flush().flushes
    expected = [0] * 7
    for n in (per_thread,) * threads + (per_process,) * processes:
        for i in range(n):
            expected[i % 7] += 1
    assert pc.get_many("views", range(7)) == expected
    assert buf.pending() == (0, 0)
    assert flushes >= 2
    assert read_errors == []
    assert seen
    assert max(seen) <= expected[0]


def test_redis_restarted_without_persistence_loses_only_what_was_not_flushed(
    server: EmbeddedRedis, buf: RedisBuffer, pc: Counters
) -> None:
    pc.create_counter("c")
    buf.incr("c", delta=10)
    buf.flush()
    buf.incr("c", delta=5)  # acknowledged, not flushed: the documented loss
    server.restart()
    buf.incr("c", delta=3)
    buf.flush()
    assert pc.get("c") == 13
    assert buf.get("c") == 13


def test_redis_restored_from_an_old_snapshot_never_counts_twice(
    tmp_path: Path, dsn: str, pc: Counters, caplog: pytest.LogCaptureFixture
) -> None:
    pc.create_counter("c")
    with (
        EmbeddedRedis(tmp_path / "rdb", persistence="rdb") as server,
        RedisBuffer(dsn, server.url()) as buf,
    ):
        buf.incr("c", delta=10)
        buf.redis.save()  # the snapshot holds the 10 as pending
        buf.flush()  # ... which are then applied
        buf.incr("c", delta=4)  # after the snapshot: lost by the restart
        server.restart()  # comes back with the 10 pending again
        assert buf.get("c") == 10  # the restored 10 are not counted twice by a read
        buf.incr("c", delta=3)  # made after the restart, before the first flush
        with caplog.at_level(logging.WARNING, logger="pgcounters.redis_buffer"):
            result = buf.flush()
        assert (result.skipped, result.flushes) == (1, 0)
        assert "older than its last flush" in caplog.text
        assert pc.get("c") == 10  # never 20: the loss is the documented 4 + 3
        buf.incr("c", delta=2)
        buf.flush()
        assert pc.get("c") == 12


def test_redis_unreachable_is_a_clear_error_or_the_database_fallback(
    dsn: str, pc: Counters, monkeypatch: pytest.MonkeyPatch
) -> None:
    pc.create_counter("c")
    nowhere = f"redis://127.0.0.1:{free_port()}/0"
    with RedisBuffer(dsn, nowhere) as buf:
        with pytest.raises(RedisUnavailable, match="the increment was not counted"):
            buf.incr("c")
        with pytest.raises(RedisUnavailable):
            buf.get("c")
        with pytest.raises(RedisUnavailable):
            buf.flush()
    assert pc.get("c") == 0
    with RedisBuffer(dsn, nowhere, fallback="database") as buf:
        buf.incr("c", delta=2)
        buf.incr_many([("c", None, 3)])
    assert pc.get("c") == 5
    monkeypatch.delenv("PGCOUNTERS_REDIS_URL", raising=False)
    with pytest.raises(ConfigurationError, match="PGCOUNTERS_REDIS_URL"):
        RedisBuffer(dsn)
    monkeypatch.setenv("PGCOUNTERS_REDIS_URL", nowhere)
    assert redis_url() == nowhere
    with pytest.raises(ConfigurationError, match="invalid Redis URL"):
        RedisBuffer(dsn, "http://example")


def test_old_flush_records_are_pruned_by_age(
    dsn: str, server: EmbeddedRedis, buf: RedisBuffer, pc: Counters, conn: Conn
) -> None:
    pc.create_counter("c")
    buf.incr("c")
    buf.after_commit = lambda flush_id: (_ for _ in ()).throw(RuntimeError("died"))
    with pytest.raises(RuntimeError):
        buf.flush()
    buf.after_commit = None
    # age every record past the retention (7 days)
    conn.execute("UPDATE pgcounters.buffer_flushes SET applied_at = now() - interval '8 days'")
    buf.incr("c")
    with RedisBuffer(dsn, server.url()) as other:
        # the flush in flight is recovered first (found recorded, its age renewed)
        result = other.flush()
    assert (result.recovered, result.skipped, result.flushes) == (1, 1, 1)
    assert pc.get("c") == 2
    buf.incr("c")
    conn.execute("UPDATE pgcounters.buffer_flushes SET applied_at = now() - interval '2 days'")
    buf.flush()
    assert flush_count(conn) == 3  # within the retention: kept
    buf.incr("c")
    conn.execute("UPDATE pgcounters.buffer_flushes SET applied_at = now() - interval '2 days'")
    conn.execute("UPDATE pgcounters.buffer_settings SET retention = '1 day'")  # the owner's
    buf.flush()
    assert flush_count(conn) == 1  # only the newest remains
    assert pc.get("c") == 4


def _die_after_commit(flush_id: str) -> None:
    raise RuntimeError(f"the flusher died after committing {flush_id}")


def test_a_flush_in_doubt_is_not_pruned_by_a_fresh_flush_recorded_before_it(
    dsn: str, server: EmbeddedRedis, buf: RedisBuffer, pc: Counters, conn: Conn
) -> None:
    """Two flushes in flight: A taken by a flusher that died before writing it, B committed
    (8 days ago) by one that died before acknowledging it. The next flush recovers A first:
    A is recorded now, which prunes the old records, but never B's, still in doubt; then B
    is found recorded, and counted once."""
    pc.create_counter("c")
    buf.incr("c", delta=10)
    buf.after_commit = _die_after_commit
    with pytest.raises(RuntimeError):
        buf.flush()
    buf.after_commit = None
    (b_id,) = [i.decode() for i in buf.redis.zrange(buf.inflight_key, 0, -1)]  # type: ignore[union-attr]
    conn.execute("UPDATE pgcounters.buffer_flushes SET applied_at = now() - interval '8 days'")
    buf.incr("c", delta=1)
    # a flusher takes the pending hash (A) and dies before it writes anything
    a_id = buf._take(
        keys=[buf.pending_key, buf.next_key, buf.inflight_key],
        args=[buf.flush_prefix, "0" * 32, "f" * 32],
    ).decode()
    # A was taken a second before B (the other flusher read the in-flight set before A)
    b_score = buf.redis.zscore(buf.inflight_key, b_id)
    assert b_score is not None
    buf.redis.zadd(buf.inflight_key, {a_id: b_score - 1}, xx=True)
    assert buf.get("c") == 11
    with RedisBuffer(dsn, server.url()) as other:
        result = other.flush()
    assert pc.get("c") == 11
    assert (result.recovered, result.flushes, result.skipped) == (2, 1, 1)
    assert buf.pending() == (0, 0)


def test_a_flush_in_doubt_in_one_slot_is_not_pruned_by_a_flush_of_another(
    dsn: str, server: EmbeddedRedis, pc: Counters, conn: Conn
) -> None:
    """Slots of one buffer share its name in the flush log: a fresh flush of slot 0 prunes
    the name's old records, and spares the flushes in flight in every slot."""
    pc.create_counter("c", key=int)
    with RedisBuffer(dsn, server.url(), slots=2) as buf:
        zero = next(k for k in range(100) if buf.slot_of(buf.field("c", k)) == buf.slots[0])
        one = next(k for k in range(100) if buf.slot_of(buf.field("c", k)) == buf.slots[1])
        buf.incr("c", one, 10)
        buf.after_commit = _die_after_commit
        with pytest.raises(RuntimeError):
            buf.flush()  # slot 1's flush committed, still in flight
        buf.after_commit = None
        assert buf.pending() == (0, 1)
        conn.execute("UPDATE pgcounters.buffer_flushes SET applied_at = now() - interval '8 days'")
        buf.incr("c", zero, 1)
        with RedisBuffer(dsn, server.url(), slots=2) as other:
            result = other.flush()  # slot 0 first: a fresh flush; then slot 1's recovered
        assert (pc.get("c", zero), pc.get("c", one)) == (1, 10)
        assert (result.recovered, result.flushes, result.skipped) == (1, 1, 1)
        assert buf.pending() == (0, 0)


def test_two_flushers_recovering_the_same_flush_apply_it_once(
    dsn: str, server: EmbeddedRedis, buf: RedisBuffer, pc: Counters
) -> None:
    pc.create_counter("c")
    for _ in range(5):
        buf.incr("c", delta=1)
        buf.after_commit = lambda flush_id: (_ for _ in ()).throw(RuntimeError("died"))
        with pytest.raises(RuntimeError):
            buf.flush()
    buf.after_commit = None
    # five flushes in doubt, and new increments; two flushers race over them
    buf.incr("c", delta=100)
    flushers = [RedisBuffer(dsn, server.url()) for _ in range(2)]
    threads = [threading.Thread(target=f.flush) for f in flushers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for f in flushers:
        f.close()
    assert pc.get("c") == 105
    assert buf.pending() == (0, 0)


def test_the_worker_stops_on_request(dsn: str, server: EmbeddedRedis, pc: Counters) -> None:
    from pgcounters.redis_buffer import run_worker

    pc.create_counter("c")
    stop = threading.Event()
    lines: list[str] = []
    with RedisBuffer(dsn, server.url()) as buf:
        worker = threading.Thread(
            target=run_worker, args=(buf, stop), kwargs={"interval": 0.02, "report": lines.append}
        )
        worker.start()
        with RedisBuffer(dsn, server.url()) as app:
            for _ in range(50):
                app.incr("c")
            deadline = time.monotonic() + 10
            while pc.get("c") != 50 and time.monotonic() < deadline:
                time.sleep(0.02)
        stop.set()
        worker.join(10)
        assert not worker.is_alive()
    assert pc.get("c") == 50
    assert any(line.startswith("flushed") for line in lines)


def test_every_counter_mode_and_key_type_is_flushed(
    buf: RedisBuffer, pc: Counters, conn: Conn
) -> None:
    import datetime as dt
    import uuid

    conn.execute("CREATE TABLE article (id bigint PRIMARY KEY, views bigint NOT NULL DEFAULT 0)")
    conn.execute("INSERT INTO article (id) VALUES (1), (2)")
    pc.create_counter("q", key=(int, dt.date))
    pc.create_counter("u", key=uuid.UUID, mode="unlogged")
    pc.create_counter("d", key=str, mode="direct")
    pc.create_column_counter("article.views", "article", "views")
    day, who = dt.date(2026, 11, 21), uuid.uuid4()
    buf.incr("q", (7, day), 2)
    buf.incr("u", who, 3)
    buf.incr("d", 'a "quoted", {odd} key', 4)
    buf.incr("article.views", 2, 5)
    buf.incr("q", (7, day), -2)  # nets to zero: nothing to write
    result = buf.flush()
    assert result.keys == 3  # the netted zero is not written
    assert (pc.get("q", (7, day)), pc.get("u", who)) == (0, 3)
    assert pc.get("d", 'a "quoted", {odd} key', exact=False) == 4  # direct: stored at once
    assert pc.get("article.views", 2) == 5
    assert pc.pending() == (1, 1)  # the queued zero was not written
    pc.drain()
    assert conn.execute("SELECT views FROM article WHERE id = 2").fetchone() == (5,)


def test_a_counter_dropped_and_recreated_meanwhile_gets_the_flushed_increments(
    buf: RedisBuffer, pc: Counters
) -> None:
    pc.create_counter("v", key=int)
    buf.incr("v", 1, 5)
    buf.flush()
    pc.drain()
    pc.drop_counter("v")
    pc.create_counter("v", key=int)
    buf.incr("v", 1, 7)
    buf.flush()
    pc.drain()
    assert pc.get("v", 1) == 7
    assert buf.get("v", 1) == 7


def test_a_counter_dropped_after_it_was_looked_up_is_set_aside_and_the_rest_applied(
    buf: RedisBuffer, pc: Counters
) -> None:
    pc.create_counter("kept", key=int)
    pc.create_counter("gone", key=int)
    buf.incr("kept", 1, 2)
    buf.incr("gone", 1, 5)  # the buffer has looked "gone" up: a flush reads its fields
    pc.drop_counter("gone")
    result = buf.flush()
    assert result.rejected == 1
    assert pc.get("kept", 1) == 2
    raw: dict[bytes, bytes] = buf.redis.hgetall(buf.rejected_key)  # type: ignore[assignment]
    assert {k.decode(): int(v) for k, v in raw.items()} == {'["gone",["1"]]': 5}
