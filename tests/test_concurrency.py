"""Concurrency: hot counters, several drainers, exact reads during draining."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter as Tally
from collections.abc import Callable

import psycopg
import pytest

from pgcounters import Counters
from pgcounters.client import Mode
from pgcounters.connection import Conn

WRITERS = 8
HOT = 3


def _threads(targets: list[Callable[[], None]]) -> list[BaseException]:
    errors: list[BaseException] = []

    def wrap(fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except BaseException as exc:
                errors.append(exc)

        return run

    threads = [threading.Thread(target=wrap(t)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    return errors


def test_hot_counters_with_two_drainers_are_exact(dsn: str, pc: Counters) -> None:
    pc.create_counter("hot", int)
    pc.create_counter("hot.unlogged", int, mode="unlogged")
    pc.create_counter("hot.global")
    expected: Tally[tuple[str, int | None]] = Tally()
    lock = threading.Lock()
    writing = threading.Event()
    writing.set()

    def writer(seed: int) -> Callable[[], None]:
        def run() -> None:
            rng = random.Random(seed)
            local: Tally[tuple[str, int | None]] = Tally()
            with psycopg.connect(dsn) as conn:
                wc = Counters(conn)
                for _ in range(150):
                    # several counters per transaction, in random order
                    items = [
                        rng.choice(
                            [("hot", rng.randrange(HOT)), ("hot.unlogged", rng.randrange(HOT)),
                             ("hot.global", None)]
                        )
                        for _ in range(rng.randint(1, 4))
                    ]  # fmt: skip
                    txn: Tally[tuple[str, int | None]] = Tally()
                    for name, key in items:
                        wc.incr(name, key, 1)
                        txn[(name, key)] += 1
                    if rng.random() < 0.2:
                        wc.incr_many([(n, k, 2) for n, k in items])
                        for item in items:
                            txn[item] += 2
                    if rng.random() < 0.1:
                        conn.rollback()  # rolled-back work must not count
                        continue
                    conn.commit()
                    local.update(txn)
            with lock:
                expected.update(local)

        return run

    def drainer() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            dc = Counters(conn)
            while writing.is_set():
                dc.drain(batch_size=50)
                time.sleep(0.001)
            dc.drain(batch_size=50)

    drain_errors: list[BaseException] = []
    drainers = threading.Thread(target=lambda: drain_errors.extend(_threads([drainer, drainer])))
    drainers.start()
    errors = _threads([writer(i) for i in range(WRITERS)])
    writing.clear()
    drainers.join()
    assert errors == []
    assert drain_errors == []
    pc.drain()
    assert pc.pending() == (0, 0)
    for (name, key), total in expected.items():
        assert pc.get(name, key, exact=False) == total, (name, key)
    assert sum(expected.values()) > WRITERS * 100


def test_exact_reads_while_draining_are_never_off(dsn: str, pc: Counters) -> None:
    pc.create_counter("c", int)
    total = 20_000
    with pc.conn.cursor() as cur:
        cur.execute(
            "INSERT INTO pgcounters.queue (target_id, key, delta)"
            " SELECT %s, '{1}', 1 FROM generate_series(1, %s)",
            (pc.counter("c").id, total),
        )
    seen: list[int] = []
    done = threading.Event()

    def reader() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            rc = Counters(conn)
            while not done.is_set():
                seen.append(rc.get("c", 1))

    def drainer() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            # batches of 97 (not one large batch of the backlog): reads between them
            Counters(conn).drain(batch_size=97, max_batch_size=97)

    r = threading.Thread(target=reader)
    r.start()
    errors = _threads([drainer, drainer])
    done.set()
    r.join()
    assert errors == []
    assert pc.get("c", 1, exact=False) == total
    assert len(seen) > 5
    assert set(seen) == {total}


def test_exact_reads_never_go_backwards_under_writes_and_drains(dsn: str, pc: Counters) -> None:
    pc.create_counter("m", None)
    done = threading.Event()
    violations: list[tuple[int, int]] = []

    def writer() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            wc = Counters(conn)
            for _ in range(600):
                wc.incr("m")

    def drainer() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            dc = Counters(conn)
            while not done.is_set():
                dc.drain(batch_size=13)

    def reader() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            rc = Counters(conn)
            last = 0
            while not done.is_set():
                now = rc.get("m")
                if now < last:
                    violations.append((last, now))
                last = now

    background = [threading.Thread(target=f) for f in (drainer, drainer, reader)]
    for t in background:
        t.start()
    errors = _threads([writer] * 4)
    done.set()
    for t in background:
        t.join()
    assert errors == []
    assert violations == []
    assert pc.get("m") == 2400


def test_several_drainers_never_apply_a_delta_twice(dsn: str, pc: Counters) -> None:
    pc.create_counter("many", int)
    with pc.conn.cursor() as cur:
        cur.execute(
            "INSERT INTO pgcounters.queue (target_id, key, delta)"
            " SELECT %s, ARRAY[(g %% 100)::text], g %% 7 + 1 FROM generate_series(1, 50000) g",
            (pc.counter("many").id,),
        )
    expected = Tally[int]()
    for g in range(1, 50001):
        expected[g % 100] += g % 7 + 1
    applied: list[int] = []

    def drainer(batch: int) -> Callable[[], None]:
        def run() -> None:
            with psycopg.connect(dsn, autocommit=True) as conn:
                drained = Counters(conn).drain(batch_size=batch, max_batch_size=batch)
                applied.append(drained.deltas)

        return run

    errors = _threads([drainer(b) for b in (100, 333, 1000, 4096)])
    assert errors == []
    assert sum(applied) == 50000
    assert pc.pending() == (0, 0)
    assert pc.get_many("many", range(100), exact=False) == [expected[k] for k in range(100)]


def test_queued_transactions_in_random_order_never_deadlock(dsn: str, pc: Counters) -> None:
    """The classic deadlock of hand-written counters: two transactions touching two counters
    in opposite orders."""
    pc.create_counter("a")
    pc.create_counter("b")
    barrier = threading.Barrier(2)

    def txn(order: tuple[str, str]) -> Callable[[], None]:
        def run() -> None:
            with psycopg.connect(dsn) as conn:
                c = Counters(conn)
                for _ in range(20):
                    c.incr(order[0])
                    barrier.wait(timeout=10)  # both hold their first increment
                    c.incr(order[1])
                    conn.commit()

        return run

    errors = _threads([txn(("a", "b")), txn(("b", "a"))])
    assert errors == []
    assert (pc.get("a"), pc.get("b")) == (40, 40)


def test_update_in_opposite_orders_does_deadlock(dsn: str, conn: Conn) -> None:
    """The same schedule with plain UPDATE, to show the test above would catch a deadlock."""
    conn.execute("CREATE TABLE cnt (name text PRIMARY KEY, v int NOT NULL)")
    conn.execute("INSERT INTO cnt VALUES ('a', 0), ('b', 0)")
    barrier = threading.Barrier(2)

    def txn(order: tuple[str, str]) -> Callable[[], None]:
        def run() -> None:
            with psycopg.connect(dsn) as c:
                c.execute("UPDATE cnt SET v = v + 1 WHERE name = %s", (order[0],))
                barrier.wait(timeout=10)
                c.execute("UPDATE cnt SET v = v + 1 WHERE name = %s", (order[1],))
                c.commit()

        return run

    errors = _threads([txn(("a", "b")), txn(("b", "a"))])
    assert any(isinstance(e, psycopg.errors.DeadlockDetected) for e in errors)


@pytest.mark.parametrize("mode", ["queued", "unlogged", "direct"])
def test_the_modes_that_never_deadlock_are_the_ones_the_readme_names(
    dsn: str, pc: Counters, mode: Mode
) -> None:
    """The README's first screen: queued and unlogged increments lock no counter row, so
    two transactions incrementing two counters in opposite orders both commit; direct ones
    update the row in place and, under the same schedule, deadlock (PostgreSQL aborts one,
    the other commits)."""
    pc.create_counter("a", mode=mode)
    pc.create_counter("b", mode=mode)
    barrier = threading.Barrier(2)
    rounds = 1 if mode == "direct" else 10

    def txn(order: tuple[str, str]) -> Callable[[], None]:
        def run() -> None:
            with psycopg.connect(dsn) as conn:
                c = Counters(conn)
                for _ in range(rounds):
                    c.incr(order[0])
                    barrier.wait(timeout=10)  # both hold their first increment
                    c.incr(order[1])
                    conn.commit()

        return run

    errors = _threads([txn(("a", "b")), txn(("b", "a"))])
    if mode == "direct":
        assert [type(e) for e in errors] == [psycopg.errors.DeadlockDetected]
        assert (pc.get("a"), pc.get("b")) == (1, 1)  # the survivor's two increments
    else:
        assert errors == []
        assert (pc.get("a"), pc.get("b")) == (20, 20)
