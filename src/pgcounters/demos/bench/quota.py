"""The reference quota technique's ``register_call`` against pgcounters' quota call, in one run.

Variants, each on one connection and then with 8 clients calling for one hot
subject (each call its own transaction, half the calls over the limit):

* ``reference``: the reference SQL function as published (``sql/reference_quota.sql``): a CTE
  reads the limit, a CTE writes the request log, one upsert counts;
* ``pgcounters``: :meth:`pgcounters.Quotas.register_call`, durable commits;
* ``pgcounters-async``: the same with ``synchronous_commit=False`` (the call's
  commit does not wait for the WAL flush).

Every run checks, per window, that the calls granted never exceed the limit,
that exactly ``min(limit, attempts)`` were granted, that every attempt was
counted, and that the clients saw as many grants as the table holds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from pgcounters.config import connect
from pgcounters.connection import Conn
from pgcounters.demos import sqlfiles
from pgcounters.demos.bench.report import Comparison, Measurement, Scenario
from pgcounters.quotas import Quotas
from pgcounters.schema import install

QUOTA = "bench.quota"
SUBJECT = "customer-1"
CUSTOMER = 1
VARIANTS = ("reference", "pgcounters", "pgcounters-async")
COMPARISONS: tuple[Comparison, ...] = (
    ("pgcounters", "reference", 2.0),
    ("pgcounters-async", "reference", 2.0),
    ("hot8-pgcounters", "hot8-reference", None),
    ("hot8-pgcounters-async", "hot8-reference", None),
)

Call = Callable[[], bool]


def prepare(dsn: str) -> None:
    """Create the reference tables (schema ``reference_quota``) and the pgcounters schema."""
    with connect(dsn) as conn:
        install(conn)
        conn.execute(sqlfiles.read("reference_quota.sql").encode())
        conn.execute(
            "INSERT INTO reference_quota.t_customer (id, customer_email) "
            "VALUES (%s, 'bench company')",
            (CUSTOMER,),
        )


def _reset(dsn: str, limit: int) -> None:
    with connect(dsn) as conn:
        conn.execute(
            "TRUNCATE reference_quota.t_log, reference_quota.t_log_count, "
            "reference_quota.t_customer_limit"
        )
        # the reference limit: clicks per day, valid over a range around now
        conn.execute(
            "INSERT INTO reference_quota.t_customer_limit (customer_id, clicks_per_day, trange) "
            "VALUES (%s, %s, tstzrange(now() - interval '2 days', now() + interval '2 days'))",
            (CUSTOMER, limit),
        )
        quotas = Quotas(conn)
        quotas.drop_quota(QUOTA)
        quotas.define_quota(QUOTA, limit)
        conn.execute("VACUUM ANALYZE reference_quota.t_log_count, pgcounters.quota_usage")


def _caller(variant: str, conn: Conn) -> Call:
    if variant == "reference":

        def reference_call() -> bool:
            row = conn.execute("SELECT * FROM reference_quota.register_call(%s)", (CUSTOMER,))
            got = row.fetchone()
            assert got is not None
            # the reference rule: allowed when counter_limit = counter_limit_real
            return bool(got[2] == got[3])

        return reference_call
    quotas = Quotas(conn, synchronous_commit=variant == "pgcounters")
    quotas.quota(QUOTA)  # schema checked before the clock starts

    def pgcounters_call() -> bool:
        return quotas.register_call(QUOTA, SUBJECT).allowed

    return pgcounters_call


def _check(dsn: str, variant: str, calls: int, granted: int, limit: int) -> tuple[bool, int]:
    """(exact, windows over the limit) from the stored rows of the run."""
    with connect(dsn) as conn:
        if variant == "reference":
            rows = conn.execute(
                "SELECT counter_limit, counter_limit_real FROM reference_quota.t_log_count "
                "WHERE customer_id = %s",
                (CUSTOMER,),
            ).fetchall()
        else:
            rows = conn.execute(
                "SELECT u.used, u.attempts FROM pgcounters.quota_usage u "
                "JOIN pgcounters.quotas q ON q.id = u.quota_id "
                "WHERE q.name = %s AND u.subject = %s",
                (QUOTA, SUBJECT),
            ).fetchall()
    over = sum(1 for used, _ in rows if used > limit)
    exact = (
        over == 0
        and all(used == min(limit, attempts) for used, attempts in rows)
        and sum(attempts for _, attempts in rows) == calls
        and sum(used for used, _ in rows) == granted
    )
    return exact, over


def run_variant(dsn: str, variant: str, clients: int, calls_per_client: int) -> Measurement:
    """One run: ``clients`` threads, each with its own connection, all for one subject."""
    calls = clients * calls_per_client
    limit = calls // 2
    _reset(dsn, limit)
    conns = [connect(dsn, autocommit=True) for _ in range(clients)]
    callers = [_caller(variant, c) for c in conns]
    granted = [0] * clients
    errors: list[BaseException] = []
    start = threading.Barrier(clients + 1)

    def client(idx: int) -> None:
        call = callers[idx]
        try:
            start.wait()
            granted[idx] = sum(call() for _ in range(calls_per_client))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    for c in conns:
        c.close()
    if errors:
        raise errors[0]
    exact, over = _check(dsn, variant, calls, sum(granted), limit)
    return Measurement(seconds, calls, exact, {"windows over limit": float(over)})


def quota(dsn: str, repeat: int, quick: bool) -> Scenario:
    single = 400 if quick else 4000
    per_client = 50 if quick else 500
    scenario = Scenario(
        "quota",
        "The reference quota technique's register_call, each call its own transaction, half of "
        f"them over the limit; "
        f"{single} calls on one connection, then 8 clients x {per_client} calls for one hot "
        "subject (hot8-*).",
        unit="calls",
    )
    scenario.headline = ("pgcounters", "reference")
    prepare(dsn)
    for i in range(repeat):
        # the order rotates from one repeat to the next: a variant that follows another
        # runs while the previous one's writes are still being flushed
        order = VARIANTS[i % len(VARIANTS) :] + VARIANTS[: i % len(VARIANTS)]
        for variant in order:
            scenario.add(variant, run_variant(dsn, variant, 1, single))
        for variant in order:
            scenario.add(f"hot8-{variant}", run_variant(dsn, variant, 8, per_client))
    scenario.compare(COMPARISONS)
    return scenario
