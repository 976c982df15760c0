"""Quotas and rate limits that never let an extra call through.

A :class:`Quotas` wraps one psycopg 3 connection (or a pool), like
:class:`pgcounters.Counters`; :class:`AsyncQuotas` is its async twin.
A quota is a named budget of calls per subject (a customer, a user, an API key,
an IP address: any non-blank string) per window: a calendar day (the default),
week or month in a time zone, a fixed number of seconds, or a sliding window
(any span of a number of seconds, counted in buckets).

:meth:`Quotas.register_call` is one call of the SQL function
``pgcounters.register_call``, which decides inside one upsert of the subject's
usage row, from that row as it is once locked: concurrent callers cannot both
take the last unit.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias, TypeVar

import psycopg
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from pgcounters import plans, schema
from pgcounters.client import share_docs
from pgcounters.connection import Conn
from pgcounters.errors import (
    ConfigurationError,
    InvalidBucketWidth,
    InvalidCost,
    InvalidQuotaArgument,
    InvalidQuotaDefinition,
    InvalidQuotaLimit,
    InvalidSubject,
    UnknownQuota,
)
from pgcounters.keys import BIGINT_MAX, NAME_RE
from pgcounters.plans import AsyncConn, Connection, ConnState, Execute, Plan
from pgcounters.sqlfiles import query

T = TypeVar("T")

Period: TypeAlias = Literal["day", "week", "month", "fixed", "sliding"]
CALENDAR_WINDOWS: tuple[str, ...] = ("day", "week", "month")
FIXED_WINDOWS: dict[str, int] = {"second": 1, "minute": 60, "hour": 3600}
Window: TypeAlias = str | int | dt.timedelta
"""A window: ``"day"``, ``"week"``, ``"month"`` (calendar, in the quota's time
zone), ``"hour"``, ``"minute"``, ``"second"``, a number of seconds, a
:class:`datetime.timedelta` or a text such as ``"90s"``, ``"15m"``, ``"2h"``,
``"1d"`` (fixed windows aligned to the Unix epoch); any of the fixed durations
after ``"sliding:"`` (``"sliding:hour"``, ``"sliding:15m"``, ``"sliding:1d"``) for a
sliding window of that length, optionally followed by ``by`` and the width of its buckets
(``"sliding:hour by 1m"``, ``"sliding:day by 15m"``)."""

SLIDING_PREFIX = "sliding:"
DEFAULT_BUCKETS = 60
MAX_BUCKETS = 1000

MAX_SUBJECT = 1000
_DURATION_RE = re.compile(r"^\s*(\d+)\s*([smhd])\s*$")
# "<sliding window> by <bucket width>"
_BY_RE = re.compile(r"\s+by(?:\s+|\s*$)", re.IGNORECASE)
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclass(frozen=True)
class Quota:
    """A defined quota, as stored in ``pgcounters.quotas``."""

    id: int
    name: str
    period: Period
    window_seconds: int | None
    time_zone: str
    default_limit: int | None
    log_calls: bool
    bucket_seconds: int | None = None
    """The width of the buckets of a sliding window (None for the other windows)."""

    @property
    def window(self) -> str:
        """The window in the form :func:`parse_window` reads (``"day"``, ``"3600s"``,
        ``"sliding:3600s"``)."""
        if self.period == "fixed":
            return f"{self.window_seconds}s"
        if self.period == "sliding":
            return f"{SLIDING_PREFIX}{self.window_seconds}s"
        return self.period

    def describe(self) -> str:
        where = f" in {self.time_zone}" if self.period in CALENDAR_WINDOWS else ""
        if self.period == "sliding":
            where = f" in buckets of {self.bucket_seconds}s"
        limit = "none" if self.default_limit is None else str(self.default_limit)
        log = ", calls logged" if self.log_calls else ""
        return f"{self.name}: window {self.window}{where}, default limit {limit}{log}"


@dataclass(frozen=True)
class QuotaLimit:
    """A limit of one subject, valid over ``[valid_from, valid_until)`` (None: unbounded)."""

    id: int
    subject: str
    limit: int
    valid_from: dt.datetime | None
    valid_until: dt.datetime | None


@dataclass(frozen=True)
class CallResult:
    """The decision on one call, and the state of its window after it."""

    allowed: bool
    used: int
    """Units granted in the window, this call included if allowed. A grant never takes it
    above the limit in force; a limit lowered within the window may leave it above."""
    attempts: int
    """Calls made in the window, granted or not, this one included."""
    limit: int
    window_start: dt.datetime
    window_end: dt.datetime
    retry_after: float
    """Seconds from the call until its window ends (when a refused call may succeed)."""

    @property
    def remaining(self) -> int:
        """Units left in the window."""
        return max(self.limit - self.used, 0)


@dataclass(frozen=True)
class QuotaStatus:
    """The usage of a subject in one window, read without registering a call."""

    used: int
    attempts: int
    rejected: int
    limit: int
    window_start: dt.datetime
    window_end: dt.datetime

    @property
    def remaining(self) -> int:
        return max(self.limit - self.used, 0)


@dataclass(frozen=True)
class WindowUsage:
    """One row of a report: a subject's usage in one window."""

    subject: str
    window_start: dt.datetime
    window_end: dt.datetime
    limit: int
    used: int
    attempts: int
    rejected: int


@dataclass(frozen=True)
class SubjectRejections:
    """Refused calls of one subject over the windows of a report."""

    subject: str
    rejected: int
    attempts: int
    windows: int


@dataclass(frozen=True)
class LoggedCall:
    """One row of the request log of a quota that logs its calls."""

    subject: str
    at: dt.datetime
    cost: int
    allowed: bool
    details: Any


@dataclass(frozen=True)
class PurgeResult:
    """What :meth:`Quotas.purge` removed."""

    windows: int
    log_rows: int


def parse_window(window: Window) -> tuple[Period, int | None]:
    """``(period, window_seconds)`` of a window given as in :data:`Window` (a bucket width
    written after ``by`` is checked too: see :func:`window_bucket_width`)."""
    if isinstance(window, str) and _BY_RE.search(window):
        length, _width = _split_width(window)
        return "sliding", _sliding_seconds(length)
    if isinstance(window, str) and window.strip().lower().startswith(SLIDING_PREFIX):
        return "sliding", _sliding_seconds(window)
    if isinstance(window, bool):
        raise InvalidQuotaDefinition(f"invalid window {window!r}")
    seconds: int
    if isinstance(window, dt.timedelta):
        total = window.total_seconds()
        if total != int(total):
            raise InvalidQuotaDefinition(f"a window is a whole number of seconds, got {window}")
        seconds = int(total)
    elif isinstance(window, int):
        seconds = window
    elif isinstance(window, str):
        text = window.strip().lower()
        if text in CALENDAR_WINDOWS:
            return text, None  # type: ignore[return-value]
        if text in FIXED_WINDOWS:
            seconds = FIXED_WINDOWS[text]
        else:
            match = _DURATION_RE.match(text)
            if match is None:
                raise InvalidQuotaDefinition(
                    f"invalid window {window!r}: use day, week, month, hour, minute, second, "
                    "or a duration such as 90s, 15m, 2h, 1d"
                )
            seconds = int(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    else:
        raise InvalidQuotaDefinition(f"invalid window {window!r}")
    if not 0 < seconds <= BIGINT_MAX:
        raise InvalidQuotaDefinition(f"a fixed window must be at least one second, got {window!r}")
    return "fixed", seconds


def _sliding_seconds(window: str) -> int:
    """The length of a sliding window written ``sliding:<duration>``."""
    length = window.strip()[len(SLIDING_PREFIX) :].strip().lower()
    # a sliding day or week is 24 hours or 7 days; a month has no fixed length
    found = {"day": 86400, "week": 604800}.get(length)
    if found is None and length not in CALENDAR_WINDOWS:
        period, seconds = parse_window(length)
        found = seconds if period == "fixed" else None
    if found is None:
        raise InvalidQuotaDefinition(
            f"invalid window {window!r}: a sliding window has a fixed length, such as "
            "sliding:hour, sliding:day or sliding:15m (a month has none)"
        )
    return found


def _split_width(window: str) -> tuple[str, int]:
    """``(the sliding window, its bucket width in seconds)`` of ``"<window> by <width>"``,
    the width checked against the window (:func:`bucket_seconds`)."""
    parts = _BY_RE.split(window.strip())
    if len(parts) != 2 or not parts[0] or not parts[1]:
        raise InvalidBucketWidth(
            f"invalid window {window!r}: write a sliding window, by and the width of its "
            "buckets, such as sliding:hour by 1m"
        )
    length, width_text = parts
    if not length.strip().lower().startswith(SLIDING_PREFIX):
        raise InvalidBucketWidth(
            f"invalid window {window!r}: only a sliding window has buckets (sliding:"
            f"{length.strip()} by {width_text.strip()})"
        )
    seconds = _sliding_seconds(length)
    return length, bucket_seconds(seconds, width_text)


def window_bucket_width(window: Window) -> int | None:
    """The bucket width, in seconds, written in ``window`` (``"sliding:hour by 1m"`` -> 60);
    None when it names none (a sliding window's default width is then a sixtieth)."""
    if isinstance(window, str) and _BY_RE.search(window):
        return _split_width(window)[1]
    return None


def sliding_window(window: Window) -> str:
    """The sliding window as long as ``window``: ``"hour"`` -> ``"sliding:3600s"``,
    ``"day"`` -> ``"sliding:86400s"`` (24 hours), ``"sliding:15m"`` -> ``"sliding:900s"``,
    ``"hour by 1m"`` -> ``"sliding:3600s by 60s"``."""
    if isinstance(window, str) and _BY_RE.search(window):
        length, width_text = _BY_RE.split(window.strip(), maxsplit=1)
        length = sliding_window(length)
        width = _split_width(f"{length} by {width_text}")[1]
        return f"{length} by {width}s"
    if isinstance(window, str) and not window.strip().lower().startswith(SLIDING_PREFIX):
        window = SLIDING_PREFIX + window
    elif not isinstance(window, str):
        _period, seconds = parse_window(window)
        window = f"{SLIDING_PREFIX}{seconds}s"
    _period, seconds = parse_window(window)
    return f"{SLIDING_PREFIX}{seconds}s"


def bucket_seconds(window_seconds: int, granularity: Window | None) -> int:
    """The width of the buckets of a sliding window of ``window_seconds``.

    ``granularity`` (a fixed duration that divides the window into at most
    :data:`MAX_BUCKETS`), or by default a sixtieth of the window when that is a
    whole number of seconds, else the widest whole number of seconds below it
    that divides the window.
    """
    if granularity is None:
        width = max(window_seconds // DEFAULT_BUCKETS, 1)
        while window_seconds % width:
            width -= 1
    else:
        try:
            period, seconds = parse_window(granularity)
        except InvalidQuotaDefinition:
            period, seconds = "fixed", 0
        if period != "fixed" or seconds is None or seconds <= 0:
            raise InvalidBucketWidth(
                f"invalid bucket width {granularity!r}: use a positive duration such as 1s, "
                "1m or 15m"
            )
        width = seconds
        if window_seconds % width:
            raise InvalidBucketWidth(
                f"buckets of {width}s do not divide a sliding window of {window_seconds}s: "
                f"use a width that does, such as {bucket_seconds(window_seconds, None)}s"
            )
    if window_seconds // width > MAX_BUCKETS:
        narrowest = -(-window_seconds // MAX_BUCKETS)
        while window_seconds % narrowest:
            narrowest += 1
        raise InvalidBucketWidth(
            f"buckets of {width}s make {window_seconds // width} buckets of a sliding window of "
            f"{window_seconds}s: at most {MAX_BUCKETS} (the narrowest width is {narrowest}s)"
        )
    return width


def check_quota_name(name: object) -> str:
    if not isinstance(name, str) or NAME_RE.fullmatch(name) is None:
        raise InvalidQuotaDefinition(
            f"invalid quota name {name!r}: use 1-200 characters of letters, digits and "
            "_ . : / -, starting with a letter or _"
        )
    return name


def check_subject(subject: object) -> str:
    if not isinstance(subject, str) or not subject.strip() or len(subject) > MAX_SUBJECT:
        shown = subject[:40] if isinstance(subject, str) else subject
        raise InvalidSubject(
            "a quota subject must be a non-blank string of at most "
            f"{MAX_SUBJECT} characters, got {shown!r}"
        )
    if "\x00" in subject:
        raise InvalidSubject("a quota subject cannot contain NUL characters")
    if not _utf8(subject):
        raise InvalidSubject("a quota subject cannot contain unpaired surrogates (not UTF-8)")
    return subject


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_cost(cost: object) -> int:
    if isinstance(cost, bool) or not isinstance(cost, int) or not 0 < cost <= BIGINT_MAX:
        raise InvalidCost(
            f"the cost of a call must be a positive integer within the bigint range, got {cost!r}"
        )
    return cost


def _check_limit(limit: object, what: str = "a limit") -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 0 < limit <= BIGINT_MAX:
        raise InvalidQuotaLimit(f"{what} must be a positive number of calls, got {limit!r}")
    return limit


def _check_instant(value: object, what: str) -> dt.datetime | None:
    if value is None:
        return None
    if not isinstance(value, dt.datetime):
        raise InvalidQuotaArgument(f"{what} must be a datetime, got {value!r}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidQuotaArgument(
            f"{what} must be an aware datetime (with a time zone), got {value.isoformat()}"
        )
    return value


def _clock_instant(clock: Callable[[], dt.datetime]) -> dt.datetime:
    value = clock()
    checked = _check_instant(value, "the clock's instant")
    if checked is None:
        raise InvalidQuotaArgument("the clock returned None, not an instant")
    return checked


def _check_count(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= BIGINT_MAX:
        raise InvalidQuotaArgument(
            f"{what} must be a non-negative int within the bigint range, got {value!r}"
        )
    return value


def _row_to_quota(row: Sequence[Any]) -> Quota:
    return Quota(
        id=row[0],
        name=row[1],
        period=row[2],
        window_seconds=row[3],
        time_zone=row[4],
        default_limit=row[5],
        log_calls=row[6],
        bucket_seconds=row[7],
    )


class _QuotaPlans:
    """The behaviour of :class:`Quotas` and :class:`AsyncQuotas`, written once.

    Each operation is a plan (see :mod:`pgcounters.plans`) that the two clients run.
    """

    def __init__(
        self,
        *,
        check_schema: bool,
        synchronous_commit: bool,
        clock: Callable[[], dt.datetime] | None,
    ) -> None:
        self.synchronous_commit = synchronous_commit
        self.clock = clock
        self._schema_checked = not check_schema
        self._register = query("quota_register_call")

    def _ensure_schema(self) -> Plan[None]:
        if not self._schema_checked:
            yield from schema.check_plan()
            self._schema_checked = True

    # -- definitions ------------------------------------------------------------

    def _define_quota(
        self,
        name: str,
        default_limit: int | None,
        window: Window,
        time_zone: str | None,
        log: bool,
        granularity: Window | None = None,
    ) -> Plan[Quota]:
        """Define a quota, or change the default limit and logging of an existing one.

        ``default_limit`` applies to subjects without a limit of their own; None
        means they get no call. ``time_zone`` (an IANA name, default UTC) places
        the boundaries of day, week and month windows; fixed and sliding windows
        take none. ``granularity``: the width of a sliding window's buckets (see
        :func:`bucket_seconds`; a refused call would be granted by an exact log of
        calls at most that much later). Redefining the window of an existing quota
        raises :class:`QuotaDefinitionConflict`.
        """
        check_quota_name(name)
        if default_limit is not None:
            _check_limit(default_limit, "the default limit")
        period, seconds = parse_window(window)
        if time_zone is not None and (not isinstance(time_zone, str) or not time_zone):
            raise InvalidQuotaDefinition(f"invalid time zone {time_zone!r}")
        if period in ("fixed", "sliding") and time_zone not in (None, "UTC"):
            raise InvalidQuotaDefinition(
                f"{period} windows are aligned to the Unix epoch and take no time zone "
                f"(got {time_zone!r}); time zones apply to day, week and month windows"
            )
        width: int | None = None
        written = window_bucket_width(window)
        if written is not None:
            if granularity is not None and bucket_seconds(seconds or 0, granularity) != written:
                raise InvalidBucketWidth(
                    f"the window {window!r} and granularity={granularity!r} give two bucket "
                    "widths: give one"
                )
            granularity = f"{written}s"
        if period == "sliding":
            assert seconds is not None
            width = bucket_seconds(seconds, granularity)
        elif granularity is not None:
            raise InvalidQuotaDefinition(
                f"a granularity applies to sliding windows only, not to {window!r}"
            )
        if not isinstance(log, bool):
            raise InvalidQuotaDefinition(f"log must be True or False, got {log!r}")
        yield from self._ensure_schema()
        yield Execute(
            query("quota_define"),
            {
                "name": name,
                "default_limit": default_limit,
                "period": period,
                "window_seconds": seconds,
                "time_zone": time_zone or "UTC",
                "log": log,
                "bucket_seconds": width if granularity is not None else None,
            },
        )
        return (yield from self._quota(name))

    def _drop_quota(self, name: str) -> Plan[bool]:
        """Forget a quota with its limits, usage and log. False if it did not exist."""
        check_quota_name(name)
        yield from self._ensure_schema()
        row = yield Execute(query("quota_drop"), {"name": name}, "one")
        return bool(row and row[0])

    def _quota(self, name: str) -> Plan[Quota]:
        """The definition of ``name``."""
        check_quota_name(name)
        yield from self._ensure_schema()
        row = yield Execute(query("quota_by_name"), {"name": name}, "one")
        if row is None:
            raise UnknownQuota(f"no quota named {name!r} is defined")
        return _row_to_quota(row)

    def _quotas(self) -> Plan[list[Quota]]:
        """Every defined quota, by name."""
        yield from self._ensure_schema()
        rows = yield Execute(query("quota_list"), fetch="all")
        return [_row_to_quota(r) for r in rows]

    # -- limits -----------------------------------------------------------------

    def _set_limit(
        self,
        quota: str,
        subject: str,
        limit: int,
        valid_from: dt.datetime | None,
        valid_until: dt.datetime | None,
    ) -> Plan[QuotaLimit]:
        """Give ``subject`` its own limit over ``[valid_from, valid_until)``.

        None for a bound means unbounded. A range overlapping another limit of
        the same quota and subject raises :class:`OverlappingQuotaLimits` and
        writes nothing.
        """
        check_quota_name(quota)
        check_subject(subject)
        _check_limit(limit)
        start = _check_instant(valid_from, "valid_from")
        end = _check_instant(valid_until, "valid_until")
        if start is not None and end is not None and end <= start:
            raise InvalidQuotaLimit(
                f"a limit must end after it starts, got [{start.isoformat()}, {end.isoformat()})"
            )
        yield from self._ensure_schema()
        row = yield Execute(
            query("quota_set_limit"),
            {"quota": quota, "subject": subject, "calls": limit, "from": start, "until": end},
            "one",
        )
        assert row is not None
        return QuotaLimit(int(row[0]), subject, limit, start, end)

    def _remove_limits(self, quota: str, subject: str, limit_id: int | None) -> Plan[int]:
        """Remove the limit ``limit_id`` of ``subject``, or all its limits. Returns how many."""
        check_quota_name(quota)
        check_subject(subject)
        if limit_id is not None:
            _check_count(limit_id, "limit_id")
        yield from self._ensure_schema()
        row = yield Execute(
            query("quota_remove_limits"),
            {"quota": quota, "subject": subject, "id": limit_id},
            "one",
        )
        return int(row[0]) if row else 0

    def _limits(self, quota: str, subject: str | None) -> Plan[list[QuotaLimit]]:
        """The limits of one subject, or of every subject, of a quota."""
        found = yield from self._quota(quota)
        if subject is not None:
            check_subject(subject)
        rows = yield Execute(
            query("quota_limits"), {"quota_id": found.id, "subject": subject}, "all"
        )
        return [QuotaLimit(int(r[0]), r[1], int(r[2]), r[3], r[4]) for r in rows]

    # -- calls ------------------------------------------------------------------

    def _register_call(
        self,
        quota: str,
        subject: str,
        cost: int,
        at: dt.datetime | None,
        details: Mapping[str, Any] | None,
    ) -> Plan[CallResult]:
        """Register one call of ``subject`` costing ``cost`` units; say if it is allowed.

        One statement: the usage row of the subject's current window is
        upserted and the decision made from it, locked, so no concurrent call
        can take the same unit. A refused call still counts as an attempt.
        ``at`` (default: the clock, see :class:`Quotas`) places the call in
        its window; ``details`` go to the request log if the quota keeps one.
        """
        check_subject(subject)
        check_cost(cost)
        if at is None and self.clock is not None:
            at = _clock_instant(self.clock)
        if at is not None:
            _check_instant(at, "at")
        if details is not None and not isinstance(details, Mapping):
            raise InvalidQuotaArgument(f"details must be a mapping, got {type(details).__name__}")
        yield from self._ensure_schema()
        conn: ConnState = yield Connection()
        row = yield Execute(
            self._register,
            (
                quota,
                subject,
                cost,
                at,
                None if details is None else Jsonb(dict(details)),
                self._commits_asynchronously(conn),
            ),
            "one",
        )
        assert row is not None
        return CallResult(
            allowed=row[0],
            used=row[1],
            attempts=row[2],
            limit=row[3],
            window_start=row[4],
            window_end=row[5],
            retry_after=row[6],
        )

    def _commits_asynchronously(self, conn: ConnState) -> bool:
        """Whether the next call commits without waiting for the WAL flush.

        True only with ``synchronous_commit=False`` and a call that will be a
        transaction of its own: an autocommit connection outside any transaction.
        """
        return (
            not self.synchronous_commit
            and conn.autocommit
            and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        )

    def _status(self, quota: str, subject: str, at: dt.datetime | None) -> Plan[QuotaStatus]:
        """The usage of ``subject`` in the window containing ``at`` (default: the clock)."""
        check_quota_name(quota)
        check_subject(subject)
        if at is None and self.clock is not None:
            at = _clock_instant(self.clock)
        _check_instant(at, "at")
        yield from self._ensure_schema()
        row = yield Execute(
            query("quota_status"), {"quota": quota, "subject": subject, "at": at}, "one"
        )
        assert row is not None
        return QuotaStatus(*row)

    # -- reports and upkeep -------------------------------------------------------

    def _report(
        self,
        quota: str,
        subject: str | None,
        since: dt.datetime | None,
        until: dt.datetime | None,
        rejected_only: bool,
        limit: int,
    ) -> Plan[list[WindowUsage]]:
        """Usage per subject and window, newest windows first.

        ``since`` / ``until`` keep the windows that overlap ``[since, until)``;
        ``rejected_only`` keeps those in which some call was refused.
        """
        found = yield from self._quota(quota)
        if subject is not None:
            check_subject(subject)
        params = {
            "quota_id": found.id,
            "subject": subject,
            "since": _check_instant(since, "since"),
            "until": _check_instant(until, "until"),
            "rejected_only": bool(rejected_only),
            "limit": _check_count(limit, "limit"),
        }
        rows = yield Execute(query("quota_report"), params, "all")
        return [WindowUsage(*r) for r in rows]

    def _top_rejected(
        self,
        quota: str,
        since: dt.datetime | None,
        until: dt.datetime | None,
        n: int,
    ) -> Plan[list[SubjectRejections]]:
        """The ``n`` subjects with the most refused calls over the windows overlapping
        ``[since, until)``."""
        found = yield from self._quota(quota)
        params = {
            "quota_id": found.id,
            "since": _check_instant(since, "since"),
            "until": _check_instant(until, "until"),
            "limit": _check_count(n, "n"),
        }
        rows = yield Execute(query("quota_top_rejected"), params, "all")
        return [SubjectRejections(*r) for r in rows]

    def _logged_calls(
        self,
        quota: str,
        subject: str | None,
        since: dt.datetime | None,
        until: dt.datetime | None,
        limit: int,
    ) -> Plan[list[LoggedCall]]:
        """Rows of the request log (quotas defined with ``log=True``), newest first."""
        found = yield from self._quota(quota)
        if subject is not None:
            check_subject(subject)
        params = {
            "quota_id": found.id,
            "subject": subject,
            "since": _check_instant(since, "since"),
            "until": _check_instant(until, "until"),
            "limit": _check_count(limit, "limit"),
        }
        rows = yield Execute(query("quota_log"), params, "all")
        # details come as text and are decoded here, whatever loaders the connection
        # has (Django's backend loads jsonb as text)
        return [
            LoggedCall(r[0], r[1], r[2], r[3], None if r[4] is None else json.loads(r[4]))
            for r in rows
        ]

    def _purge(self, before: dt.datetime, quota: str | None) -> Plan[PurgeResult]:
        """Remove the windows that ended at or before ``before`` and older log rows.

        Of one quota, or of all. ``before`` must not be in the future: that
        would forget windows still in use.
        """
        if before is None:
            raise InvalidQuotaArgument("purge needs a cut-off datetime")
        _check_instant(before, "before")
        if quota is not None:
            check_quota_name(quota)
        yield from self._ensure_schema()
        row = yield Execute(query("quota_purge"), {"before": before, "quota": quota}, "one")
        assert row is not None
        return PurgeResult(int(row[0]), int(row[1]))


class Quotas(_QuotaPlans):
    """Quotas kept in a PostgreSQL database, through one psycopg connection.

    ``conn`` may also be a ``psycopg_pool.ConnectionPool``: each call then borrows a
    connection and is a transaction of its own, committed when the call returns. A
    client on a pool may be shared by any number of threads; a client on one
    connection is for one thread at a time (or threads that mean to share that
    connection's transaction).

    ``synchronous_commit=False`` lets a call that is a transaction of its own
    (the connection is in autocommit mode and idle) commit without waiting for
    the WAL flush: about twice the calls per second on the benchmark machine,
    and a hot subject's row lock is held that much shorter. The price: a crash
    of PostgreSQL (not of the application) may forget the calls of its last
    moments (up to three ``wal_writer_delay``, 0.6 s by default), so as many
    calls may be granted again. Calls made inside a transaction always commit
    with it, as it is.

    ``clock``: a function returning the current instant (an aware datetime) for
    the calls and statuses given no ``at``; by default the database's clock is
    used: ``now()``, the transaction's start, or the instant in the setting
    ``pgcounters.now`` when it is set. Either lets tests (and replays) place
    calls at chosen instants.
    """

    def __init__(
        self,
        conn: Conn | ConnectionPool[Any],
        *,
        check_schema: bool = True,
        synchronous_commit: bool = True,
        clock: Callable[[], dt.datetime] | None = None,
    ) -> None:
        super().__init__(
            check_schema=check_schema, synchronous_commit=synchronous_commit, clock=clock
        )
        self._pool: ConnectionPool[Any] | None = None
        self._conn: Conn | None = None
        if isinstance(conn, psycopg.Connection):
            self._conn = conn
        elif isinstance(conn, ConnectionPool):
            self._pool = conn
        else:
            raise ConfigurationError(
                "Quotas takes a psycopg Connection or a psycopg_pool.ConnectionPool, got "
                f"{type(conn).__name__} (for an AsyncConnection, use AsyncQuotas)"
            )

    @property
    def conn(self) -> Conn:
        """The connection the client runs on (not for a client on a pool)."""
        if self._conn is None:
            raise ConfigurationError("this client borrows its connections from a pool")
        return self._conn

    @property
    def pool(self) -> ConnectionPool[Any] | None:
        """The pool the client borrows its connections from, if it was given one."""
        return self._pool

    def _run(self, plan: Plan[T]) -> T:
        if self._pool is None:
            return plans.run(plan, self.conn)
        with self._pool.connection() as conn:
            return plans.run(plan, conn)

    def define_quota(
        self,
        name: str,
        default_limit: int | None = None,
        *,
        window: Window = "day",
        time_zone: str | None = None,
        log: bool = False,
        granularity: Window | None = None,
    ) -> Quota:
        return self._run(
            self._define_quota(name, default_limit, window, time_zone, log, granularity)
        )

    def drop_quota(self, name: str) -> bool:
        return self._run(self._drop_quota(name))

    def quota(self, name: str) -> Quota:
        return self._run(self._quota(name))

    def quotas(self) -> list[Quota]:
        return self._run(self._quotas())

    def set_limit(
        self,
        quota: str,
        subject: str,
        limit: int,
        *,
        valid_from: dt.datetime | None = None,
        valid_until: dt.datetime | None = None,
    ) -> QuotaLimit:
        return self._run(self._set_limit(quota, subject, limit, valid_from, valid_until))

    def remove_limits(self, quota: str, subject: str, limit_id: int | None = None) -> int:
        return self._run(self._remove_limits(quota, subject, limit_id))

    def limits(self, quota: str, subject: str | None = None) -> list[QuotaLimit]:
        return self._run(self._limits(quota, subject))

    def register_call(
        self,
        quota: str,
        subject: str,
        cost: int = 1,
        *,
        at: dt.datetime | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> CallResult:
        return self._run(self._register_call(quota, subject, cost, at, details))

    def commits_asynchronously(self) -> bool:
        """Whether the next call commits without waiting for the WAL flush.

        True only with ``synchronous_commit=False`` and a call that will be a
        transaction of its own: an autocommit connection outside any transaction
        (on a pool: connections opened in autocommit mode).
        """
        if self._pool is None:
            return self._commits_asynchronously(self.conn)
        return not self.synchronous_commit and _autocommit_pool(self._pool.kwargs)

    def status(self, quota: str, subject: str, *, at: dt.datetime | None = None) -> QuotaStatus:
        return self._run(self._status(quota, subject, at))

    def report(
        self,
        quota: str,
        *,
        subject: str | None = None,
        since: dt.datetime | None = None,
        until: dt.datetime | None = None,
        rejected_only: bool = False,
        limit: int = 1000,
    ) -> list[WindowUsage]:
        return self._run(self._report(quota, subject, since, until, rejected_only, limit))

    def top_rejected(
        self,
        quota: str,
        *,
        since: dt.datetime | None = None,
        until: dt.datetime | None = None,
        n: int = 10,
    ) -> list[SubjectRejections]:
        return self._run(self._top_rejected(quota, since, until, n))

    def logged_calls(
        self,
        quota: str,
        *,
        subject: str | None = None,
        since: dt.datetime | None = None,
        until: dt.datetime | None = None,
        limit: int = 1000,
    ) -> list[LoggedCall]:
        return self._run(self._logged_calls(quota, subject, since, until, limit))

    def purge(self, before: dt.datetime, quota: str | None = None) -> PurgeResult:
        return self._run(self._purge(before, quota))


class AsyncQuotas(_QuotaPlans):
    """:class:`Quotas` on a psycopg ``AsyncConnection`` or ``AsyncConnectionPool``.

    The same methods, arguments, results and errors, awaited (``commits_asynchronously``,
    which reads no data, is not awaited). On a pool, each call borrows a connection and
    commits when it returns; such a client may be shared by every task of the loop.
    """

    def __init__(
        self,
        conn: AsyncConn | AsyncConnectionPool[Any],
        *,
        check_schema: bool = True,
        synchronous_commit: bool = True,
        clock: Callable[[], dt.datetime] | None = None,
    ) -> None:
        super().__init__(
            check_schema=check_schema, synchronous_commit=synchronous_commit, clock=clock
        )
        self._pool: AsyncConnectionPool[Any] | None = None
        self._conn: AsyncConn | None = None
        if isinstance(conn, psycopg.AsyncConnection):
            self._conn = conn
        elif isinstance(conn, AsyncConnectionPool):
            self._pool = conn
        else:
            raise ConfigurationError(
                "AsyncQuotas takes a psycopg AsyncConnection or a "
                f"psycopg_pool.AsyncConnectionPool, got {type(conn).__name__} "
                "(for a Connection, use Quotas)"
            )

    @property
    def conn(self) -> AsyncConn:
        """The connection the client runs on (not for a client on a pool)."""
        if self._conn is None:
            raise ConfigurationError("this client borrows its connections from a pool")
        return self._conn

    @property
    def pool(self) -> AsyncConnectionPool[Any] | None:
        """The pool the client borrows its connections from, if it was given one."""
        return self._pool

    async def _run(self, plan: Plan[T]) -> T:
        if self._pool is None:
            return await plans.run_async(plan, self.conn)
        async with self._pool.connection() as conn:
            return await plans.run_async(plan, conn)

    async def define_quota(
        self,
        name: str,
        default_limit: int | None = None,
        *,
        window: Window = "day",
        time_zone: str | None = None,
        log: bool = False,
        granularity: Window | None = None,
    ) -> Quota:
        return await self._run(
            self._define_quota(name, default_limit, window, time_zone, log, granularity)
        )

    async def drop_quota(self, name: str) -> bool:
        return await self._run(self._drop_quota(name))

    async def quota(self, name: str) -> Quota:
        return await self._run(self._quota(name))

    async def quotas(self) -> list[Quota]:
        return await self._run(self._quotas())

    async def set_limit(
        self,
        quota: str,
        subject: str,
        limit: int,
        *,
        valid_from: dt.datetime | None = None,
        valid_until: dt.datetime | None = None,
    ) -> QuotaLimit:
        return await self._run(self._set_limit(quota, subject, limit, valid_from, valid_until))

    async def remove_limits(self, quota: str, subject: str, limit_id: int | None = None) -> int:
        return await self._run(self._remove_limits(quota, subject, limit_id))

    async def limits(self, quota: str, subject: str | None = None) -> list[QuotaLimit]:
        return await self._run(self._limits(quota, subject))

    async def register_call(
        self,
        quota: str,
        subject: str,
        cost: int = 1,
        *,
        at: dt.datetime | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> CallResult:
        return await self._run(self._register_call(quota, subject, cost, at, details))

    def commits_asynchronously(self) -> bool:
        if self._pool is None:
            return self._commits_asynchronously(self.conn)
        return not self.synchronous_commit and _autocommit_pool(self._pool.kwargs)

    async def status(
        self, quota: str, subject: str, *, at: dt.datetime | None = None
    ) -> QuotaStatus:
        return await self._run(self._status(quota, subject, at))

    async def report(
        self,
        quota: str,
        *,
        subject: str | None = None,
        since: dt.datetime | None = None,
        until: dt.datetime | None = None,
        rejected_only: bool = False,
        limit: int = 1000,
    ) -> list[WindowUsage]:
        return await self._run(self._report(quota, subject, since, until, rejected_only, limit))

    async def top_rejected(
        self,
        quota: str,
        *,
        since: dt.datetime | None = None,
        until: dt.datetime | None = None,
        n: int = 10,
    ) -> list[SubjectRejections]:
        return await self._run(self._top_rejected(quota, since, until, n))

    async def logged_calls(
        self,
        quota: str,
        *,
        subject: str | None = None,
        since: dt.datetime | None = None,
        until: dt.datetime | None = None,
        limit: int = 1000,
    ) -> list[LoggedCall]:
        return await self._run(self._logged_calls(quota, subject, since, until, limit))

    async def purge(self, before: dt.datetime, quota: str | None = None) -> PurgeResult:
        return await self._run(self._purge(before, quota))


def _autocommit_pool(kwargs: object) -> bool:
    """True when a pool opens its connections in autocommit mode (kwargs given as a dict)."""
    return isinstance(kwargs, dict) and bool(kwargs.get("autocommit"))


share_docs(_QuotaPlans, Quotas, AsyncQuotas)
AsyncQuotas.commits_asynchronously.__doc__ = Quotas.commits_asynchronously.__doc__
