"""Concurrent callers never get more than the limit, and every attempt is counted."""

from __future__ import annotations

import datetime as dt
import threading

import psycopg
import pytest

from pgcounters import Quotas
from pgcounters.connection import Conn
from pgcounters.quotas import CallResult
from support import set_database_clock

CLIENTS = 50
LIMIT = 100
CALLS_PER_CLIENT = 4  # 200 attempts against a limit of 100
NOON = dt.datetime(2026, 3, 10, 12, 0, tzinfo=dt.UTC)


def _hammer(
    dsn: str,
    quota: str,
    subject: str,
    *,
    synchronous_commit: bool = True,
    cost: int = 1,
    at: dt.datetime | None = None,
) -> list[CallResult]:
    conns = [psycopg.connect(dsn, autocommit=True) for _ in range(CLIENTS)]
    results: list[CallResult] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    barrier = threading.Barrier(CLIENTS)

    def client(conn: Conn) -> None:
        quotas = Quotas(conn, synchronous_commit=synchronous_commit)
        quotas.quota(quota)  # schema checked before the start line
        try:
            barrier.wait()
            mine = [
                quotas.register_call(quota, subject, cost, at=at) for _ in range(CALLS_PER_CLIENT)
            ]
        except BaseException as exc:
            errors.append(exc)
            return
        with lock:
            results.extend(mine)

    threads = [threading.Thread(target=client, args=(c,)) for c in conns]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c in conns:
        c.close()
    if errors:
        raise errors[0]
    return results


@pytest.mark.slow
@pytest.mark.parametrize("synchronous_commit", [True, False])
def test_fifty_clients_get_exactly_the_limit(dsn: str, synchronous_commit: bool) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        Quotas(conn).define_quota("api", LIMIT)
        # every call and the status below in one day window, whatever the time of day
        set_database_clock(conn, NOON)
    results = _hammer(dsn, "api", "customer-1", synchronous_commit=synchronous_commit)
    attempts = CLIENTS * CALLS_PER_CLIENT
    assert len(results) == attempts
    assert sum(r.allowed for r in results) == LIMIT
    # each allowed call saw its own unit: the used counts of allowed calls are 1..LIMIT
    assert sorted(r.used for r in results if r.allowed) == list(range(1, LIMIT + 1))
    assert sorted(r.attempts for r in results) == list(range(1, attempts + 1))
    assert all(r.used == LIMIT for r in results if not r.allowed)
    with psycopg.connect(dsn, autocommit=True) as conn:
        status = Quotas(conn).status("api", "customer-1")
        rows = conn.execute("SELECT count(*) FROM pgcounters.quota_usage").fetchone()
    assert (status.used, status.attempts, status.rejected) == (LIMIT, attempts, attempts - LIMIT)
    assert rows == (1,)


@pytest.mark.slow
def test_concurrent_first_calls_of_a_new_window_create_one_row(dsn: str) -> None:
    """Every client's first call races to insert the window's row: the upsert keeps one."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        Quotas(conn).define_quota("q", 7, window="1d")
    when = dt.datetime(2026, 3, 10, 12, 0, tzinfo=dt.UTC)
    results = _hammer(dsn, "q", "s", cost=3, at=when)
    assert sum(r.allowed for r in results) == 2  # 2 x 3 units fit in 7, a third does not
    assert {(r.window_start, r.window_end) for r in results} == {
        (dt.datetime(2026, 3, 10, tzinfo=dt.UTC), dt.datetime(2026, 3, 11, tzinfo=dt.UTC))
    }
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT count(*), sum(attempts), max(used), max(rejected) FROM pgcounters.quota_usage"
        ).fetchone()
    attempts = CLIENTS * CALLS_PER_CLIENT
    assert rows == (1, attempts, 6, attempts - 2)
