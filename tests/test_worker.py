"""The worker through its Python API (in threads), and the wake-up notifications."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter as Tally

import psycopg
import pytest

from pgcounters import Counters, cli
from pgcounters.connection import Conn
from pgcounters.errors import ConfigurationError
from pgcounters.worker import Worker, WorkerSettings
from support import queued, running, wait_for

FAST = WorkerSettings(min_interval=0.01, max_interval=0.05, log_every=0)


def test_a_worker_in_a_thread_drains_both_queues_and_stops(
    dsn: str, conn: Conn, pc: Counters
) -> None:
    pc.create_counter("views", int)
    pc.create_counter("fast", int, mode="unlogged")
    worker = Worker(dsn, FAST)
    with running(worker) as errors:
        for i in range(300):
            pc.incr("views", i % 7)
            pc.incr("fast", i % 3, 2)
        wait_for(lambda: queued(conn) == 0)
        wait_for(lambda: worker.get_stats().deltas == 600)
    assert errors == []
    stats = worker.get_stats()
    assert stats.deltas == 600
    assert stats.batches >= 2
    assert [pc.get("views", k, exact=False) for k in range(7)] == [43, 43, 43, 43, 43, 43, 42]
    assert [pc.get("fast", k, exact=False) for k in range(3)] == [200, 200, 200]


def test_stop_before_run_returns_at_once(dsn: str) -> None:
    worker = Worker(dsn, FAST)
    worker.stop()
    assert worker.run().batches == 0


def test_several_workers_with_concurrent_writers_are_exact(
    dsn: str, conn: Conn, pc: Counters
) -> None:
    pc.create_counter("hot", int)
    pc.create_counter("hot.u", int, mode="unlogged")
    expected: Tally[tuple[str, int]] = Tally()
    lock = threading.Lock()

    def writer(seed: int) -> None:
        rng = random.Random(seed)
        local: Tally[tuple[str, int]] = Tally()
        with psycopg.connect(dsn, autocommit=True) as wconn:
            wc = Counters(wconn)
            for _ in range(200):
                items = [(rng.choice(["hot", "hot.u"]), rng.randrange(5), 1) for _ in range(5)]
                wc.incr_many(items)
                local.update((n, k) for n, k, _ in items)
        with lock:
            expected.update(local)

    small = WorkerSettings(batch_size=37, min_interval=0.005, max_interval=0.02, log_every=0)
    workers = [Worker(dsn, small) for _ in range(3)]
    with running(workers[0]) as e0, running(workers[1]) as e1, running(workers[2]) as e2:
        writers = [threading.Thread(target=writer, args=(s,)) for s in range(4)]
        for t in writers:
            t.start()
        for t in writers:
            t.join()
        wait_for(lambda: queued(conn) == 0)
    assert e0 == e1 == e2 == []
    assert sum(expected.values()) == 4000
    # every queued row was applied by exactly one of the workers
    row = conn.execute("SELECT sum(deltas) FROM pgcounters.drain_stats").fetchone()
    assert row is not None
    assert sum(w.get_stats().deltas for w in workers) == row[0] > 0
    for (name, key), n in expected.items():
        assert pc.get(name, key, exact=False) == n


def test_a_batch_over_statement_timeout_is_retried_smaller(
    dsn: str, conn: Conn, pc: Counters, caplog: pytest.LogCaptureFixture
) -> None:
    conn.execute("CREATE TABLE article (id bigint PRIMARY KEY, views bigint NOT NULL DEFAULT 0)")
    conn.execute("INSERT INTO article (id) SELECT generate_series(1, 5)")
    pc.create_column_counter("article.views", "article", "views")
    for i in range(1, 6):
        pc.incr("article.views", i)
    settings = WorkerSettings(
        batch_size=400, statement_timeout=0.3, min_interval=0.01, max_interval=0.05, log_every=0
    )
    worker = Worker(dsn, settings)
    with psycopg.connect(dsn) as blocker:
        # a lock on the queue (an operator's LOCK TABLE): the drain waits past
        # statement_timeout (a parent row held by a user transaction is skipped instead)
        blocker.execute("LOCK TABLE pgcounters.queue IN SHARE MODE")
        with running(worker) as errors:
            wait_for(lambda: worker.get_stats().batch_size < 400)
            assert queued(conn) == 5, "a cancelled batch must leave its deltas queued"
            blocker.rollback()
            wait_for(lambda: queued(conn) == 0)
    assert errors == []
    assert worker.get_stats().errors >= 1
    rows = conn.execute("SELECT id, views FROM article ORDER BY id").fetchall()
    assert rows == [(i, 1) for i in range(1, 6)]
    # each retried batch: a WARNING with its reason, and counted for status and Prometheus
    warned = [
        r
        for r in caplog.records
        if r.levelno == logging.WARNING
        and "drain batch was aborted (statement timeout)" in r.message
    ]
    assert warned
    counted = conn.execute(
        "SELECT retries FROM pgcounters.retries WHERE operation = 'drain'"
        " AND reason = 'statement timeout'"
    ).fetchone()
    assert counted == (len(warned),)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("batch_size", 0),
        ("batch_size", 2.5),
        ("max_batch_size", 0),
        ("max_batch_size", 2**31),
        ("min_interval", 0),
        ("max_interval", -1),
        ("statement_timeout", -1),
        ("reconnect_min", 0),
        ("linger", -0.01),
        ("batch_seconds", -1),
    ],
)
def test_bad_settings_are_refused(dsn: str, field: str, value: object) -> None:
    with pytest.raises(ConfigurationError, match=field):
        Worker(dsn, WorkerSettings(**{field: value}))  # type: ignore[arg-type]


def test_max_interval_below_min_interval_is_refused(dsn: str) -> None:
    with pytest.raises(ConfigurationError, match="below min_interval"):
        Worker(dsn, WorkerSettings(min_interval=2, max_interval=1))


def _drain_calls(conn: Conn) -> int:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions"
        " WHERE schemaname = 'pgcounters' AND funcname = 'drain_queue'"
    ).fetchone()
    return int(row[0]) if row else 0


def test_a_worker_drains_only_the_queues_that_hold_deltas(
    dsn: str, conn: Conn, pc: Counters
) -> None:
    # the worker's calls of the drain function are counted by the statistics
    database = conn.execute("SELECT current_database()").fetchone()
    assert database is not None
    conn.execute(
        psycopg.sql.SQL("ALTER DATABASE {} SET track_functions = 'all'").format(
            psycopg.sql.Identifier(database[0])
        )
    )
    pc.create_counter("views", int)
    for i in range(50):
        pc.incr("views", i % 5)
    worker = Worker(dsn, FAST)
    with running(worker) as errors:
        wait_for(lambda: queued(conn) == 0)
        # many rounds over empty queues after that
        rounds = worker.get_stats().rounds
        wait_for(lambda: worker.get_stats().rounds >= rounds + 10)
    assert errors == []
    stats = worker.get_stats()
    assert stats.deltas == 50
    # its backend has gone and left its statistics: one drain call per batch that applied
    # deltas, none for the unlogged queue that never held any, none for the empty rounds
    wait_for(lambda: _drain_calls(conn) > 0)
    assert _drain_calls(conn) == stats.batches
    assert pc.get("views", 0) == 10


def test_a_lingering_worker_gathers_the_deltas_of_its_linger_in_one_batch(
    dsn: str, conn: Conn, pc: Counters
) -> None:
    pc.create_counter("views", int)
    worker = Worker(dsn, WorkerSettings(min_interval=0.01, max_interval=0.05, linger=5.0))
    with running(worker) as errors:
        pc.incr("views", 1)
        wait_for(lambda: worker.get_stats().batches == 1)
        first = worker.get_stats().rounds  # the round of that batch, or the one before it
        # the worker now lingers: the deltas written meanwhile wait for one batch, and no
        # round runs until then
        for i in range(20):
            pc.incr("views", i % 4)
        wait_for(lambda: queued(conn) == 0)
        stats = worker.get_stats()
    assert errors == []
    assert (stats.batches, stats.deltas) == (2, 21)
    assert stats.rounds <= first + 2
    assert [pc.get("views", k) for k in range(4)] == [5, 6, 5, 5]


def test_stopping_a_lingering_worker_does_not_wait_for_the_linger(dsn: str, pc: Counters) -> None:
    pc.create_counter("views", int)
    worker = Worker(dsn, WorkerSettings(min_interval=0.01, max_interval=0.05, linger=600.0))
    with running(worker) as errors:
        pc.incr("views", 1)
        wait_for(lambda: worker.get_stats().batches == 1)
    # running() joined the thread within its timeout, far below the linger
    assert errors == []


# -- wake-ups -----------------------------------------------------------------


def test_wakeups_are_rate_limited_not_one_per_delta(dsn: str, conn: Conn, pc: Counters) -> None:
    pc.create_counter("c", int)
    pc.create_counter("u", int, mode="unlogged")
    conn.execute("SELECT pgcounters.enable_wakeups(interval '1 hour')")
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN pgcounters_queue")
        for i in range(50):
            pc.incr("c", i)
            pc.incr("u", i)
        pc.incr_many([("c", i, 1) for i in range(100)])
        got = list(listener.notifies(timeout=1.0))
    # one notification for 101 insert statements within the interval
    assert [n.channel for n in got] == ["pgcounters_queue"]
    assert got[0].payload == "queue"


def test_wakeups_follow_the_interval_and_can_be_turned_off(
    dsn: str, conn: Conn, pc: Counters
) -> None:
    pc.create_counter("c", int)
    conn.execute("SELECT pgcounters.enable_wakeups(interval '1 millisecond')")
    assert conn.execute("SELECT pgcounters.wakeup_interval_ms()").fetchone() == (1,)
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN pgcounters_queue")
        for i in range(5):
            pc.incr("c", i)
            time.sleep(0.01)
        assert len(list(listener.notifies(timeout=1.0))) == 5
        assert conn.execute("SELECT pgcounters.disable_wakeups()").fetchone() == (True,)
        pc.incr("c", 1)
        # a marker sent after the increment committed: notifications arrive in commit order, so
        # one from the increment would come first
        conn.execute("NOTIFY pgcounters_queue, 'marker'")
        seen = [n.payload for n in listener.notifies(timeout=30, stop_after=1)]
        assert seen == ["marker"]
    assert conn.execute("SELECT pgcounters.wakeup_interval_ms()").fetchone() == (None,)
    assert conn.execute("SELECT pgcounters.disable_wakeups()").fetchone() == (False,)


def test_a_rolled_back_or_repeatable_read_writer_is_not_disturbed(
    dsn: str, conn: Conn, pc: Counters
) -> None:
    pc.create_counter("c", int)
    conn.execute("SELECT pgcounters.enable_wakeups(interval '1 millisecond')")
    with psycopg.connect(dsn) as a, psycopg.connect(dsn) as b:
        a.isolation_level = b.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        ca, cb = Counters(a), Counters(b)
        ca.incr("c", 1)
        cb.incr("c", 2)
        time.sleep(0.01)
        ca.incr("c", 1)  # the wake-up clock moved under both snapshots: no error
        cb.incr("c", 2)
        a.commit()
        b.rollback()
    assert pc.get("c", 1) == 2
    assert pc.get("c", 2) == 0


def test_a_listening_worker_wakes_on_a_notification(dsn: str, conn: Conn, pc: Counters) -> None:
    pc.create_counter("c", int)
    conn.execute("SELECT pgcounters.enable_wakeups(interval '10 milliseconds')")
    # polling alone would not come back for an hour
    worker = Worker(dsn, WorkerSettings(listen=True, min_interval=3600, max_interval=3600))
    with running(worker) as errors:
        wait_for(lambda: worker.get_stats().rounds >= 1)
        pc.incr("c", 1, 5)
        wait_for(lambda: queued(conn) == 0, timeout=30)
    assert errors == []
    assert worker.get_stats().wakeups >= 1
    assert pc.get("c", 1, exact=False) == 5


def test_the_wakeup_command(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.run(["--dsn", dsn, "wakeup"]) == 0
    assert capsys.readouterr().out.strip() == "wake-ups are off"
    assert cli.run(["--dsn", dsn, "wakeup", "on", "--interval", "0.25"]) == 0
    assert capsys.readouterr().out.strip() == "wake-ups are on: at most one every 250 ms"
    with pytest.raises(SystemExit) as usage:
        cli.run(["--dsn", dsn, "wakeup", "on", "--interval", "0"])
    assert usage.value.code == cli.EXIT_USAGE
    assert "--interval must be positive" in capsys.readouterr().err
    with pytest.raises(SystemExit) as usage:
        cli.run(["--dsn", dsn, "wakeup", "on", "--interval", "7200"])
    assert usage.value.code == cli.EXIT_USAGE
    assert "between 1 ms and 1 hour" in capsys.readouterr().err
    assert cli.run(["--dsn", dsn, "wakeup", "off"]) == 0
    assert capsys.readouterr().out.strip() == "wake-ups are off"


def test_a_worker_batches_read_committed_on_a_serializable_session(
    dsn: str, conn: Conn, pc: Counters
) -> None:
    # a batch is one statement in autocommit mode: the worker's session must run Read
    # Committed whatever the server's or role's default, or a busy counter would fail
    # its batches on every row a writer changed since the snapshot
    serializable = psycopg.conninfo.make_conninfo(
        dsn, options="-c default_transaction_isolation=serializable"
    )
    pc.create_counter("iso", int)
    worker = Worker(serializable, FAST)
    session = worker._open()
    try:
        row = session.execute("SHOW default_transaction_isolation").fetchone()
        assert row == ("read committed",)
        for i in range(50):
            pc.incr("iso", i % 5)
        got, full, busy = worker._round(session)
        assert (got, full, busy) == (50, False, False)
    finally:
        session.close()
    assert queued(conn) == 0
    assert pc.get_many("iso", range(5), exact=False) == [10] * 5
