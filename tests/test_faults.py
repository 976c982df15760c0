"""Faults: PostgreSQL crashing under load, timeouts and dropped connections mid-operation.

* An immediate shutdown (a crash as far as the data is concerned) of a server
  of the test's own, with durable settings, while writers increment and a
  drainer drains: every increment acknowledged before the crash is found after
  it (logged queue); the unlogged queue loses at most its pending deltas, and a
  recount restores a declared counter.
* A statement timeout, a lock timeout or a terminated connection in the middle
  of an increment, a drain, a recount and a quota call: a StatementTimeout or
  LockTimeout (PgCountersError subclasses that keep psycopg's class and
  SQLSTATE), or psycopg's OperationalError for a dead connection; nothing is
  left half done, and the retry succeeds.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
import time
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import psycopg
import pytest

import blog_schema
import truth
from pgcounters import Counters, triggers
from pgcounters.batching import BatchingCounters
from pgcounters.connection import Conn
from pgcounters.embedded import EmbeddedPostgres
from pgcounters.errors import (
    BatchAborted,
    BufferFlushFailed,
    LockTimeout,
    PgCountersError,
    StatementTimeout,
)
from pgcounters.quotas import Quotas
from pgcounters.repair import recount, verify
from pgcounters.schema import install
from support import set_database_clock, wait_for

WRITERS = 4
NOON = dt.datetime(2026, 3, 10, 12, 0, tzinfo=dt.UTC)
MIN_ACKED = 25  # acknowledged operations of each kind before the crash: the load ran
TOTAL = truth.from_sql("blog.comments_total", "SELECT count(*) FROM blog_comment")


def _figures(name: str, **numbers: int) -> None:
    """Append the figures of a fault run to $PGCOUNTERS_FAULT_FIGURES (for the docs)."""
    path = os.environ.get("PGCOUNTERS_FAULT_FIGURES")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps({"test": name, **numbers}) + "\n")


# -- crash -------------------------------------------------------------------


def test_immediate_shutdown_under_load(own_server: EmbeddedPostgres) -> None:
    _crash_under_load(own_server)  # a server of the test's own, durable settings: fsync on


def _crash_under_load(server: EmbeddedPostgres) -> None:
    dsn = server.dsn()
    spec = blog_schema.specs("unlogged")[-1]  # blog.comments_total, by trigger, unlogged
    with psycopg.connect(dsn, autocommit=True) as conn:
        install(conn)
        pc = Counters(conn)
        pc.create_counter("logged", int)
        pc.create_counter("fast", int, mode="unlogged")
        blog_schema.create(conn, users=1, articles=1)
        triggers.install(conn, [spec])
        fast_id = pc.counter("fast").id
        pc.create_counter("batched", int)
        Quotas(conn).define_quota("api", 10**9)
        set_database_clock(conn, NOON)  # calls and statuses in one window, before and after

    kinds = ("logged", "fast", "rows", "calls")
    acked = {k: [0] * WRITERS for k in kinds}
    doubt = {k: [0] * WRITERS for k in kinds}
    drained_stored = [0]  # the committed stored value of "fast" seen by the drainer
    batched = {"made": 0, "acked": 0}
    batching = BatchingCounters(dsn, interval=None, flush_at_exit=False)
    started = threading.Barrier(WRITERS + 3)

    def writer(i: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            wc = Counters(c)
            quotas = Quotas(c)
            started.wait()
            steps: list[tuple[str, Callable[[], object]]] = [
                ("logged", lambda: wc.incr("logged", i)),
                ("fast", lambda: wc.incr("fast", i)),
                ("rows", lambda: c.execute("INSERT INTO blog_comment (article_id) VALUES (1)")),
                ("calls", lambda: quotas.register_call("api", f"s{i}")),
            ]
            while True:
                for what, step in steps:
                    try:
                        step()
                    except psycopg.OperationalError:
                        doubt[what][i] += 1  # sent, outcome unknown: committed or not
                        return
                    acked[what][i] += 1

    def drainer() -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            dc = Counters(c)
            started.wait()
            try:
                while True:
                    dc.drain(batch_size=200, max_batches=2)
                    row = c.execute(
                        "SELECT coalesce(sum(value), 0) FROM pgcounters.counters"
                        " WHERE target_id = %s",
                        (fast_id,),
                    ).fetchone()
                    assert row is not None
                    drained_stored[0] = int(row[0])
            except psycopg.OperationalError:
                return

    def batch_writer() -> None:
        # the batching incrementer: a batch is acknowledged when flush() returns
        started.wait()
        while True:
            for k in range(5):
                batching.incr("batched", k % 3)
                batched["made"] += 1
            try:
                batching.flush()
            except BufferFlushFailed:
                return  # kept in the buffer, in doubt: flushed again after the restart
            batched["acked"] = batched["made"]

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(WRITERS)]
    threads.append(threading.Thread(target=drainer))
    threads.append(threading.Thread(target=batch_writer))
    for t in threads:
        t.start()
    started.wait()

    def loaded() -> bool:
        # every kind of write acknowledged many times, and the drainer stored some of "fast"
        return (
            all(sum(acked[k]) >= MIN_ACKED for k in kinds)
            and batched["acked"] >= MIN_ACKED
            and drained_stored[0] > 0
        )

    wait_for(loaded, timeout=120)
    server.restart("immediate")
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    for k in kinds:  # judged below only once the load is known to have run
        assert sum(acked[k]) >= MIN_ACKED, k
    assert batched["acked"] >= MIN_ACKED
    assert drained_stored[0] > 0

    with psycopg.connect(server.dsn(), autocommit=True) as conn:
        pc = Counters(conn)
        assert pc.pending()[1] == 0  # the unlogged queue came back empty
        lost_logged = 0
        for i in range(WRITERS):
            found = pc.get("logged", i)
            # nothing acknowledged is lost; an increment in doubt may or may not be there
            assert acked["logged"][i] <= found <= acked["logged"][i] + doubt["logged"][i]
            lost_logged += acked["logged"][i] - min(found, acked["logged"][i])
        fast_found = sum(pc.get("fast", i) for i in range(WRITERS))
        fast_acked = sum(acked["fast"])
        # the unlogged loss is bounded by what was pending: drained deltas survive
        assert drained_stored[0] <= fast_found <= fast_acked + sum(doubt["fast"])
        rows = conn.execute("SELECT count(*) FROM blog_comment").fetchone()
        assert rows is not None
        assert sum(acked["rows"]) <= rows[0] <= sum(acked["rows"]) + sum(doubt["rows"])
        quotas = Quotas(conn)
        for i in range(WRITERS):
            used = quotas.status("api", f"s{i}").used
            assert acked["calls"][i] <= used <= acked["calls"][i] + doubt["calls"][i]
        # the batch in doubt is looked up by its flush id: written once, never twice
        batched_before = sum(pc.get("batched", k) for k in range(3))
        assert batched["acked"] <= batched_before <= batched["made"]
        for _ in range(50):
            try:
                batching.flush()
                break
            except BufferFlushFailed:
                time.sleep(0.1)
        batching.close()
        assert sum(pc.get("batched", k) for k in range(3)) == batched["made"]
        # the crash emptied the unlogged queue: the truth counted by hand finds the loss,
        # verify reports exactly it, and recount repairs it
        before = truth.exact_mismatches(conn, TOTAL)
        assert [(m.key, m.truth, m.found) for m in before] == [
            (m.key, m.expected, m.actual) for m in verify(conn, spec).mismatches
        ]
        recount(conn, spec)
        truth.assert_drained(conn, [TOTAL])
        assert verify(conn, spec).mismatches == []
        assert pc.get(spec.name) == rows[0]
    _figures(
        "crash",
        logged_acked=sum(acked["logged"]),
        logged_in_doubt=sum(doubt["logged"]),
        logged_lost=lost_logged,
        unlogged_acked=fast_acked,
        unlogged_found=fast_found,
        unlogged_lost=max(0, fast_acked - fast_found),
        unlogged_pending_bound=fast_acked - drained_stored[0],
        declared_rows=int(rows[0]),
        quota_calls_acked=sum(acked["calls"]),
        quota_calls_in_doubt=sum(doubt["calls"]),
        batched_increments=batched["made"],
        batched_acked_before_crash=batched["acked"],
        batched_found_before_reflush=batched_before,
        declared_off_by_before_recount=sum(int(abs(Decimal(m.truth) - m.found)) for m in before),
    )


# -- timeouts and dropped connections -----------------------------------------

OPS = ["incr queued", "incr direct", "drain", "recount", "quota call"]
FAULTS = ["statement timeout", "lock timeout", "terminated"]


def _state(conn: Conn) -> tuple[Any, ...]:
    return tuple(
        conn.execute(s).fetchall()
        for s in (
            "SELECT target_id, key, delta FROM pgcounters.queue ORDER BY id",
            "SELECT target_id, key, value FROM pgcounters.counters ORDER BY 1, 2",
            "SELECT quota_id, subject, used, attempts FROM pgcounters.quota_usage ORDER BY 1, 2",
            "SELECT count(*) FROM blog_comment",
        )
    )


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("op", OPS)
def test_fault_in_the_middle_of(dsn: str, conn: Conn, op: str, fault: str) -> None:
    pc = Counters(conn)
    pc.create_counter("q", int)
    pc.create_counter("d", int, mode="direct")
    blog_schema.create(conn, users=1, articles=1)
    spec = blog_schema.specs("queued")[-1]  # blog.comments_total
    triggers.install(conn, [spec])
    quotas = Quotas(conn)
    quotas.define_quota("api", 100)
    set_database_clock(conn, NOON)
    # stored rows exist, so that the blocker below can lock them
    pc.incr("q", 1, 5)
    pc.incr("d", 1, 5)
    conn.execute("INSERT INTO blog_comment (article_id) SELECT 1 FROM generate_series(1, 3)")
    pc.drain()
    quotas.register_call("api", "s")
    pc.incr("q", 1, 2)  # pending, for the drain
    conn.execute(
        "UPDATE pgcounters.counters SET value = 99 WHERE target_id = %s",
        (pc.counter(spec.name).id,),
    )  # wrong, for the recount

    lock = {
        "incr queued": "LOCK TABLE pgcounters.queue IN SHARE MODE",
        "incr direct": "SELECT 1 FROM pgcounters.counters WHERE target_id = %(d)s FOR UPDATE",
        "drain": "SELECT 1 FROM pgcounters.counters WHERE target_id = %(q)s FOR UPDATE",
        "recount": "SELECT 1 FROM pgcounters.counters WHERE target_id = %(c)s FOR UPDATE",
        "quota call": "SELECT 1 FROM pgcounters.quota_usage FOR UPDATE",
    }[op]
    ids = {"q": pc.counter("q").id, "d": pc.counter("d").id, "c": pc.counter(spec.name).id}

    def act(c: Conn) -> None:
        if op == "incr queued":
            Counters(c).incr("q", 1, 1)
        elif op == "incr direct":
            Counters(c).incr("d", 1, 1)
        elif op == "drain":
            Counters(c).drain()
        elif op == "recount":
            recount(c, spec.name, busy_attempts=2)
        else:
            Quotas(c).register_call("api", "s")

    before = _state(conn)
    with psycopg.connect(dsn) as blocker, psycopg.connect(dsn, autocommit=True) as victim:
        blocker.execute(lock, ids)
        if fault == "statement timeout":
            victim.execute("SET statement_timeout = '300ms'")
            # a recount retries what PostgreSQL aborts, then stops with BatchAborted
            with pytest.raises(BatchAborted if op == "recount" else StatementTimeout) as timeout:
                act(victim)
            cause = timeout.value.__cause__ if op == "recount" else timeout.value
            assert isinstance(cause, psycopg.errors.QueryCanceled)
            assert cause.sqlstate == "57014"
        elif fault == "lock timeout":
            victim.execute("SET lock_timeout = '300ms'")
            with pytest.raises(BatchAborted if op == "recount" else LockTimeout) as locked:
                act(victim)
            cause = locked.value.__cause__ if op == "recount" else locked.value
            assert isinstance(cause, psycopg.errors.LockNotAvailable)
            assert cause.sqlstate == "55P03"
        else:
            killer = threading.Thread(target=_terminate_when_waiting, args=(dsn, victim))
            killer.start()
            with pytest.raises(psycopg.OperationalError) as dropped:
                act(victim)
            killer.join()
            assert not isinstance(dropped.value, PgCountersError)
            assert victim.broken
        blocker.rollback()
        assert _state(conn) == before  # nothing half done
    with psycopg.connect(dsn, autocommit=True) as again:
        act(again)  # the retry succeeds
    if op == "incr queued":
        assert pc.get("q", 1) == 8
    elif op == "incr direct":
        assert pc.get("d", 1) == 6
    elif op == "drain":
        assert pc.pending() == (0, 0)
        assert pc.get("q", 1, exact=False) == 7
    elif op == "recount":
        truth.assert_exact(conn, [TOTAL])
        assert truth.values(conn, TOTAL) == {(): 3}
        assert verify(conn, spec).mismatches == []
    else:
        assert quotas.status("api", "s").used == 2
    _figures(f"{op}: {fault}", faults=1, retries=1)


def _terminate_when_waiting(dsn: str, victim: Conn) -> None:
    pid = victim.info.backend_pid
    with psycopg.connect(dsn, autocommit=True) as admin:
        for _ in range(500):
            row = admin.execute(
                "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
            ).fetchone()
            if row and row[0] == "Lock":
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
                return
            time.sleep(0.01)
    raise AssertionError("the victim never waited on the lock")
