"""The worker as operators run it: ``python -m pgcounters worker`` in its own process.

kill -9 in the middle of batches, SIGTERM, a second signal, a PostgreSQL
restart under a running worker, a wrong DSN and a database without the schema.
"""

from __future__ import annotations

import os
import random
import select
import signal
import subprocess
import sys
import threading
import time
from collections import Counter as Tally
from collections.abc import Sequence
from pathlib import Path
from typing import IO

import psycopg
import pytest

from pgcounters import Counters, install
from pgcounters.connection import Conn
from pgcounters.embedded import EmbeddedPostgres
from pgcounters.worker import Worker
from support import queued, wait_for

WORKER_APP = "pgcounters worker"


def spawn(dsn: str, *args: str, log: IO[bytes] | int = subprocess.PIPE) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k not in ("PGCOUNTERS_DSN", "DATABASE_URL")}
    return subprocess.Popen(
        [sys.executable, "-m", "pgcounters", "--dsn", dsn, "worker", "--log-every", "0", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log,
    )


def worker_backends(conn: Conn) -> list[tuple[int, str, str | None, str]]:
    """(pid, state, wait_event_type, query) of the worker connections to this database."""
    rows = conn.execute(
        "SELECT pid, state, wait_event_type, query FROM pg_stat_activity"
        " WHERE datname = current_database() AND application_name = %s",
        (WORKER_APP,),
    ).fetchall()
    return [(int(r[0]), str(r[1]), r[2], str(r[3])) for r in rows]


def draining(conn: Conn) -> bool:
    """A worker is executing a drain batch right now."""
    return any(s == "active" and "pgcounters.drain_" in q for _, s, _, q in worker_backends(conn))


def fill(conn: Conn, counter: str, table: str, rows: int, keys: int) -> None:
    """Queue ``rows`` deltas of -1..3 over ``keys`` keys in one statement."""
    target = conn.execute("SELECT id FROM pgcounters.targets WHERE name = %s", (counter,))
    row = target.fetchone()
    assert row is not None
    query = (
        "INSERT INTO pgcounters.queue (target_id, key, delta)"
        " SELECT %s, ARRAY[(g %% %s)::text], (g %% 5) - 1 FROM generate_series(1, %s) g"
    )
    if table == "queue_unlogged":
        query = query.replace("pgcounters.queue ", "pgcounters.queue_unlogged ")
    conn.execute(query.encode(), (row[0], keys, rows))


def exact(pc: Counters, names: Sequence[tuple[str, int]]) -> dict[tuple[str, int], int]:
    out: dict[tuple[str, int], int] = {}
    for name, keys in names:
        for key, value in enumerate(pc.get_many(name, range(keys))):
            out[(name, key)] = value
    return out


def stored(pc: Counters, names: Sequence[tuple[str, int]]) -> dict[tuple[str, int], int]:
    out: dict[tuple[str, int], int] = {}
    for name, keys in names:
        for key, value in enumerate(pc.get_many(name, range(keys), exact=False)):
            out[(name, key)] = value
    return out


class Writer(threading.Thread):
    """Increments counters until stopped, keeping its own tally of what committed."""

    def __init__(self, dsn: str, names: Sequence[tuple[str, int]]) -> None:
        super().__init__(daemon=True)
        self.dsn, self.names = dsn, names
        self.tally: Tally[tuple[str, int]] = Tally()
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        rng = random.Random(7)
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                pc = Counters(conn)
                while not self.stopping.is_set():
                    items = []
                    for _ in range(20):
                        name, keys = rng.choice(self.names)
                        items.append((name, rng.randrange(keys), 1))
                    pc.incr_many(items)
                    self.tally.update((n, k) for n, k, _ in items)
                    time.sleep(0.002)
        except BaseException as exc:
            self.error = exc


COUNTERS = (("k", 100), ("u", 40), ("article.views", 50))


def _declare(conn: Conn, pc: Counters) -> None:
    pc.create_counter("k", int)
    pc.create_counter("u", int, mode="unlogged")
    conn.execute("CREATE TABLE article (id bigint PRIMARY KEY, views bigint NOT NULL DEFAULT 0)")
    conn.execute("INSERT INTO article (id) SELECT generate_series(0, 49)")
    pc.create_column_counter("article.views", "article", "views")


@pytest.mark.slow
def test_kill_9_in_the_middle_of_batches_loses_nothing_and_applies_nothing_twice(
    dsn: str, conn: Conn, pc: Counters
) -> None:
    _declare(conn, pc)
    fill(conn, "k", "queue", 200_000, 100)
    fill(conn, "u", "queue_unlogged", 40_000, 40)
    fill(conn, "article.views", "queue", 20_000, 50)
    before = exact(pc, COUNTERS)
    assert queued(conn) == 260_000
    writer = Writer(dsn, COUNTERS)
    writer.start()
    kills = 0
    rng = random.Random(20)
    try:
        while kills < 20:
            # batches of 2,000 at most: the kills land among many committed batches
            proc = spawn(dsn, "--batch-size", "2000", "--max-batch-size", "2000", "--min-interval",
                         "0.01", "--log-level", "warning", log=subprocess.DEVNULL)  # fmt: skip
            try:
                wait_for(lambda: draining(conn), timeout=60, step=0.002)
                time.sleep(rng.uniform(0, 0.05))
                wait_for(lambda: draining(conn), timeout=60, step=0.001)
                proc.kill()  # SIGKILL while a batch runs
                kills += 1
            finally:
                proc.kill()
                proc.wait(timeout=30)
    finally:
        writer.stopping.set()
        writer.join(timeout=60)
    assert writer.error is None
    assert kills == 20
    # the application wrote all along: its acknowledged increments are judged below
    assert sum(writer.tally.values()) >= 100
    # the workers committed batches between kills (drain statistics count committed batches
    # only), so the kills landed among many batches; the queue's length would not say so,
    # the writer adds to it all along
    row = conn.execute("SELECT count(DISTINCT pid), sum(batches) FROM pgcounters.drain_stats")
    workers, batches = row.fetchone() or (0, 0)
    assert workers >= 2
    assert batches >= 5  # 78 batches by 14 of the 20 workers in a run on an idle machine
    # the backends of killed workers roll back their open batch and go away
    wait_for(lambda: worker_backends(conn) == [], timeout=60)
    pc.drain(batch_size=50_000)
    assert queued(conn) == 0
    expected = Tally(before)
    expected.update(writer.tally)
    assert stored(pc, COUNTERS) == {k: expected[k] for k in before}
    views = dict(conn.execute("SELECT id, views FROM article").fetchall())
    assert {("article.views", int(i)): v for i, v in views.items()} == {
        k: v for k, v in expected.items() if k[0] == "article.views"
    }


def test_sigterm_finishes_the_batch_and_exits_0(dsn: str, conn: Conn, pc: Counters) -> None:
    _declare(conn, pc)
    fill(conn, "k", "queue", 300_000, 100)
    before = exact(pc, COUNTERS)
    proc = spawn(dsn, "--batch-size", "500", "--max-batch-size", "500")
    assert proc.stderr is not None
    wait_for(lambda: draining(conn), timeout=60, step=0.005)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    log = err.decode()
    assert proc.returncode == 0, log
    assert "SIGTERM received, finishing the current batch" in log
    assert "worker stopped:" in log
    assert worker_backends(conn) == []
    assert 0 < queued(conn) < 300_000  # it stopped early, after whole batches
    assert exact(pc, COUNTERS) == before


def _read_until(proc: subprocess.Popen[bytes], text: bytes, timeout: float = 60.0) -> bytes:
    """Read the process's stderr until ``text`` appears in it; what was read is returned."""
    assert proc.stderr is not None
    fd = proc.stderr.fileno()
    seen = b""
    deadline = time.monotonic() + timeout
    while text not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"{text!r} never came; stderr so far: {seen!r}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 4096)
            assert chunk, f"stderr closed before {text!r}: {seen!r}"
            seen += chunk
    return seen


def test_a_second_signal_stops_at_once_and_the_open_batch_rolls_back(
    dsn: str, conn: Conn, pc: Counters
) -> None:
    _declare(conn, pc)
    for i in range(10):
        pc.incr("article.views", i, 3)
    with psycopg.connect(dsn) as blocker:
        # an operator's lock on the queue (a parent row another transaction holds is
        # skipped, not waited for)
        blocker.execute("LOCK TABLE pgcounters.queue IN SHARE MODE")
        proc = spawn(dsn)
        assert proc.stderr is not None
        # the batch waits for the lock
        wait_for(lambda: any(w == "Lock" for _, _, w, _ in worker_backends(conn)), timeout=60)
        proc.send_signal(signal.SIGTERM)
        # the worker says it received the signal, and its batch still waits for the lock
        first = _read_until(proc, b"SIGTERM received, finishing the current batch")
        assert any(w == "Lock" for _, _, w, _ in worker_backends(conn))
        assert proc.poll() is None, "the first signal lets the batch finish"
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=30)
        err = first + rest
        assert proc.returncode == 130, err.decode()
        assert "interrupted" in err.decode()
        wait_for(lambda: worker_backends(conn) == [], timeout=30)
        assert queued(conn) == 10
        blocker.rollback()
    pc.drain()
    assert conn.execute("SELECT sum(views) FROM article").fetchone() == (30,)


def test_a_bad_dsn_fails_with_a_clear_message() -> None:
    proc = spawn("host=127.0.0.1 port=1 connect_timeout=2")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "pgcounters: error: could not connect to PostgreSQL" in err.decode()


def test_a_database_without_the_schema_fails_with_a_clear_message(empty_dsn: str) -> None:
    proc = spawn(empty_dsn)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "pgcounters install" in err.decode()


def applied(dsn: str) -> int:
    """Deltas applied so far, from the drain statistics."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT coalesce(sum(deltas), 0) FROM pgcounters.drain_stats").fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.slow
def test_the_worker_reconnects_after_postgresql_restarts(
    own_server: EmbeddedPostgres, tmp_path: Path
) -> None:
    dsn = own_server.dsn()
    with psycopg.connect(dsn, autocommit=True) as conn:
        install(conn)
        pc = Counters(conn)
        pc.create_counter("c", int)
        fill(conn, "c", "queue", 50_000, 10)
        expected = exact(pc, [("c", 10)])
    log_path = tmp_path / "worker.log"
    with log_path.open("wb") as log:
        proc = spawn(dsn, "--batch-size", "1000", "--min-interval", "0.01", "--max-interval",
                     "0.1", "--reconnect-max", "0.5", log=log)  # fmt: skip
        try:
            for mode, more in (("fast", 20_000), ("immediate", 10_000)):
                # the worker is draining (again) when PostgreSQL goes down
                done = applied(dsn)
                wait_for(lambda: applied(dsn) > done, timeout=120)  # noqa: B023
                own_server.restart(mode)
                with psycopg.connect(dsn, autocommit=True) as conn:
                    pc = Counters(conn)
                    before = exact(pc, [("c", 10)])
                    fill(conn, "c", "queue", more, 10)
                    after = exact(pc, [("c", 10)])
                    for key, value in after.items():
                        expected[key] += value - before[key]
            with psycopg.connect(dsn, autocommit=True) as conn:
                # caught up: everything queued before and after the restarts is applied
                wait_for(lambda: queued(conn) == 0, timeout=120)
                assert stored(Counters(conn), [("c", 10)]) == expected
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = log_path.read_text()
    assert "lost the connection to PostgreSQL" in text
    assert text.count("reconnected after") >= 2


def test_a_batch_running_when_its_worker_is_killed_rolls_back_and_frees_its_rows(
    dsn: str, conn: Conn, pc: Counters
) -> None:
    """A batch is one statement: PostgreSQL notices a lost client when it answers (and
    whether it then commits depends on when the loss shows), so the worker's session
    checks its client every second while a statement runs: the batch is cancelled and
    rolls back, and its rows are free again."""
    pc.create_counter("wide", int)
    fill(conn, "wide", "queue", 300_000, 300_000)  # one large batch of many keys
    proc = spawn(dsn, "--log-level", "warning", log=subprocess.DEVNULL)
    try:
        wait_for(lambda: draining(conn), timeout=60, step=0.005)
        proc.kill()
    finally:
        proc.kill()
        proc.wait(timeout=30)
    wait_for(lambda: worker_backends(conn) == [], timeout=30)
    # rolled back: every delta still queued, no value stored, no batch recorded
    assert queued(conn) == 300_000
    assert conn.execute("SELECT count(*) FROM pgcounters.counters").fetchone() == (0,)
    session = Worker(dsn)._open()
    with session:
        assert session.execute("SHOW client_connection_check_interval").fetchone() == ("1s",)
