"""Change notifications: a drain batch reports the keys it changed, after it commits."""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import subprocess
import sys

import psycopg
import pytest

from pgcounters import Counters
from pgcounters.connection import Conn
from pgcounters.errors import ConfigurationError
from pgcounters.keys import BIGINT_MAX, Key
from pgcounters.notifications import (
    CHANNEL,
    MAX_PAYLOAD,
    Changes,
    merge,
    parse_payload,
    payload,
)
from pgcounters.worker import Worker, WorkerSettings
from support import queued, running, wait_for

FAST = WorkerSettings(min_interval=0.01, max_interval=0.05, log_every=0)


def _write(
    pc: Counters, rng: random.Random, n: int, deltas: tuple[int, ...] = (1, 2, -1)
) -> Changes:
    """Random increments of three counters; the keys whose sum is not zero (the truth)."""
    sums: dict[tuple[str, Key], int] = {}
    for _ in range(n):
        name = rng.choice(["views", "likes", "fast"])
        key: Key = (rng.randrange(20),) if name != "likes" else (rng.randrange(5), "x")
        delta = rng.choice(deltas)
        pc.incr(name, key, delta)
        sums[(name, key)] = sums.get((name, key), 0) + delta
    listed: dict[str, set[Key]] = {}
    for (name, key), total in sums.items():
        if total:
            listed.setdefault(name, set()).add(key)
    truth: Changes = dict(listed)
    return truth


def _counters(pc: Counters) -> None:
    pc.create_counter("views", int)
    pc.create_counter("likes", (int, str))
    pc.create_counter("fast", int, mode="unlogged")


def test_a_batch_reports_exactly_the_keys_it_changed(pc: Counters) -> None:
    _counters(pc)
    rng = random.Random(17)
    for _ in range(3):
        truth = _write(pc, rng, 300)
        logged = pc.drain_queue_batch(10_000, changes=True)
        unlogged = pc.drain_queue_batch(10_000, unlogged=True, changes=True)
        assert logged.changes is not None
        assert unlogged.changes is not None
        got = merge(dict(logged.changes), unlogged.changes)
        assert got == truth
        assert set(unlogged.changes) <= {"fast"}
        assert sum(len(keys or ()) for keys in got.values()) == logged.keys + unlogged.keys
    # nothing queued: nothing changed; without changes=True: not asked
    assert pc.drain_queue_batch(changes=True).changes == {}
    pc.incr("views", 1)
    assert pc.drain_queue_batch().changes is None


def test_a_key_whose_deltas_cancel_out_is_not_reported(pc: Counters) -> None:
    pc.create_counter("views", int)
    pc.incr("views", 1, 5)
    pc.incr("views", 1, -5)
    pc.incr("views", 2)
    assert pc.drain_queue_batch(changes=True).changes == {"views": {(2,)}}


def test_column_counters_report_the_rows_updated_not_the_busy_ones(
    dsn: str, conn: Conn, pc: Counters
) -> None:
    conn.execute("CREATE TABLE article (id bigint PRIMARY KEY, n bigint NOT NULL DEFAULT 0)")
    conn.execute("INSERT INTO article (id) SELECT generate_series(1, 5)")
    pc.create_column_counter("article.n", "article", "n")
    for key in (1, 2, 3, 9):  # 9: no such row, its deltas are discarded
        pc.incr("article.n", key)
    with psycopg.connect(dsn) as holder:
        holder.execute("SELECT 1 FROM article WHERE id = 3 FOR UPDATE")
        batch = pc.drain_queue_batch(changes=True)
        assert batch.busy == 1
        assert batch.changes == {"article.n": {(1,), (2,)}}
    assert pc.drain_queue_batch(changes=True).changes == {"article.n": {(3,)}}


def test_the_careful_path_reports_what_it_applied_and_not_what_it_set_aside(
    pc: Counters,
) -> None:
    pc.create_counter("views", int)
    pc.incr("views", 1, BIGINT_MAX)
    pc.incr("views", 1, BIGINT_MAX)  # the sum leaves bigint: set aside
    pc.incr("views", 2, 3)
    batch = pc.drain_queue_batch(changes=True)
    assert batch.quarantined == 2
    assert batch.changes == {"views": {(2,)}}


def test_a_rolled_back_batch_leaves_no_changes_and_the_retry_reports_them(
    conn: Conn, pc: Counters
) -> None:
    pc.create_counter("views", int)
    pc.incr("views", 7)
    noted: list[object] = []

    def failing_batch() -> None:
        with conn.transaction():
            conn.execute("SELECT set_config('pgcounters.note_changes', 'on', true)")
            conn.execute("SELECT * FROM pgcounters.drain_queue(100, false)")
            row = conn.execute("SELECT current_setting('pgcounters.changes', true)").fetchone()
            assert row is not None
            noted.append(json.loads(row[0]))
            raise RuntimeError("the batch fails before its commit")

    with pytest.raises(RuntimeError):
        failing_batch()
    assert noted == [[["views", ["7"]]]]
    assert conn.execute("SELECT current_setting('pgcounters.changes', true)").fetchone() in (
        (None,),
        ("",),
    )
    assert pc.pending() == (1, 0)
    assert pc.drain_queue_batch(changes=True).changes == {"views": {(7,)}}


def test_a_worker_calls_back_once_per_committed_batch_with_exactly_its_keys(
    dsn: str, conn: Conn, pc: Counters
) -> None:
    _counters(pc)
    calls: list[Changes] = []
    worker = Worker(dsn, FAST, on_change=calls.append)
    rng = random.Random(5)
    truth: Changes = {}
    with running(worker) as errors:
        for _ in range(5):
            # positive deltas: every batch changes some value, so every batch is reported
            merge(truth, _write(pc, rng, 200, deltas=(1, 2)))
        # a write that rolls back queues nothing and is never reported
        with pytest.raises(RuntimeError):
            _rolled_back_write(conn, pc)
        wait_for(lambda: queued(conn) == 0)
        wait_for(lambda: worker.get_stats().deltas == 1000)
    assert errors == []
    assert len(calls) == worker.get_stats().batches
    seen: Changes = {}
    for changes in calls:
        assert changes
        assert all(changes.values())
        merge(seen, changes)
    # every key written is reported (all deltas are positive), the rolled-back one is not
    assert seen == truth
    assert (999,) not in (seen["views"] or ())


def _rolled_back_write(conn: Conn, pc: Counters) -> None:
    with conn.transaction():
        pc.incr("views", 999)
        raise RuntimeError("rolled back")


def _all_keys(name: str) -> set[Key]:
    if name == "likes":
        return {(i, "x") for i in range(5)}
    return {(i,) for i in range(20)}


def test_a_callback_that_raises_is_logged_and_the_worker_goes_on(
    dsn: str, conn: Conn, pc: Counters, caplog: pytest.LogCaptureFixture
) -> None:
    pc.create_counter("views", int)
    calls: list[Changes] = []

    def callback(changes: Changes) -> None:
        calls.append(changes)
        raise ValueError("cache server down")

    worker = Worker(dsn, FAST, on_change=callback)
    with caplog.at_level(logging.ERROR, "pgcounters.notifications"), running(worker) as errors:
        pc.incr("views", 1)
        wait_for(lambda: len(calls) == 1)
        pc.incr("views", 2)
        wait_for(lambda: len(calls) == 2)
    assert errors == []
    assert calls == [{"views": {(1,)}}, {"views": {(2,)}}]
    assert pc.get("views", 2) == 1
    assert "the change callback failed" in caplog.text
    assert "cache server down" in caplog.text


def test_on_change_must_be_callable(dsn: str) -> None:
    with pytest.raises(ConfigurationError, match="on_change must be callable"):
        Worker(dsn, FAST, on_change=42)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="notify_interval"):
        WorkerSettings(notify_interval=-1).validate()


def _notifications(listener: Conn) -> list[str]:
    return [n.payload for n in listener.notifies(timeout=0.5) if n.channel == CHANNEL]


def test_a_listener_receives_one_notification_per_batch(dsn: str, conn: Conn, pc: Counters) -> None:
    _counters(pc)
    settings = WorkerSettings(
        min_interval=0.01, max_interval=0.05, log_every=0, notify=True, notify_interval=0
    )
    calls: list[Changes] = []
    worker = Worker(dsn, settings, on_change=calls.append)
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute(f"LISTEN {CHANNEL}")
        with running(worker) as errors:
            truth = _write(pc, random.Random(9), 400)
            wait_for(lambda: queued(conn) == 0)
            wait_for(lambda: worker.get_stats().deltas == 400)
        assert errors == []
        received = [parse_payload(p) for p in _notifications(listener)]
    assert len(received) == len(calls) == worker.get_stats().notifications
    assert received == [
        {name: {tuple(str(p) for p in k) for k in keys or ()} for name, keys in c.items()}
        for c in calls
    ]
    union: dict[str, set[tuple[str, ...]]] = {}
    for message in received:
        for name, texts in message.items():
            assert texts is not None
            union.setdefault(name, set()).update(texts)
    # a key that ends at zero may have changed in one of the batches: the truth's keys are
    # all there, and nothing that was not written
    for name, keys in truth.items():
        assert {tuple(str(p) for p in k) for k in keys or ()} <= union[name]
    for name, got in union.items():
        assert got <= {tuple(str(p) for p in k) for k in _all_keys(name)}


def test_the_rate_limit_sends_the_held_changes_together(dsn: str, conn: Conn, pc: Counters) -> None:
    pc.create_counter("views", int)
    settings = WorkerSettings(
        min_interval=0.01, max_interval=0.05, log_every=0, notify=True, notify_interval=3600
    )
    worker = Worker(dsn, settings)
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute(f"LISTEN {CHANNEL}")
        with running(worker):
            for key in range(1, 6):
                pc.incr("views", key)
                wait_for(lambda: queued(conn) == 0)
                wait_for(lambda k=key: worker.get_stats().deltas == k)  # type: ignore[misc]
            assert worker.get_stats().batches == 5
        # the first batch at once; the four held back by the interval when the worker stops
        received = [parse_payload(p) for p in _notifications(listener)]
    assert received == [{"views": {("1",)}}, {"views": {("2",), ("3",), ("4",), ("5",)}}]
    assert worker.get_stats().notifications == 2


def test_a_payload_too_large_names_the_counters_whose_keys_all_changed(conn: Conn) -> None:
    changes: Changes = {
        "big": {(i,) for i in range(5000)},
        "small": {(1,), (2,)},
    }
    text = payload(changes)
    assert len(text.encode()) <= MAX_PAYLOAD
    assert parse_payload(text) == {"big": None, "small": {("1",), ("2",)}}
    # PostgreSQL takes it
    conn.execute("LISTEN t")
    conn.execute("SELECT pg_notify('t', %s)", (text,))
    got = [n.payload for n in conn.notifies(timeout=1, stop_after=1)]
    assert got == [text]
    many: Changes = {f"counter_{i:03}_{'x' * 150}": {(i,)} for i in range(100)}
    assert parse_payload(payload(many)) == {"*": None}
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        conn.execute("SELECT pg_notify('t', %s)", (json.dumps(sorted(changes["big"] or ())),))


def _many_views(conn: Conn, pc: Counters, n: int = 3000) -> None:
    target = pc.create_counter("views", int).id
    pc.create_counter("likes", int)
    conn.execute(
        "INSERT INTO pgcounters.queue (target_id, key, delta)"
        " SELECT %s, ARRAY[g::text]::text, 1 FROM generate_series(1, %s) AS g",
        (target, n),
    )
    pc.incr("likes", 5)


def _reported(dsn: str, conn: Conn, settings: WorkerSettings) -> tuple[list[Changes], list[str]]:
    """What a worker reports of the queue: its callback's calls and its notifications."""
    calls: list[Changes] = []
    worker = Worker(dsn, settings, on_change=calls.append)
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute(f"LISTEN {CHANNEL}")
        with running(worker):
            wait_for(lambda: queued(conn) == 0)
            wait_for(lambda: worker.get_stats().deltas == 3001)
        return calls, _notifications(listener)


NOTIFYING = WorkerSettings(
    min_interval=0.01, max_interval=0.05, log_every=0, notify=True, notify_interval=0
)


def test_a_batch_with_more_keys_than_the_cap_reports_its_counter_as_many_keys(
    dsn: str, conn: Conn, pc: Counters
) -> None:
    _many_views(conn, pc)
    calls, texts = _reported(dsn, conn, NOTIFYING)
    # 3000 keys of views, above the default cap (1000): the counter without its keys,
    # the same way to the callback (None) and to the listeners ("*")
    assert calls == [{"views": None, "likes": {(5,)}}]
    assert len(texts) == 1
    assert json.loads(texts[0]) == {"likes": [["5"]], "views": "*"}
    assert parse_payload(texts[0]) == {"views": None, "likes": {("5",)}}


def test_a_cap_above_the_keys_of_a_batch_lists_them_all(dsn: str, conn: Conn, pc: Counters) -> None:
    _many_views(conn, pc)
    settings = WorkerSettings(**{**NOTIFYING.__dict__, "notify_max_keys": 5000})
    calls, texts = _reported(dsn, conn, settings)
    # the callback gets every key; the notification, too large to list them, says
    # "all of views"
    assert calls == [{"views": {(k,) for k in range(1, 3001)}, "likes": {(5,)}}]
    assert len(texts) == 1
    assert len(texts[0].encode()) <= MAX_PAYLOAD
    assert parse_payload(texts[0]) == {"views": None, "likes": {("5",)}}


def test_the_cap_counts_the_keys_of_each_counter_and_of_the_batches_held_back(
    pc: Counters,
) -> None:
    pc.create_counter("views", int)
    pc.create_counter("likes", int)
    for k in range(3):
        pc.incr("views", k)
    pc.incr("likes", 1)
    batch = pc.drain_queue_batch(changes=True, max_keys=2)
    assert batch.changes == {"views": None, "likes": {(1,)}}
    assert pc.drain_queue_batch(changes=True, max_keys=None).changes == {}
    for k in range(3):
        pc.incr("views", k)
    assert pc.drain_queue_batch(changes=True, max_keys=None).changes == {
        "views": {(0,), (1,), (2,)}
    }
    # the notifications merge batches: a counter whose keys add up above the cap is many
    held: Changes = {}
    merge(held, {"likes": {(1,)}}, 2)
    merge(held, {"likes": {(2,)}}, 2)
    assert held == {"likes": {(1,), (2,)}}
    merge(held, {"likes": {(3,)}}, 2)
    assert held == {"likes": None}
    merge(held, {"likes": {(4,)}}, 2)
    assert held == {"likes": None}
    with pytest.raises(ConfigurationError, match="notify_max_keys"):
        WorkerSettings(notify_max_keys=-1).validate()


def test_the_worker_command_notifies_other_processes(dsn: str, conn: Conn, pc: Counters) -> None:
    pc.create_counter("views", int)
    env = {k: v for k, v in os.environ.items() if k not in ("PGCOUNTERS_DSN", "DATABASE_URL")}
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute(f"LISTEN {CHANNEL}")
        proc = subprocess.Popen(
            [sys.executable, "-m", "pgcounters", "--dsn", dsn, "worker", "--log-every", "0",
             "--min-interval", "0.01", "--notify", "--notify-interval", "0"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            pc.incr("views", 3)
            pc.incr("views", 4, 2)
            got: dict[str, set[tuple[str, ...]] | None] = {}
            for note in listener.notifies(timeout=60):
                for name, keys in parse_payload(note.payload).items():
                    assert keys is not None
                    current = got.setdefault(name, set())
                    assert current is not None
                    current.update(keys)
                if got == {"views": {("3",), ("4",)}}:
                    break
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=60)
    assert got == {"views": {("3",), ("4",)}}
    assert proc.returncode == 0, err.decode()
