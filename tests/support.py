"""Helpers shared by the tests: waiting for a condition, counting queued deltas."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psycopg


def wait_for(condition: Callable[[], bool], timeout: float = 60.0, step: float = 0.02) -> None:
    """Poll until ``condition()`` holds; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(step)


def queued(conn: psycopg.Connection[Any]) -> int:
    """Deltas waiting in both queues."""
    row = conn.execute(
        "SELECT (SELECT count(*) FROM pgcounters.queue)"
        " + (SELECT count(*) FROM pgcounters.queue_unlogged)"
    ).fetchone()
    assert row is not None
    return int(row[0])


def tamper(conn: psycopg.Connection[Any], statement: str, params: Any = None) -> None:
    """Write a counter column by hand, as a bug or an operator would, past its guard.

    The guard lets pgcounters' own writers through when they turn on
    ``pgcounters.applying`` for their statement; a test that needs a wrong value
    on purpose does the same, in a transaction of its own.
    """
    with conn.transaction():
        conn.execute("SELECT set_config('pgcounters.applying', 'on', true)")
        conn.execute(statement, params)
