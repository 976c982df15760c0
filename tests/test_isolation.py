"""User transactions at Read Committed, Repeatable Read and Serializable count exactly.

Writers run concurrently at one isolation level, each transaction incrementing
queued, unlogged and direct counters, writing a table with declared counters
and registering a quota call, while a drainer runs. A transaction PostgreSQL
aborts (serialization failure, deadlock) raises psycopg's own error, with its
SQLSTATE, and is retried whole; the totals are then exactly those of the
committed transactions.
"""

from __future__ import annotations

import datetime as dt
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import errors as pg

import blog_schema
import truth
from pgcounters import Counters, triggers
from pgcounters.connection import Conn
from pgcounters.quotas import Quotas
from support import set_database_clock

LEVELS = [
    psycopg.IsolationLevel.READ_COMMITTED,
    psycopg.IsolationLevel.REPEATABLE_READ,
    psycopg.IsolationLevel.SERIALIZABLE,
]
WRITERS = 3
TRANSACTIONS = 15
LIMIT = 25  # of the quota: fewer than the calls made, so refusals happen too
NOON = dt.datetime(2026, 3, 10, 12, 0, tzinfo=dt.UTC)
RETRYABLE = (pg.SerializationFailure, pg.DeadlockDetected)


def _run_retrying(conn: Conn, work: Callable[[], None], rng: random.Random) -> int:
    """Run ``work`` in a transaction until it commits; return the number of retries."""
    for retries in range(200):
        try:
            with conn.transaction():
                work()
            return retries
        except RETRYABLE:
            time.sleep(rng.uniform(0.001, 0.01))
    raise AssertionError("a transaction never committed")


@pytest.mark.parametrize("trigger_mode", ["queued", "direct"])
@pytest.mark.parametrize("level", LEVELS, ids=lambda lv: lv.name.lower())
def test_concurrent_transactions_count_exactly(
    dsn: str, conn: Conn, level: psycopg.IsolationLevel, trigger_mode: Any
) -> None:
    pc = Counters(conn)
    pc.create_counter("q", int)
    pc.create_counter("u", int, mode="unlogged")
    pc.create_counter("d", int, mode="direct")
    blog_schema.create(conn, users=2, articles=2)
    conn.execute("ALTER TABLE blog_article ADD COLUMN edits bigint NOT NULL DEFAULT 0")
    pc.create_column_counter("article.score", "blog_article", "edits", mode="direct")
    specs = blog_schema.specs(trigger_mode)
    triggers.install(conn, specs)
    Quotas(conn).define_quota("api", LIMIT)
    set_database_clock(conn, NOON)  # every call in one window, whatever the time of day

    committed: list[tuple[int, int]] = []  # (retries, quota calls allowed) per writer
    errors: list[BaseException] = []
    done = threading.Event()

    def writer(seed: int) -> None:
        rng = random.Random(seed)
        retries = allowed = 0
        with psycopg.connect(dsn, autocommit=True) as c:
            c.isolation_level = level
            wc = Counters(c)
            quotas = Quotas(c)
            outcome: list[bool] = []
            for _ in range(TRANSACTIONS):

                def work() -> None:
                    outcome.clear()
                    level_seen = c.execute("SHOW transaction_isolation").fetchone()
                    assert level_seen == (level.name.lower().replace("_", " "),)
                    hot = rng.randrange(2)
                    wc.incr("q", hot)
                    wc.incr("u", hot, 2)
                    wc.incr("d", hot, 3)
                    wc.incr("article.score", 1 + hot, 1)
                    c.execute(
                        "INSERT INTO blog_comment (article_id, creator_id, publish_status)"
                        " VALUES (%s, 1, 'public'), (%s, 2, 'private')",
                        (1 + hot, 1 + hot),
                    )
                    outcome.append(quotas.register_call("api", "shared").allowed)

                retries += _run_retrying(c, work, rng)
                allowed += outcome[0]
        committed.append((retries, allowed))

    def drainer() -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            c.isolation_level = level
            dc = Counters(c)
            while not done.is_set():
                dc.drain(batch_size=50)
                time.sleep(0.005)

    threads = [threading.Thread(target=_catch(errors, writer, i)) for i in range(WRITERS)]
    drain_thread = threading.Thread(target=_catch(errors, drainer))
    for t in [*threads, drain_thread]:
        t.start()
    for t in threads:
        t.join(timeout=300)
    done.set()
    drain_thread.join(timeout=60)
    assert errors == []

    total = WRITERS * TRANSACTIONS
    assert sum(pc.get("q", k) for k in (0, 1)) == total
    assert sum(pc.get("u", k) for k in (0, 1)) == 2 * total
    assert sum(pc.get("d", k) for k in (0, 1)) == 3 * total
    assert sum(pc.get("article.score", k) for k in (1, 2)) == total
    truth.assert_drained(conn, blog_schema.truths())
    # each committed transaction wrote one public and one private comment
    assert conn.execute(
        "SELECT count(*) FILTER (WHERE publish_status = 'public'), count(*) FROM blog_comment"
    ).fetchone() == (total, 2 * total)
    status = Quotas(conn).status("api", "shared")
    assert status.attempts == total
    assert status.used == sum(a for _, a in committed) == min(LIMIT, total)
    if level == psycopg.IsolationLevel.READ_COMMITTED:
        # Read Committed waits on row locks instead of failing
        assert sum(r for r, _ in committed) == 0


@pytest.mark.parametrize("level", LEVELS[1:], ids=lambda lv: lv.name.lower())
@pytest.mark.parametrize("what", ["direct counter", "quota call", "direct column counter"])
def test_a_concurrent_update_is_postgresqls_own_serialization_failure(
    dsn: str, conn: Conn, level: psycopg.IsolationLevel, what: str
) -> None:
    pc = Counters(conn)
    pc.create_counter("d", int, mode="direct")
    blog_schema.create(conn, users=1, articles=1)
    conn.execute("ALTER TABLE blog_article ADD COLUMN edits bigint NOT NULL DEFAULT 0")
    pc.create_column_counter("article.score", "blog_article", "edits", mode="direct")
    Quotas(conn).define_quota("api", 100)
    set_database_clock(conn, NOON)
    pc.incr("d", 1)  # the row exists: the second writer meets a concurrent update

    def act(c: Conn) -> None:
        if what == "direct counter":
            Counters(c).incr("d", 1)
        elif what == "direct column counter":
            Counters(c).incr("article.score", 1)
        else:
            Quotas(c).register_call("api", "s")

    Quotas(conn).register_call("api", "s")
    with psycopg.connect(dsn) as first, psycopg.connect(dsn) as second:
        first.isolation_level = second.isolation_level = level
        second.execute("SELECT 1")  # the second transaction's snapshot is taken now
        act(first)
        first.commit()
        with pytest.raises(pg.SerializationFailure) as caught:
            act(second)
        assert caught.value.sqlstate == "40001"
        second.rollback()
        act(second)  # the retry succeeds
        second.commit()
    expected = {"direct counter": ("d", 3), "direct column counter": ("article.score", 2)}
    if what == "quota call":
        assert Quotas(conn).status("api", "s").used == 3
    else:
        name, value = expected[what]
        assert pc.get(name, 1) == value


def test_queued_increments_never_conflict_at_serializable(dsn: str, conn: Conn) -> None:
    Counters(conn).create_counter("q", int)
    with psycopg.connect(dsn) as first, psycopg.connect(dsn) as second:
        for c in (first, second):
            c.isolation_level = psycopg.IsolationLevel.SERIALIZABLE
        Counters(first).incr("q", 1)
        Counters(second).incr("q", 1)
        first.commit()
        second.commit()  # inserts only: no serialization failure
    assert Counters(conn).get("q", 1) == 2


def _catch(errors: list[BaseException], fn: Callable[..., None], *args: Any) -> Callable[[], None]:
    def run() -> None:
        try:
            fn(*args)
        except BaseException as exc:
            errors.append(exc)

    return run
