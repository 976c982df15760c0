"""Sliding windows: any span of the window holds at most the limit, under concurrency too."""

from __future__ import annotations

import datetime as dt
import functools
import random
import threading
from collections.abc import Callable

import psycopg
import pytest

from pgcounters import (
    InvalidArgument,
    InvalidBucketWidth,
    InvalidQuotaDefinition,
    QuotaDefinitionConflict,
    Quotas,
)
from pgcounters.connection import Conn
from pgcounters.quotas import CallResult, parse_window, sliding_window, window_bucket_width
from pgcounters.ratelimit import parse_rate

UTC = dt.UTC
# a whole minute: buckets of 1 s and windows of 60 s start on it
T0 = dt.datetime(2026, 3, 10, 12, 0, tzinfo=UTC)


def sec(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def test_sliding_windows_parse() -> None:
    assert parse_window("sliding:minute") == ("sliding", 60)
    assert parse_window("sliding:15m") == ("sliding", 900)
    assert parse_window("Sliding:day") == ("sliding", 86400)
    assert parse_window("sliding:week") == ("sliding", 604800)
    assert sliding_window("hour") == "sliding:3600s"
    assert sliding_window(90) == "sliding:90s"
    assert sliding_window("sliding:2h") == "sliding:7200s"
    assert parse_rate("100/sliding:hour") == (100, "sliding:hour")
    for bad in ("sliding:month", "sliding:", "sliding:sliding:1h", "sliding:0s"):
        with pytest.raises(InvalidQuotaDefinition):
            parse_window(bad)


def test_a_bucket_width_written_in_the_window(conn: Conn, dsn: str) -> None:
    """``"sliding:hour by 5m"``: a sliding window and the width of its buckets, in the core
    quotas, rate strings and the command line; a bad width is an InvalidArgument."""
    assert parse_window("sliding:hour by 5m") == ("sliding", 3600)
    assert window_bucket_width("sliding:hour by 5m") == 300
    assert window_bucket_width("sliding:day BY 15m") == 900
    assert window_bucket_width("sliding:hour") is None
    assert sliding_window("hour by 1m") == "sliding:3600s by 60s"
    assert parse_rate("100/sliding:hour by 1m") == (100, "sliding:hour by 1m")
    assert parse_rate("100/hour by 1m", sliding=True) == (100, "sliding:3600s by 60s")
    # the strings without a width read as before
    assert parse_rate("100/sliding:hour") == (100, "sliding:hour")
    assert parse_rate("100/hour", sliding=True) == (100, "sliding:3600s")
    q = Quotas(conn)
    assert q.define_quota("api", 10, window="sliding:hour by 5m").bucket_seconds == 300
    assert q.define_quota("wide", 10, window="sliding:hour by 1h").bucket_seconds == 3600
    # the same width given twice is one width; redefining with another is a conflict
    assert q.define_quota("api", 20, window="sliding:hour by 5m", granularity="300s").default_limit
    with pytest.raises(QuotaDefinitionConflict):
        q.define_quota("api", 10, window="sliding:hour by 10m")
    bad = {
        "sliding:hour by 7m": "do not divide a sliding window of 3600s",
        "sliding:hour by 2h": "do not divide",
        "sliding:hour by 0m": "positive duration",
        "sliding:hour by 0": "positive duration",
        "sliding:hour by day": "positive duration",
        "sliding:day by 1s": r"86400 buckets .* at most 1000 \(the narrowest width is 90s\)",
        "hour by 1m": "only a sliding window has buckets",
        "sliding:hour by": "write a sliding window, by and the width",
        "sliding:hour by 1m by 2m": "write a sliding window, by and the width",
    }
    for window, message in bad.items():
        attempts: list[Callable[[], object]] = [
            functools.partial(parse_window, window),
            functools.partial(parse_rate, f"10/{window}"),
            functools.partial(q.define_quota, "bad", 10, window=window),
        ]
        for attempt in attempts:
            with pytest.raises(InvalidBucketWidth, match=message) as refused:
                attempt()
            assert isinstance(refused.value, InvalidArgument)
            assert isinstance(refused.value, InvalidQuotaDefinition)
    with pytest.raises(InvalidBucketWidth, match="two bucket widths"):
        q.define_quota("bad", 10, window="sliding:hour by 5m", granularity="1m")
    with pytest.raises(InvalidBucketWidth, match="do not divide"):
        parse_rate("10/hour by 7m", sliding=True)
    assert [x.name for x in q.quotas()] == ["api", "wide"]  # nothing of the refused ones

    from pgcounters import cli

    assert cli.run(["--dsn", dsn, "quota", "define", "cli", "--window", "sliding:hour by 10m"]) == 0
    assert Quotas(conn).quota("cli").bucket_seconds == 600


def test_define_sliding_quota(conn: Conn) -> None:
    q = Quotas(conn)
    quota = q.define_quota("api", 10, window="sliding:hour")
    assert (quota.period, quota.window_seconds, quota.bucket_seconds) == ("sliding", 3600, 60)
    assert quota.window == "sliding:3600s"
    assert "buckets of 60s" in quota.describe()
    assert q.define_quota("fine", 10, window="sliding:minute", granularity="5s").bucket_seconds == 5
    # 90 s has no whole sixtieth: the widest divisor below it
    assert q.define_quota("odd", 10, window="sliding:90s").bucket_seconds == 1
    # redefining keeps the buckets; another window or bucket width is a conflict
    assert q.define_quota("fine", 20, window="sliding:minute").bucket_seconds == 5
    with pytest.raises(QuotaDefinitionConflict):
        q.define_quota("fine", 20, window="sliding:minute", granularity="10s")
    with pytest.raises(QuotaDefinitionConflict):
        q.define_quota("api", 10, window="hour")
    with pytest.raises(InvalidQuotaDefinition, match="at most 1000"):
        q.define_quota("bad", 10, window="sliding:hour", granularity="1s")
    with pytest.raises(InvalidQuotaDefinition, match="divide"):
        q.define_quota("bad", 10, window="sliding:hour", granularity="7s")
    with pytest.raises(InvalidQuotaDefinition, match="sliding windows only"):
        q.define_quota("bad", 10, window="hour", granularity="1m")
    with pytest.raises(InvalidQuotaDefinition, match="time zone"):
        q.define_quota("bad", 10, window="sliding:day", time_zone="Europe/Berlin")
    assert [x.name for x in q.quotas()] == ["api", "fine", "odd"]


def test_the_window_slides(conn: Conn) -> None:
    q = Quotas(conn)
    q.define_quota("api", 3, window="sliding:minute")  # buckets of 1 s
    assert [q.register_call("api", "k", at=sec(s)).allowed for s in (0, 10, 20, 30)] == [
        True,
        True,
        True,
        False,
    ]
    refused = q.register_call("api", "k", at=sec(59.5))
    # a fixed minute would start afresh at 12:01; the call of 12:00:00 still counts then
    assert not refused.allowed
    assert (refused.used, refused.attempts, refused.limit) == (3, 5, 3)
    # the call of second 0 leaves the window when second 61 begins: one bucket later than
    # an exact log would let it go (second 60), never earlier
    assert refused.retry_after == pytest.approx(1.5)
    assert refused.window_start == sec(-1)
    assert refused.window_end == sec(60)
    assert not q.register_call("api", "k", at=sec(60.5)).allowed
    allowed = q.register_call("api", "k", at=sec(61))
    assert allowed.allowed
    assert allowed.used == 3
    # the oldest units still in the window (second 10) leave at second 71
    assert allowed.retry_after == pytest.approx(10)
    status = q.status("api", "k", at=sec(61))
    # second 0 has left the window: the calls of seconds 10 to 61
    assert (status.used, status.attempts, status.rejected) == (3, 6, 3)
    # seconds 10 and 20 gone, 61 left
    assert q.status("api", "k", at=sec(81)).used == 1
    assert q.status("api", "k", at=sec(1000)).used == 0
    assert q.status("api", "never", at=sec(5)).used == 0


def test_cost_and_limits(conn: Conn) -> None:
    q = Quotas(conn)
    q.define_quota("api", 10, window="sliding:10s")  # buckets of 1 s
    assert q.register_call("api", "k", 7, at=sec(0)).allowed
    refused = q.register_call("api", "k", 4, at=sec(5))
    assert not refused.allowed
    assert refused.used == 7
    assert refused.retry_after == pytest.approx(6)  # second 0 leaves at second 11
    assert q.register_call("api", "k", 3, at=sec(5)).allowed
    # a cost above the limit never fits: retry when every bucket has gone
    never = q.register_call("api", "k", 11, at=sec(5))
    assert not never.allowed
    assert never.retry_after == pytest.approx(11)
    q.set_limit("api", "big", 100)
    assert q.register_call("api", "big", 60, at=sec(0)).limit == 100


def _spans_ok(grants: list[tuple[int, int]], buckets: int, limit: int) -> None:
    """No run of ``buckets + 1`` consecutive buckets holds more than ``limit`` granted
    units: so no span of the window does (every span lies within such a run)."""
    per: dict[int, int] = {}
    for bucket, units in grants:
        per[bucket] = per.get(bucket, 0) + units
    for last in per:
        held = sum(per.get(b, 0) for b in range(last - buckets, last + 1))
        assert held <= limit, f"{held} units granted in the buckets ending at {last}"


def test_random_calls_never_exceed_and_refuse_only_within_a_bucket(conn: Conn) -> None:
    q = Quotas(conn)
    q.define_quota("api", 5, window="sliding:20s", granularity="2s")  # 10 buckets of 2 s
    rng = random.Random(7)
    instants = sorted(rng.uniform(0, 200) for _ in range(400))
    granted: list[tuple[float, int]] = []
    for t in instants:
        cost = rng.choice((1, 1, 1, 2))
        result = q.register_call("api", "k", cost, at=sec(t))
        # an exact log of the span (t - 20 s, t]
        exact = sum(units for at_, units in granted if t - 20 < at_ <= t)
        # what the buckets count: from the start of the bucket 20 s before t's
        covered = sum(units for at_, units in granted if (t // 2 - 10) * 2 <= at_ <= t)
        assert exact <= covered <= exact + sum(u for a, u in granted if t - 22 < a <= t - 20)
        assert result.allowed == (covered + cost <= 5)
        if result.allowed:
            assert exact + cost <= 5  # never over the limit in any span
            granted.append((t, cost))
        assert result.used == covered + (cost if result.allowed else 0)
    _spans_ok([(int(t // 2), c) for t, c in granted], 10, 5)
    assert len(granted) > 30  # the model was exercised on both decisions


CLIENTS = 40
CALLS = 5


def test_concurrent_callers_across_a_window_boundary(dsn: str, conn: Conn) -> None:
    """Callers on both sides of the instant the first bucket leaves the window, at once:
    never one unit over the limit, and the window ends exactly full."""
    q = Quotas(conn)
    q.define_quota("api", 100, window="sliding:minute")  # 60 buckets of 1 s
    assert all(q.register_call("api", "k", at=sec(0.5)).allowed for _ in range(60))
    before, after = sec(60.5), sec(61.5)  # the second-0 bucket counts, then not

    conns = [psycopg.connect(dsn, autocommit=True) for _ in range(CLIENTS)]
    results: list[tuple[dt.datetime, CallResult]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    barrier = threading.Barrier(CLIENTS)

    def client(c: Conn, instant: dt.datetime) -> None:
        quotas = Quotas(c)
        quotas.quota("api")
        try:
            barrier.wait()
            mine = [(instant, quotas.register_call("api", "k", at=instant)) for _ in range(CALLS)]
        except BaseException as exc:
            errors.append(exc)
            return
        with lock:
            results.extend(mine)

    threads = [
        threading.Thread(target=client, args=(c, before if i % 2 else after))
        for i, c in enumerate(conns)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c in conns:
        c.close()
    assert not errors, errors
    assert len(results) == CLIENTS * CALLS

    # each grant is counted in the bucket its window ends with (its own, or a newer one
    # when a later caller had moved the window on first)
    grants = [(0, 60)] + [
        (int((r.window_end - T0).total_seconds()) - 1, 1) for _, r in results if r.allowed
    ]
    for instant, r in results:
        assert r.window_end - dt.timedelta(seconds=1) >= instant.replace(microsecond=0)
    _spans_ok(grants, 60, 100)
    granted_before = sum(1 for _, r in results if r.allowed and r.window_end == sec(61))
    assert granted_before <= 40  # beside the 60 units of second 0
    status = q.status("api", "k", at=after)
    # the 60 units of second 0 have left: the window filled up to the limit, not one more
    assert status.used == 100
    assert status.attempts == CLIENTS * CALLS
    assert sum(1 for _, r in results if r.allowed) == 100
    assert status.rejected == CLIENTS * CALLS - 100


def test_storage_stays_bounded_and_purge_removes_idle_subjects(conn: Conn) -> None:
    q = Quotas(conn)
    q.define_quota("api", 1000, window="sliding:minute")
    for i in range(300):
        q.register_call("api", "busy", at=sec(i * 0.7))
    q.register_call("api", "idle", at=sec(0))
    rows = conn.execute(
        "SELECT subject, cardinality(granted), cardinality(tried), cardinality(refused)"
        " FROM pgcounters.quota_sliding_usage ORDER BY subject"
    ).fetchall()
    assert rows == [("busy", 61, 61, 61), ("idle", 61, 61, 61)]
    # the idle subject's bucket left the window at second 61
    assert q.purge(sec(60.9)).windows == 0
    assert q.purge(sec(61)).windows == 1
    assert [r[0] for r in conn.execute("SELECT subject FROM pgcounters.quota_sliding_usage")] == [
        "busy"
    ]
    last = int(299 * 0.7)
    expected = sum(1 for i in range(300) if int(i * 0.7) >= last - 60)
    report = q.report("api")
    assert [(u.subject, u.used, u.attempts) for u in report] == [("busy", expected, expected)]
    assert q.drop_quota("api")
    assert conn.execute("SELECT count(*) FROM pgcounters.quota_sliding_usage").fetchone() == (0,)


def test_logged_and_rejected_reports(conn: Conn) -> None:
    q = Quotas(conn)
    q.define_quota("api", 1, window="sliding:10s", log=True)
    q.register_call("api", "a", at=sec(0), details={"path": "/x"})
    q.register_call("api", "a", at=sec(1))
    assert [c.allowed for c in q.logged_calls("api")] == [False, True]
    top = q.top_rejected("api")
    assert [(t.subject, t.rejected, t.attempts) for t in top] == [("a", 1, 2)]


def test_calls_from_sql(conn: Conn) -> None:
    conn.execute("SELECT pgcounters.define_quota('api', 2, 'sliding', 60)")
    rows = [
        conn.execute(
            "SELECT allowed FROM pgcounters.register_call('api', 'k', 1, %s)", (sec(s),)
        ).fetchone()
        for s in (0, 30, 59, 61)
    ]
    assert rows == [(True,), (True,), (False,), (True,)]
    assert conn.execute(
        "SELECT bucket_seconds FROM pgcounters.quotas WHERE name = 'api'"
    ).fetchone() == (1,)


def test_define_from_the_command_line(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    from pgcounters import cli

    code = cli.run(["--dsn", dsn, "quota", "define", "api", "--limit", "5",
                 "--window", "sliding:hour", "--granularity", "5m"])  # fmt: skip
    assert code == 0
    assert "api: window sliding:3600s in buckets of 300s" in capsys.readouterr().out


def test_roles_granted_before_the_upgrade_use_sliding_windows(empty_dsn: str) -> None:
    """An application role and a worker role granted at version 17 read, register and purge
    sliding quotas once the schema is upgraded, without being granted again."""
    from pgcounters import schema, sqlfiles
    from roles import login_role

    with psycopg.connect(empty_dsn, autocommit=True) as admin:
        for migration in sqlfiles.migrations():
            if migration.version <= 17:
                with admin.transaction():
                    assert schema.apply_migration(admin, migration.filename)
        with (
            login_role(empty_dsn, "app") as (app, app_dsn),
            login_role(empty_dsn, "worker") as (worker, worker_dsn),
        ):
            admin.execute("SELECT pgcounters.grant_app(%s)", (app,))
            admin.execute("SELECT pgcounters.grant_worker(%s)", (worker,))
            for migration in sqlfiles.migrations():  # the upgrade, to the latest version
                if migration.version >= 18:
                    with admin.transaction():
                        assert schema.apply_migration(admin, migration.filename)
            Quotas(admin).define_quota("api", 1, window="sliding:minute")
            with psycopg.connect(app_dsn, autocommit=True) as conn:
                q = Quotas(conn)
                assert q.register_call("api", "k", at=sec(0)).allowed
                assert not q.register_call("api", "k", at=sec(1)).allowed
                assert q.status("api", "k", at=sec(1)).used == 1
                assert [r.subject for r in q.report("api")] == ["k"]
            with psycopg.connect(worker_dsn, autocommit=True) as conn:
                assert Quotas(conn).purge(sec(62)).windows == 1  # bucket 1 left at 62
