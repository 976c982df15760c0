"""Argument types of the command line: a value the command line alone shows wrong is a
usage error (one line, exit 2) before any database is opened.

Each raises :class:`argparse.ArgumentTypeError` with a message starting "must be", so the
error reads ``--batch-size must be a positive integer, got '0'``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
from typing import Any

from pgcounters.client import INT_MAX


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None


def positive_int(text: str) -> int:
    """An integer of at least 1 (a batch size, a number of keys or calls)."""
    value = _integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def batch_size(text: str) -> int:
    """A drain's batch size: an integer from 1 to 2147483647 (the SQL functions take an
    ``integer``)."""
    value = positive_int(text)
    if value > INT_MAX:
        raise argparse.ArgumentTypeError(f"must be at most {INT_MAX}, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    """An integer of at least 0."""
    value = _integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be zero or more, got {text!r}")
    return value


def port(text: str) -> int:
    """A TCP port, 0 (any free one) to 65535."""
    value = _integer(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port (0 to 65535), got {text!r}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}")
    return value


def positive_seconds(text: str) -> float:
    """A number of seconds above 0 (an interval)."""
    value = _seconds(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return value


def non_negative_seconds(text: str) -> float:
    """A number of seconds, 0 or more (a timeout where 0 means none, a bound)."""
    value = _seconds(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be zero or more seconds, got {text!r}")
    return value


STATEMENT_TIMEOUT_MAX = (2**31 - 1) // 1000


def statement_seconds(text: str) -> float:
    """A statement timeout in seconds: 0 (none) up to PostgreSQL's largest, 2147483."""
    value = non_negative_seconds(text)
    if value > STATEMENT_TIMEOUT_MAX:
        raise argparse.ArgumentTypeError(
            f"must be at most {STATEMENT_TIMEOUT_MAX} seconds, got {text!r}"
        )
    return value


def instant(text: str) -> dt.datetime:
    """An ISO 8601 instant; without an offset it is taken as UTC."""
    try:
        value = dt.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be an ISO 8601 date or time, got {text!r}"
        ) from None
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)


def json_object(text: str) -> dict[str, Any]:
    """A JSON object (``quota call --details``)."""
    try:
        value = json.loads(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be JSON, got {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {text!r}")
    return value


def window(text: str) -> str:
    """A quota window: ``day``, ``week``, ``month``, ``hour``, ``minute`` or a duration."""
    from pgcounters.errors import PgCountersError
    from pgcounters.quotas import parse_window

    try:
        parse_window(text)
    except PgCountersError as exc:
        raise argparse.ArgumentTypeError(f"must be a quota window: {exc}") from None
    return text


def duration(text: str) -> dt.timedelta:
    """A duration such as ``90s``, ``15m``, ``12h``, ``30d`` (``quota purge --older-than``)."""
    from pgcounters.errors import PgCountersError
    from pgcounters.quotas import parse_window

    try:
        _period, seconds = parse_window(text)
    except PgCountersError:
        seconds = None
    if seconds is None:
        raise argparse.ArgumentTypeError(f"must be a duration such as 30d or 12h, got {text!r}")
    try:
        value = dt.timedelta(seconds=seconds)
        dt.datetime.now(dt.UTC) - value  # a duration back from now: before year 1 is too far
    except OverflowError:
        raise argparse.ArgumentTypeError(f"must be a shorter duration, got {text!r}") from None
    return value
