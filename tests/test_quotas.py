"""Quotas: definitions, limits over time ranges, windows (DST included), calls, log, purge."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest

from pgcounters import (
    InvalidCost,
    InvalidQuotaArgument,
    InvalidQuotaDefinition,
    InvalidQuotaLimit,
    InvalidSubject,
    OverlappingQuotaLimits,
    PgCountersError,
    QuotaDefinitionConflict,
    Quotas,
    UnknownQuota,
)
from pgcounters.connection import Conn
from pgcounters.dberrors import translated
from pgcounters.quotas import parse_window
from support import set_clock

UTC = dt.UTC
BERLIN = ZoneInfo("Europe/Berlin")


def at(text: str) -> dt.datetime:
    """An aware datetime from ISO 8601 text with an offset."""
    value = dt.datetime.fromisoformat(text)
    assert value.tzinfo is not None
    return value


@pytest.fixture
def quotas(conn: Conn) -> Quotas:
    return Quotas(conn)


def counts(conn: Conn) -> tuple[int, int, int, int]:
    row = conn.execute(
        "SELECT (SELECT count(*) FROM pgcounters.quotas), "
        "(SELECT count(*) FROM pgcounters.quota_limits), "
        "(SELECT count(*) FROM pgcounters.quota_usage), "
        "(SELECT count(*) FROM pgcounters.quota_log)"
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2]), int(row[3])


# -- definitions ---------------------------------------------------------------


def test_define_is_idempotent_and_updates_limit_and_log(quotas: Quotas) -> None:
    q = quotas.define_quota("api.calls", 100)
    assert (q.period, q.window_seconds, q.time_zone, q.default_limit, q.log_calls) == (
        "day",
        None,
        "UTC",
        100,
        False,
    )
    again = quotas.define_quota("api.calls", 200, log=True)
    assert again.id == q.id
    assert (again.default_limit, again.log_calls) == (200, True)
    hourly = quotas.define_quota("per-hour", 10, window="hour")
    assert (hourly.period, hourly.window_seconds, hourly.window) == ("fixed", 3600, "3600s")
    berlin = quotas.define_quota("berlin", 5, time_zone="Europe/Berlin")
    assert berlin.describe() == "berlin: window day in Europe/Berlin, default limit 5"
    assert [x.name for x in quotas.quotas()] == ["api.calls", "berlin", "per-hour"]
    assert quotas.drop_quota("per-hour") is True
    assert quotas.drop_quota("per-hour") is False
    with pytest.raises(UnknownQuota, match="per-hour"):
        quotas.quota("per-hour")


def test_redefining_the_window_is_refused(quotas: Quotas, conn: Conn) -> None:
    quotas.define_quota("q", 10, window="day", time_zone="Europe/Berlin")
    for kwargs in (
        {"window": "hour"},
        {"window": "day", "time_zone": "UTC"},
        {"window": "week", "time_zone": "Europe/Berlin"},
    ):
        with pytest.raises(QuotaDefinitionConflict, match="another window"):
            quotas.define_quota("q", 10, **kwargs)  # type: ignore[arg-type]
    assert quotas.quota("q").window == "day"
    assert quotas.quota("q").time_zone == "Europe/Berlin"


@pytest.mark.parametrize(
    ("window", "expected"),
    [
        ("day", ("day", None)),
        ("Week", ("week", None)),
        ("month", ("month", None)),
        ("hour", ("fixed", 3600)),
        ("minute", ("fixed", 60)),
        ("90s", ("fixed", 90)),
        ("15m", ("fixed", 900)),
        ("2h", ("fixed", 7200)),
        ("1d", ("fixed", 86400)),
        (45, ("fixed", 45)),
        (dt.timedelta(minutes=5), ("fixed", 300)),
    ],
)
def test_windows_are_parsed(window: Any, expected: tuple[str, int | None]) -> None:
    assert parse_window(window) == expected


@pytest.mark.parametrize(
    "window",
    ["fortnight", "", "0s", "-5m", 0, -1, True, 1.5, dt.timedelta(0), dt.timedelta(seconds=1.5)],
)
def test_invalid_windows(quotas: Quotas, conn: Conn, window: Any) -> None:
    with pytest.raises(InvalidQuotaDefinition):
        quotas.define_quota("q", 10, window=window)
    assert counts(conn) == (0, 0, 0, 0)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"name": "1bad"}, InvalidQuotaDefinition),
        ({"name": "has space"}, InvalidQuotaDefinition),
        ({"name": ""}, InvalidQuotaDefinition),
        ({"default_limit": 0}, InvalidQuotaLimit),
        ({"default_limit": -3}, InvalidQuotaLimit),
        ({"default_limit": True}, InvalidQuotaLimit),
        ({"time_zone": "Mars/Olympus"}, InvalidQuotaDefinition),
        ({"time_zone": "UTC+5"}, InvalidQuotaDefinition),
        ({"window": "hour", "time_zone": "Europe/Berlin"}, InvalidQuotaDefinition),
    ],
)
def test_invalid_definitions_leave_nothing(
    quotas: Quotas, conn: Conn, kwargs: dict[str, Any], error: type[Exception]
) -> None:
    args: dict[str, Any] = {"name": "q", "default_limit": 10, **kwargs}
    with pytest.raises(error):
        quotas.define_quota(args.pop("name"), args.pop("default_limit"), **args)
    assert counts(conn) == (0, 0, 0, 0)


def test_the_sql_functions_raise_their_own_sqlstates(conn: Conn) -> None:
    """Plain-SQL users get the same errors; translated() maps them to the same classes."""
    cases: list[tuple[str, type[PgCountersError]]] = [
        ("SELECT pgcounters.define_quota('q', 0)", InvalidQuotaLimit),
        ("SELECT pgcounters.define_quota('q', 5, 'year')", InvalidQuotaDefinition),
        ("SELECT pgcounters.define_quota('q', 5, 'fixed')", InvalidQuotaDefinition),
        ("SELECT pgcounters.define_quota('q', 5, 'day', 60)", InvalidQuotaDefinition),
        ("SELECT pgcounters.define_quota('q', 5, 'day', NULL, 'Nowhere')", InvalidQuotaDefinition),
        ("SELECT pgcounters.register_call('missing', 's')", UnknownQuota),
        ("SELECT pgcounters.set_limit('missing', 's', 5)", UnknownQuota),
    ]
    for statement, error in cases:
        with pytest.raises(error), translated():
            conn.execute(statement)
    conn.execute("SELECT pgcounters.define_quota('q', 5)")
    cases = [
        ("SELECT pgcounters.register_call('q', '')", InvalidSubject),
        ("SELECT pgcounters.register_call('q', '   ')", InvalidSubject),
        ("SELECT pgcounters.register_call('q', NULL)", InvalidSubject),
        ("SELECT pgcounters.register_call('q', repeat('x', 1001))", InvalidSubject),
        ("SELECT pgcounters.register_call('q', 's', 0)", InvalidCost),
        ("SELECT pgcounters.register_call('q', 's', -2)", InvalidCost),
        ("SELECT pgcounters.set_limit('q', 's', 0)", InvalidQuotaLimit),
        ("SELECT pgcounters.set_limit('q', '', 5)", InvalidSubject),
        ("SELECT pgcounters.set_limit('q', 's', 5, '2026-02-01', '2026-01-01')", InvalidQuotaLimit),
        ("SELECT pgcounters.purge_quotas(now() + interval '1 day')", InvalidQuotaArgument),
        ("SELECT pgcounters.define_quota('q', 5, 'fixed', 60)", QuotaDefinitionConflict),
        # direct writes meet the table constraints
        (
            "INSERT INTO pgcounters.quota_limits (quota_id, subject, calls) "
            "SELECT id, 's', 0 FROM pgcounters.quotas",
            InvalidQuotaLimit,
        ),
    ]
    for statement, error in cases:
        with pytest.raises(error), translated():
            conn.execute(statement)
    assert counts(conn) == (1, 0, 0, 0)


# -- calls ---------------------------------------------------------------------


def test_calls_up_to_the_limit_then_refused(quotas: Quotas, conn: Conn) -> None:
    quotas.define_quota("q", 3)
    when = at("2026-03-10T12:00:00+00:00")
    results = [quotas.register_call("q", "alice", at=when) for _ in range(5)]
    assert [r.allowed for r in results] == [True, True, True, False, False]
    assert [r.used for r in results] == [1, 2, 3, 3, 3]
    assert [r.attempts for r in results] == [1, 2, 3, 4, 5]
    assert [r.remaining for r in results] == [2, 1, 0, 0, 0]
    last = results[-1]
    assert last.limit == 3
    assert last.window_start == at("2026-03-10T00:00:00+00:00")
    assert last.window_end == at("2026-03-11T00:00:00+00:00")
    assert last.retry_after == 12 * 3600
    status = quotas.status("q", "alice", at=when)
    assert (status.used, status.attempts, status.rejected, status.limit) == (3, 5, 2, 3)
    # another subject has its own window row
    assert quotas.register_call("q", "bob", at=when).allowed
    assert quotas.status("q", "carol", at=when).attempts == 0
    assert counts(conn)[2] == 2


def test_cost_takes_several_units(quotas: Quotas) -> None:
    quotas.define_quota("q", 10)
    when = at("2026-03-10T12:00:00+00:00")
    decisions = [
        (quotas.register_call("q", "s", cost, at=when).allowed, cost) for cost in (4, 4, 4, 2, 1)
    ]
    assert decisions == [(True, 4), (True, 4), (False, 4), (True, 2), (False, 1)]
    status = quotas.status("q", "s", at=when)
    assert (status.used, status.attempts, status.rejected) == (10, 5, 2)
    # a cost above the limit is refused outright, never partly granted
    assert not quotas.register_call("q", "other", 11, at=when).allowed
    assert quotas.status("q", "other", at=when).used == 0


def test_subject_limits_over_time_ranges(quotas: Quotas) -> None:
    quotas.define_quota("q", 2)
    limit = quotas.set_limit(
        "q",
        "gold",
        5,
        valid_from=at("2026-01-01T00:00:00+00:00"),
        valid_until=at("2026-07-01T00:00:00+00:00"),
    )
    assert (limit.subject, limit.limit) == ("gold", 5)
    assert quotas.limits("q") == [limit]
    inside, after = at("2026-03-01T10:00:00+00:00"), at("2026-08-01T10:00:00+00:00")
    assert sum(quotas.register_call("q", "gold", at=inside).allowed for _ in range(7)) == 5
    assert sum(quotas.register_call("q", "gold", at=after).allowed for _ in range(7)) == 2
    assert sum(quotas.register_call("q", "plain", at=inside).allowed for _ in range(7)) == 2
    # the range is half-open: its upper bound belongs to the next limit (or the default)
    quotas.set_limit("q", "gold", 1, valid_from=at("2026-07-01T00:00:00+00:00"))
    edge = at("2026-07-01T00:00:00+00:00")
    assert quotas.register_call("q", "gold", at=edge).limit == 1
    assert len(quotas.limits("q", "gold")) == 2
    assert quotas.remove_limits("q", "gold", limit.id) == 1
    assert quotas.remove_limits("q", "gold") == 1
    assert quotas.limits("q") == []


def test_a_quota_without_default_limit_refuses_unknown_subjects(quotas: Quotas) -> None:
    quotas.define_quota("allow-list")
    when = at("2026-03-10T12:00:00+00:00")
    refused = quotas.register_call("allow-list", "stranger", at=when)
    assert (refused.allowed, refused.limit, refused.attempts) == (False, 0, 1)
    quotas.set_limit("allow-list", "friend", 2)
    assert quotas.register_call("allow-list", "friend", at=when).allowed


def test_a_lowered_limit_applies_to_the_next_call(quotas: Quotas) -> None:
    quotas.define_quota("q", 10)
    when = at("2026-03-10T12:00:00+00:00")
    for _ in range(5):
        assert quotas.register_call("q", "s", at=when).allowed
    quotas.define_quota("q", 3)
    result = quotas.register_call("q", "s", at=when)
    assert (result.allowed, result.used, result.limit, result.remaining) == (False, 5, 3, 0)


def test_overlapping_limits_are_refused(quotas: Quotas, conn: Conn) -> None:
    quotas.define_quota("q", 1)
    quotas.define_quota("other", 1)
    jan, feb, mar, apr = (at(f"2026-{m:02d}-01T00:00:00+00:00") for m in (1, 2, 3, 4))
    quotas.set_limit("q", "s", 10, valid_from=jan, valid_until=mar)
    with pytest.raises(OverlappingQuotaLimits, match="overlaps the existing limit") as info:
        quotas.set_limit("q", "s", 20, valid_from=feb, valid_until=apr)
    assert "2026-01-01" in str(info.value)
    with pytest.raises(OverlappingQuotaLimits) as unbounded:
        quotas.set_limit("q", "s", 20)  # unbounded overlaps everything
    # both ranges as the command line prints them (PostgreSQL's own text is "(,)")
    assert (
        "the limit [-inf, inf) of quota q for subject 's' overlaps the existing limit [2026-01-01"
        in str(unbounded.value)
    )
    with pytest.raises(InvalidQuotaLimit):  # OverlappingQuotaLimits is an InvalidQuotaLimit
        quotas.set_limit("q", "s", 20, valid_until=feb)
    assert len(quotas.limits("q")) == 1
    # adjacent ranges, other subjects and other quotas do not overlap
    quotas.set_limit("q", "s", 30, valid_from=mar, valid_until=apr)
    quotas.set_limit("q", "t", 30, valid_from=jan, valid_until=apr)
    quotas.set_limit("other", "s", 30, valid_from=jan, valid_until=apr)
    assert counts(conn)[1] == 4
    # the exclusion constraint holds for direct writes too
    with pytest.raises(OverlappingQuotaLimits), translated():
        conn.execute(
            "INSERT INTO pgcounters.quota_limits (quota_id, subject, calls, valid) "
            "SELECT id, 's', 5, tstzrange('2026-01-15', '2026-01-20') FROM pgcounters.quotas "
            "WHERE name = 'q'"
        )
    assert counts(conn)[1] == 4


@pytest.mark.parametrize("limit", [0, -1, True, 2.5, "3", None])
def test_invalid_limits(quotas: Quotas, conn: Conn, limit: Any) -> None:
    quotas.define_quota("q", 1)
    with pytest.raises(InvalidQuotaLimit):
        quotas.set_limit("q", "s", limit)
    assert counts(conn) == (1, 0, 0, 0)


def test_limit_ranges_must_be_ordered_and_aware(quotas: Quotas) -> None:
    quotas.define_quota("q", 1)
    jan, feb = at("2026-01-01T00:00:00+00:00"), at("2026-02-01T00:00:00+00:00")
    with pytest.raises(InvalidQuotaLimit, match="end after it starts"):
        quotas.set_limit("q", "s", 5, valid_from=feb, valid_until=jan)
    with pytest.raises(InvalidQuotaLimit):
        quotas.set_limit("q", "s", 5, valid_from=jan, valid_until=jan)
    with pytest.raises(InvalidQuotaArgument, match="aware"):
        quotas.set_limit("q", "s", 5, valid_from=dt.datetime(2026, 1, 1))
    assert quotas.limits("q") == []


@pytest.mark.parametrize("subject", ["", "   ", None, 42, "x" * 1001, "nul\x00"])
def test_invalid_subjects(quotas: Quotas, conn: Conn, subject: Any) -> None:
    quotas.define_quota("q", 5)
    with pytest.raises(InvalidSubject):
        quotas.register_call("q", subject)
    with pytest.raises(InvalidSubject):
        quotas.set_limit("q", subject, 5)
    with pytest.raises(InvalidSubject):
        quotas.status("q", subject)
    assert counts(conn) == (1, 0, 0, 0)


@pytest.mark.parametrize("cost", [0, -1, True, 1.0, "1", 2**63])
def test_invalid_costs(quotas: Quotas, conn: Conn, cost: Any) -> None:
    quotas.define_quota("q", 5)
    with pytest.raises(InvalidCost):
        quotas.register_call("q", "s", cost)
    assert counts(conn) == (1, 0, 0, 0)


def test_unknown_quota_everywhere(quotas: Quotas, conn: Conn) -> None:
    calls: list[Callable[[], object]] = [
        lambda: quotas.register_call("nope", "s"),
        lambda: quotas.set_limit("nope", "s", 5),
        lambda: quotas.remove_limits("nope", "s"),
        lambda: quotas.status("nope", "s"),
        lambda: quotas.report("nope"),
        lambda: quotas.limits("nope"),
        lambda: quotas.purge(at("2020-01-01T00:00:00+00:00"), "nope"),
    ]
    for call in calls:
        with pytest.raises(UnknownQuota, match="nope"):
            call()
    assert counts(conn) == (0, 0, 0, 0)


def test_naive_datetimes_are_refused(quotas: Quotas) -> None:
    quotas.define_quota("q", 5)
    with pytest.raises(InvalidQuotaArgument, match="aware"):
        quotas.register_call("q", "s", at=dt.datetime(2026, 1, 1, 12))
    with pytest.raises(InvalidQuotaArgument):
        quotas.register_call("q", "s", at="2026-01-01")  # type: ignore[arg-type]


def test_calls_without_at_use_the_transaction_time(quotas: Quotas, conn: Conn) -> None:
    quotas.define_quota("q", 5, window="minute")
    with conn.transaction():
        result = quotas.register_call("q", "s")
        row = conn.execute(
            "SELECT date_trunc('minute', now()), extract(epoch FROM"
            " date_trunc('minute', now()) + interval '1 minute' - now())::float8"
        ).fetchone()
    assert row is not None
    assert (result.window_start, result.window_end) == (row[0], row[0] + dt.timedelta(minutes=1))
    assert result.retry_after == pytest.approx(row[1])


def test_calls_without_at_use_the_clock_set_in_sql(quotas: Quotas, conn: Conn) -> None:
    """SET pgcounters.now: calls and statuses without an instant happen then, from SQL too."""
    quotas.define_quota("q", 2, window="minute")
    set_clock(conn, at("2026-03-10T12:34:56+00:00"))
    first = quotas.register_call("q", "s")
    assert (first.window_start, first.window_end) == (
        at("2026-03-10T12:34:00+00:00"),
        at("2026-03-10T12:35:00+00:00"),
    )
    assert first.retry_after == 4
    assert quotas.register_call("q", "s").allowed
    row = conn.execute("SELECT allowed, used FROM pgcounters.register_call('q', 's')").fetchone()
    assert row == (False, 2)  # the third call of the minute, from SQL: refused
    assert quotas.status("q", "s").attempts == 3
    set_clock(conn, at("2026-03-10T12:35:00+00:00"))  # the next minute, to the microsecond
    assert (quotas.status("q", "s").attempts, quotas.register_call("q", "s").used) == (0, 1)
    set_clock(conn, None)  # back to now(), the transaction's start
    with conn.transaction():
        status = quotas.status("q", "s")
        row = conn.execute("SELECT date_trunc('minute', now())").fetchone()
    assert row is not None
    assert status.window_start == row[0]


def test_calls_without_at_use_the_clock_set_in_python(conn: Conn) -> None:
    instants = iter([at("2026-03-10T23:59:59+00:00"), at("2026-03-11T00:00:00+00:00")])
    quotas = Quotas(conn, clock=lambda: next(instants))
    quotas.define_quota("q", 1, window="day")
    late, early = quotas.register_call("q", "s"), quotas.register_call("q", "s")
    assert (late.allowed, late.retry_after, late.window_end) == (True, 1, early.window_start)
    assert (early.allowed, early.used) == (True, 1)  # a new day, a new window
    with pytest.raises(InvalidQuotaArgument, match="aware"):
        Quotas(conn, clock=lambda: dt.datetime(2026, 1, 1)).register_call("q", "s")


# -- windows -------------------------------------------------------------------


def test_fixed_window_rollover(quotas: Quotas) -> None:
    quotas.define_quota("q", 2, window="hour")
    before, boundary = at("2026-03-10T10:59:59+00:00"), at("2026-03-10T11:00:00+00:00")
    assert [quotas.register_call("q", "s", at=before).allowed for _ in range(3)] == [
        True,
        True,
        False,
    ]
    result = quotas.register_call("q", "s", at=boundary)
    assert (result.allowed, result.used, result.attempts) == (True, 1, 1)
    assert result.window_start == boundary
    assert result.window_end == at("2026-03-10T12:00:00+00:00")
    # fixed windows are aligned to the epoch: 90 s windows start at multiples of 90 s
    quotas.define_quota("q90", 1, window="90s")
    start = quotas.register_call("q90", "s", at=at("2026-03-10T11:00:00+00:00")).window_start
    assert int(start.timestamp()) % 90 == 0
    assert quotas.register_call("q90", "s", at=at("2026-03-10T11:00:00+00:00")).allowed is False


def test_day_window_across_the_autumn_dst_change_in_berlin(quotas: Quotas, conn: Conn) -> None:
    """Sunday 26 October 2025: clocks go back from 03:00 CEST to 02:00 CET; the day has 25 h."""
    conn.execute("SET TimeZone = 'America/New_York'")  # the session's zone plays no part
    quotas.define_quota("q", 3, time_zone="Europe/Berlin")
    first = quotas.register_call("q", "s", at=at("2025-10-26T00:00:00+02:00"))
    assert first.window_start == dt.datetime(2025, 10, 26, tzinfo=BERLIN)
    assert first.window_end == dt.datetime(2025, 10, 27, tzinfo=BERLIN)
    assert first.window_end - first.window_start == dt.timedelta(hours=25)
    assert first.window_start == at("2025-10-25T22:00:00+00:00")
    assert first.window_end == at("2025-10-26T23:00:00+00:00")
    # 02:30 happens twice that night, both in the same day; 23:59:59 CET too
    second = quotas.register_call("q", "s", at=at("2025-10-26T02:30:00+02:00"))
    third = quotas.register_call("q", "s", at=at("2025-10-26T02:30:00+01:00"))
    fourth = quotas.register_call("q", "s", at=at("2025-10-26T23:59:59+01:00"))
    assert [r.window_start for r in (second, third, fourth)] == [first.window_start] * 3
    assert [r.allowed for r in (second, third, fourth)] == [True, True, False]
    assert fourth.retry_after == 1
    # midnight CET starts the next day; the day before ended at midnight CEST
    monday = quotas.register_call("q", "s", at=at("2025-10-27T00:00:00+01:00"))
    assert (monday.allowed, monday.used, monday.attempts) == (True, 1, 1)
    assert monday.window_end - monday.window_start == dt.timedelta(hours=24)
    saturday = quotas.register_call("q", "s", at=at("2025-10-25T23:59:59+02:00"))
    assert saturday.window_end == first.window_start
    assert (saturday.used, saturday.attempts) == (1, 1)


def test_day_window_across_the_spring_dst_change_in_berlin(quotas: Quotas) -> None:
    """Sunday 30 March 2025: clocks jump from 02:00 CET to 03:00 CEST; the day has 23 h."""
    quotas.define_quota("q", 2, time_zone="Europe/Berlin")
    result = quotas.register_call("q", "s", at=at("2025-03-30T12:00:00+02:00"))
    assert result.window_start == at("2025-03-30T00:00:00+01:00")
    assert result.window_end == at("2025-03-31T00:00:00+02:00")
    assert result.window_end - result.window_start == dt.timedelta(hours=23)
    late = quotas.register_call("q", "s", at=at("2025-03-30T23:59:00+02:00"))
    assert (late.window_start, late.attempts) == (result.window_start, 2)


def test_week_and_month_windows_follow_the_local_calendar(quotas: Quotas) -> None:
    quotas.define_quota("weekly", 1, window="week", time_zone="Europe/Berlin")
    quotas.define_quota("monthly", 1, window="month", time_zone="Europe/Berlin")
    week = quotas.register_call("weekly", "s", at=at("2025-10-29T12:00:00+01:00"))
    assert week.window_start == dt.datetime(2025, 10, 27, tzinfo=BERLIN)  # a Monday
    assert week.window_end == dt.datetime(2025, 11, 3, tzinfo=BERLIN)
    month = quotas.register_call("monthly", "s", at=at("2025-03-15T12:00:00+01:00"))
    assert month.window_start == at("2025-03-01T00:00:00+01:00")
    assert month.window_end == at("2025-04-01T00:00:00+02:00")  # CEST by then
    assert month.window_end - month.window_start == dt.timedelta(days=31, hours=-1)


# -- log, reports, purge -------------------------------------------------------


def test_the_request_log_is_off_by_default(quotas: Quotas, conn: Conn) -> None:
    quotas.define_quota("q", 1)
    when = at("2026-03-10T12:00:00+00:00")
    quotas.register_call("q", "s", at=when, details={"path": "/a"})
    assert quotas.logged_calls("q") == []
    assert counts(conn)[3] == 0

    quotas.define_quota("q", 1, log=True)
    quotas.register_call("q", "s", at=when, details={"path": "/b", "ip": "10.0.0.1"})
    quotas.register_call("q", "t", 1, at=when + dt.timedelta(seconds=1))
    logged = quotas.logged_calls("q")
    assert [(r.subject, r.allowed, r.cost, r.details) for r in logged] == [
        ("t", True, 1, None),
        ("s", False, 1, {"path": "/b", "ip": "10.0.0.1"}),
    ]
    assert logged[1].at == when
    assert [r.subject for r in quotas.logged_calls("q", subject="s")] == ["s"]

    quotas.define_quota("q", 1, log=False)
    quotas.register_call("q", "s", at=when)
    assert len(quotas.logged_calls("q")) == 2


def test_reports_of_rejected_calls(quotas: Quotas) -> None:
    quotas.define_quota("q", 2)
    day1, day2 = at("2026-03-10T12:00:00+00:00"), at("2026-03-11T12:00:00+00:00")
    for subject, day, calls in [("a", day1, 5), ("b", day1, 2), ("a", day2, 3), ("c", day2, 4)]:
        for _ in range(calls):
            quotas.register_call("q", subject, at=day)
    rows = quotas.report("q")
    assert [(r.subject, r.window_start.day, r.used, r.attempts, r.rejected) for r in rows] == [
        ("c", 11, 2, 4, 2),
        ("a", 11, 2, 3, 1),
        ("a", 10, 2, 5, 3),
        ("b", 10, 2, 2, 0),
    ]
    assert [r.subject for r in quotas.report("q", rejected_only=True)] == ["c", "a", "a"]
    assert [r.window_start.day for r in quotas.report("q", subject="a")] == [11, 10]
    only_day1 = quotas.report("q", since=day1, until=at("2026-03-11T00:00:00+00:00"))
    assert {r.subject for r in only_day1} == {"a", "b"}
    top = quotas.top_rejected("q")
    assert [(t.subject, t.rejected, t.attempts, t.windows) for t in top] == [
        ("a", 4, 8, 2),
        ("c", 2, 4, 1),
    ]
    assert len(quotas.report("q", limit=1)) == 1


def test_purge_removes_old_windows_and_log_rows(quotas: Quotas, conn: Conn) -> None:
    # the clock at a chosen instant: the cut-offs below are in its past, whatever the date
    # of the machine
    now = at("2026-03-10T12:00:00+00:00")
    set_clock(conn, now)
    quotas.define_quota("q", 5, log=True)
    quotas.define_quota("kept", 5, log=True)
    old, recent = at("2026-01-10T12:00:00+00:00"), at("2026-02-10T12:00:00+00:00")
    for when in (old, recent):
        quotas.register_call("q", "s", at=when)
        quotas.register_call("kept", "s", at=when)
    quotas.register_call("q", "s")  # the current window
    assert counts(conn)[2:] == (5, 5)

    only_q = quotas.purge(at("2026-02-01T00:00:00+00:00"), "q")
    assert (only_q.windows, only_q.log_rows) == (1, 1)
    everything_old = quotas.purge(at("2026-02-11T00:00:00+00:00"))
    assert (everything_old.windows, everything_old.log_rows) == (3, 3)
    # the current window survives: a purge can never reopen a window in use
    assert counts(conn)[2:] == (1, 1)
    assert quotas.status("q", "s").attempts == 1
    assert quotas.status("q", "s").window_start == at("2026-03-10T00:00:00+00:00")
    assert quotas.purge(now).windows == 0  # the current window ends tomorrow
    with pytest.raises(InvalidQuotaArgument, match="future"):
        quotas.purge(now + dt.timedelta(microseconds=1))
    with pytest.raises(InvalidQuotaArgument):
        quotas.purge(dt.datetime(2026, 1, 1))
    assert counts(conn)[2:] == (1, 1)


def test_drop_quota_removes_limits_usage_and_log(quotas: Quotas, conn: Conn) -> None:
    quotas.define_quota("q", 5, log=True)
    quotas.set_limit("q", "s", 3)
    quotas.register_call("q", "s")
    assert counts(conn) == (1, 1, 1, 1)
    assert quotas.drop_quota("q")
    assert counts(conn) == (0, 0, 0, 0)


# -- storage, transactions -----------------------------------------------------


def test_updates_of_the_usage_row_are_hot(quotas: Quotas, conn: Conn) -> None:
    """Only columns outside every index change, and fillfactor leaves room: no index writes."""
    quotas.define_quota("q", 1000)
    when = at("2026-03-10T12:00:00+00:00")
    with conn.transaction():
        for _ in range(20):
            quotas.register_call("q", "s", at=when)
        row = conn.execute(
            "SELECT pg_stat_get_xact_tuples_updated(c.oid), "
            "pg_stat_get_xact_tuples_hot_updated(c.oid) "
            "FROM pg_class c WHERE c.oid = 'pgcounters.quota_usage'::regclass"
        ).fetchone()
    assert row == (19, 19)
    options = conn.execute(
        "SELECT reloptions FROM pg_class WHERE oid = 'pgcounters.quota_usage'::regclass"
    ).fetchone()
    assert options == (["fillfactor=60"],)


def test_a_call_joins_the_callers_transaction(quotas: Quotas, dsn: str) -> None:
    quotas.define_quota("q", 1)
    with psycopg.connect(dsn) as conn:  # not autocommit
        conn.execute("SET synchronous_commit = on")  # the test server runs with it off
        conn.commit()
        in_txn = Quotas(conn, synchronous_commit=False)
        assert in_txn.commits_asynchronously() is False  # the call opens a transaction
        assert in_txn.register_call("q", "s").allowed
        assert in_txn.commits_asynchronously() is False
        # inside a transaction, synchronous_commit is left as it is
        assert conn.execute("SHOW synchronous_commit").fetchone() == ("on",)
        conn.rollback()
    assert quotas.status("q", "s").attempts == 0


def test_async_commit_applies_only_to_a_call_of_its_own(quotas: Quotas, conn: Conn) -> None:
    quotas.define_quota("q", 5)
    conn.execute("SET synchronous_commit = on")  # the test server runs with it off
    row = conn.execute(
        "SELECT r.allowed, current_setting('synchronous_commit') "
        "FROM pgcounters.register_call('q', 's', p_async_commit => true) AS r"
    ).fetchone()
    assert row == (True, "off")
    # the setting ends with the call's transaction
    assert conn.execute("SHOW synchronous_commit").fetchone() == ("on",)
    fast = Quotas(conn, synchronous_commit=False)
    assert fast.commits_asynchronously() is True
    assert quotas.commits_asynchronously() is False
    with conn.transaction():
        assert fast.commits_asynchronously() is False
    results = [fast.register_call("q", "s") for _ in range(5)]
    assert [r.allowed for r in results] == [True] * 4 + [False]
    assert conn.execute("SHOW synchronous_commit").fetchone() == ("on",)


def test_repeatable_read_fails_rather_than_overgrants(quotas: Quotas, dsn: str) -> None:
    """Under REPEATABLE READ a call that meets a row changed since the snapshot raises
    SerializationFailure (retry the transaction); it never decides from a stale count."""
    quotas.define_quota("q", 1)
    when = at("2026-03-10T12:00:00+00:00")
    quotas.register_call("q", "s", at=when)
    with psycopg.connect(dsn) as rr:
        rr.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        rr.execute("SELECT 1")  # the snapshot is taken
        quotas.register_call("q", "s", at=when)  # committed after it
        with pytest.raises(psycopg.errors.SerializationFailure):
            Quotas(rr).register_call("q", "s", at=when)
        rr.rollback()
    status = quotas.status("q", "s", at=when)
    assert (status.used, status.attempts) == (1, 2)
