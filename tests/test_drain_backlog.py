"""A queue holding more than a batch is applied in one larger batch (up to the maximum
batch size): each key is written once for all of its deltas. The drain to the end, the
worker and the CLI alike; exact beside writers and a second drainer."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import re
import threading

import psycopg
import pytest
from psycopg import sql

from pgcounters import AsyncCounters, Counters, cli
from pgcounters.async_worker import AsyncWorker
from pgcounters.client import BatchResult
from pgcounters.connection import Conn
from pgcounters.worker import Worker, WorkerSettings
from support import queued, running, wait_for


def _backlog(conn: Conn, pc: Counters, n: int, keys: int, *, unlogged: bool = False) -> int:
    """Queue ``n`` deltas of 1 over ``keys`` keys of a named counter; returns its id."""
    name = "u" if unlogged else "v"
    target = pc.create_counter(name, key=int, mode="unlogged" if unlogged else "queued").id
    conn.execute(
        sql.SQL(
            "INSERT INTO pgcounters.{} (target_id, key, delta)"
            " SELECT %s, ARRAY[(g %% %s)::text], 1 FROM generate_series(1, %s) AS g"
        ).format(sql.Identifier("queue_unlogged" if unlogged else "queue")),
        (target, keys, n),
    )
    return target


def _rows_written(conn: Conn) -> int:
    """Inserts and updates of pgcounters.counters in this session's statistics."""
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT n_tup_ins + n_tup_upd FROM pg_stat_user_tables"
        " WHERE relid = 'pgcounters.counters'::regclass"
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_drain_takes_a_backlog_in_one_batch_and_writes_each_key_once(
    conn: Conn, pc: Counters
) -> None:
    _backlog(conn, pc, 5000, 500)
    before = _rows_written(conn)
    result = pc.drain(100)
    # one batch of the 5,000 deltas (an empty queue costs none)
    assert (result.deltas, result.keys, result.batches) == (5000, 500, 1)
    assert _rows_written(conn) - before == 500
    assert pc.get_many("v", range(500), exact=False) == [10] * 500


def test_the_largest_batch_is_a_setting_and_equal_to_the_batch_size_fixes_it(
    conn: Conn, pc: Counters
) -> None:
    _backlog(conn, pc, 5000, 500)
    before = _rows_written(conn)
    # batches of at most 2,000: 2,000 + 2,000 + 1,000
    assert pc.drain(100, max_batch_size=2000).keys == 1500
    assert _rows_written(conn) - before == 1500
    _backlog(conn, pc, 5000, 500, unlogged=True)
    result = pc.drain(100, max_batch_size=100)
    # 50 batches of 100, one key each (the empty logged queue costs none)
    assert (result.deltas, result.keys, result.batches) == (5000, 5000, 50)
    assert pc.get_many("v", range(500), exact=False) == [10] * 500
    assert pc.get_many("u", range(500), exact=False) == [10] * 500


def _drained_by_a_worker(
    dsn: str,
    conn: Conn,
    caplog: pytest.LogCaptureFixture,
    deltas: int,
    settings: WorkerSettings | None = None,
) -> tuple[Worker, list[int]]:
    """Run a worker (batches of 100, of up to 2,000 for a backlog, not sized by time) until
    the queue is empty and ``deltas`` are applied; return it and the deltas each of its
    batches applied."""
    caplog.set_level(logging.DEBUG, logger="pgcounters")
    settings = settings or WorkerSettings(
        batch_size=100, max_batch_size=2000, batch_seconds=0, min_interval=0.01,
        max_interval=0.05, log_every=0,
    )  # fmt: skip
    worker = Worker(dsn, settings)
    with running(worker) as errors:
        wait_for(lambda: queued(conn) == 0)
        wait_for(lambda: worker.get_stats().deltas == deltas)
    assert errors == []
    sizes = [
        int(m.group(1))
        for r in caplog.records
        if (m := re.match(r"applied (\d+) deltas", r.getMessage()))
    ]
    return worker, sizes


def test_a_worker_behind_applies_its_backlog_in_batches_of_up_to_the_maximum(
    dsn: str, conn: Conn, pc: Counters, caplog: pytest.LogCaptureFixture
) -> None:
    _backlog(conn, pc, 5000, 500)
    _, sizes = _drained_by_a_worker(dsn, conn, caplog, 5000)
    assert sizes == [2000, 2000, 1000]
    assert pc.get_many("v", range(500), exact=False) == [10] * 500


def test_the_async_worker_and_drain_take_a_backlog_in_one_batch(
    dsn: str, conn: Conn, pc: Counters
) -> None:
    _backlog(conn, pc, 4000, 400)
    _backlog(conn, pc, 4000, 400, unlogged=True)

    async def main() -> tuple[int, int]:
        settings = WorkerSettings(batch_size=100, batch_seconds=0, min_interval=0.01, log_every=0)
        async with AsyncWorker(dsn, settings) as worker:
            while worker.get_stats().deltas < 8000:
                await asyncio.sleep(0.01)
        stats = worker.get_stats()
        _backlog(conn, pc, 3000, 300)
        aconn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        async with aconn:
            result = await AsyncCounters(aconn).drain(100, max_batch_size=1000)
        return stats.batches, result.keys

    batches, keys = asyncio.run(main())
    assert batches == 2  # one batch of each queue
    assert keys == 900  # three batches of 1,000 deltas, 300 keys each
    assert pc.get_many("v", range(400), exact=False) == [20] * 300 + [10] * 100
    assert pc.get_many("u", range(400), exact=False) == [10] * 400


def test_a_worker_sizes_a_backlog_s_batches_by_time(
    dsn: str, conn: Conn, pc: Counters, caplog: pytest.LogCaptureFixture
) -> None:
    """A backlog is taken in batches sized to last about ``batch_seconds`` at the rate of
    the batch before: the first 4x ``batch_size``, each at most 4x the one before. Without
    the bound the whole backlog is one batch (the test above)."""
    _backlog(conn, pc, 60_000, 600)
    settings = WorkerSettings(
        batch_size=100, max_batch_size=500_000, batch_seconds=0.01, min_interval=0.01,
        max_interval=0.05, log_every=0,
    )  # fmt: skip
    _, sizes = _drained_by_a_worker(dsn, conn, caplog, 60_000, settings)
    assert sum(sizes) == 60_000
    assert sizes[0] == 400
    assert all(b <= 4 * a for a, b in itertools.pairwise(sizes))
    assert max(sizes) < 60_000
    assert pc.get_many("v", range(600), exact=False) == [100] * 600


def test_time_sizing_follows_the_rate_of_the_last_large_batch(dsn: str) -> None:
    worker = Worker(dsn, WorkerSettings(batch_size=1000, max_batch_size=500_000))
    assert worker._size_for(300_000, False) == 4000  # nothing measured yet
    worker._note_batch(BatchResult(4000, 400), False, 4000, 0.01)  # 400,000 a second
    assert worker._size_for(300_000, False) == 16_000  # 4x the last one, not 200,000
    worker._note_batch(BatchResult(16_000, 400), False, 16_000, 0.4)  # 40,000 a second
    assert worker._size_for(300_000, False) == 20_000  # half a second of it
    assert worker._size_for(5_000, False) == 5_000  # what is queued, when less
    assert worker._size_for(300_000, True) == 4000  # each queue its own rate
    worker._note_batch(BatchResult(20_000, 400), False, 20_000, 20.0)  # 1,000 a second
    assert worker._size_for(300_000, False) == 1000  # never below batch_size
    unbounded = Worker(dsn, WorkerSettings(batch_size=1000, batch_seconds=0))
    assert unbounded._size_for(300_000, False) == 300_000


def test_large_batches_beside_writers_and_a_second_drainer_are_exact(
    dsn: str, conn: Conn, pc: Counters
) -> None:
    """Two workers (one takes ranges, the other claims rows it skips when locked) face a
    backlog and writers adding to it: every delta is applied exactly once."""
    _backlog(conn, pc, 20_000, 2000)
    written = [0]

    def writer() -> None:
        with psycopg.connect(dsn, autocommit=True) as wconn:
            wc = Counters(wconn)
            for i in range(300):
                wc.incr_many([("v", (i * 7 + j) % 2000, 1) for j in range(10)])
                written[0] += 10

    settings = WorkerSettings(
        batch_size=50, max_batch_size=6000, min_interval=0.01, max_interval=0.05, log_every=0
    )
    workers = [Worker(dsn, settings), Worker(dsn, settings)]
    with running(workers[0]) as e0, running(workers[1]) as e1:
        t = threading.Thread(target=writer)
        t.start()
        t.join()
        wait_for(lambda: queued(conn) == 0)
    assert e0 == e1 == []
    assert written[0] == 3000
    assert sum(w.get_stats().deltas for w in workers) == 23_000
    values = pc.get_many("v", range(2000), exact=False)
    assert sum(values) == 23_000
    assert values == [
        10 + sum(1 for i in range(300) for j in range(10) if (i * 7 + j) % 2000 == k)
        for k in range(2000)
    ]


def test_the_cli_drain_and_worker_take_the_largest_batch_as_an_option(
    dsn: str, conn: Conn, pc: Counters, capsys: pytest.CaptureFixture[str]
) -> None:
    _backlog(conn, pc, 3000, 300)
    code = cli.run(
        ["--dsn", dsn, "drain", "--batch-size", "100", "--max-batch-size", "1000", "--json"]
    )
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert (out["deltas"], out["keys"]) == (3000, 900)  # three batches of 1,000, 300 keys each
    for command in ("drain", "worker"):
        for bad, says in (("0", "a positive integer"), ("2147483648", "at most 2147483647")):
            with pytest.raises(SystemExit) as usage:
                cli.run(["--dsn", dsn, command, "--max-batch-size", bad])
            assert usage.value.code == 2
            assert f"--max-batch-size must be {says}" in capsys.readouterr().err


def _bad_delta_in_backlog(conn: Conn, pc: Counters, before: int, after: int) -> None:
    """Queue ``before`` deltas of 1 over 500 keys of "v", one delta that cannot be applied
    (key 100000 would leave the bigint range), then ``after`` more over the 500 keys."""
    target = pc.create_counter("v", key=int).id
    conn.execute(
        "INSERT INTO pgcounters.counters (target_id, key, value)"
        " VALUES (%s, ARRAY['100000'], 9223372036854775000)",
        (target,),
    )
    for n, extra in ((before, True), (after, False)):
        conn.execute(
            "INSERT INTO pgcounters.queue (target_id, key, delta)"
            " SELECT %s, ARRAY[(g %% 500)::text], 1 FROM generate_series(1, %s) AS g",
            (target, n),
        )
        if extra:
            pc.incr("v", 100_000, 1000)


def test_a_large_batch_holding_a_bad_delta_is_taken_again_in_small_batches(
    dsn: str, conn: Conn, pc: Counters, caplog: pytest.LogCaptureFixture
) -> None:
    """One key at a time over a large batch would hold its rows many times longer: the
    batch is refused and the part of the queue it covered drained in batches of
    batch_size, one of which sets the bad delta aside."""
    _bad_delta_in_backlog(conn, pc, 2500, 2499)
    worker, sizes = _drained_by_a_worker(dsn, conn, caplog, 4999)
    assert worker.get_stats().quarantined == 1
    assert any(
        "a batch of 2000 deltas holds one that cannot be applied" in r.getMessage()
        for r in caplog.records
    )
    # 2,000; the next 2,000 (the bad delta among them) in 20 batches of 100 (99 applied in
    # the one that set it aside); the last 1,000 in one
    assert sizes == [2000, *[100] * 5, 99, *[100] * 14, 1000]
    assert pc.get_many("v", range(500), exact=False) == [9] + [10] * 499
    assert conn.execute("SELECT count(*) FROM pgcounters.quarantine").fetchone() == (1,)


def test_the_drain_and_drain_all_take_a_refused_batch_again_in_small_batches(
    conn: Conn, pc: Counters, caplog: pytest.LogCaptureFixture
) -> None:
    _bad_delta_in_backlog(conn, pc, 2500, 2499)
    result = pc.drain(100)
    assert (result.deltas, result.quarantined) == (4999, 1)
    assert "a batch of 5000 deltas holds one that cannot be applied" in caplog.text
    # the whole queue in one batch refused: then 50 batches of 100
    assert result.batches == 50
    assert pc.get_many("v", range(500), exact=False) == [9] + [10] * 499
    conn.execute("TRUNCATE pgcounters.counters, pgcounters.quarantine")
    _bad_delta_in_backlog(conn, pc, 2500, 2499)
    assert conn.execute("CALL pgcounters.drain_all(batch_size => 100)").fetchone() == (4999, 0, 1)
    assert pc.get_many("v", range(500), exact=False) == [9] + [10] * 499


def _slow_large_batches(conn: Conn) -> None:
    """A batch writing more than 200 counter values takes a second (a test trigger)."""
    conn.execute(
        "CREATE FUNCTION slow_when_many() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
        " IF (SELECT count(*) FROM written) > 200 THEN PERFORM pg_sleep(1); END IF;"
        " RETURN NULL; END $$"
    )
    conn.execute(
        "CREATE TRIGGER slow_when_many AFTER INSERT ON pgcounters.counters"
        " REFERENCING NEW TABLE AS written FOR EACH STATEMENT EXECUTE FUNCTION slow_when_many()"
    )


def test_a_worker_whose_large_batch_hits_its_statement_timeout_halves_it_at_once(
    dsn: str, conn: Conn, pc: Counters
) -> None:
    """Each cancelled batch is followed by a smaller one without waiting the longest
    polling interval (30 s here): the backlog is still there."""
    _backlog(conn, pc, 5000, 500)
    _slow_large_batches(conn)
    settings = WorkerSettings(
        batch_size=100, batch_seconds=0, statement_timeout=0.3, min_interval=0.01,
        max_interval=30, log_every=0,
    )  # fmt: skip
    worker = Worker(dsn, settings)
    with running(worker) as errors:
        wait_for(lambda: queued(conn) == 0, timeout=25)
    assert errors == []
    assert worker.get_stats().errors >= 4  # 5000, 2500, 1250, 625 and 312 are too slow
    assert pc.get_many("v", range(500), exact=False) == [10] * 500


def test_a_large_batch_cancelled_by_a_statement_timeout_goes_on_in_batches_of_batch_size(
    conn: Conn, pc: Counters, caplog: pytest.LogCaptureFixture
) -> None:
    """A role's statement_timeout too short for a backlog in one batch: the drain goes on
    in batches of batch_size instead of failing on every run."""
    _backlog(conn, pc, 5000, 500)
    _slow_large_batches(conn)  # longer than the timeout below
    conn.execute("SET statement_timeout = '300ms'")
    result = pc.drain(100)
    conn.execute("RESET statement_timeout")
    assert (result.deltas, result.batches) == (5000, 50)
    assert "a batch of 5000 deltas was cancelled by the statement timeout" in caplog.text
    assert pc.get_many("v", range(500), exact=False) == [10] * 500
