"""What every rate limiter on pgcounters quotas shares, whatever the web framework.

The headers of a decision (``RateLimit-*``, ``X-RateLimit-*``, ``Retry-After``), which
responses a limiter adds them to, and rate strings (``"1000/day"``, ``"10/minute"``,
``"100/15m"``). The Django decorator and middleware (``pgcounters.contrib.django.ratelimit``)
and the ASGI middleware (``pgcounters.contrib.asgi``) answer alike because they use these.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Literal, TypeAlias

from pgcounters.errors import InvalidQuotaDefinition
from pgcounters.quotas import CallResult, Window, parse_window, sliding_window

HeaderStyle: TypeAlias = Literal["ratelimit", "x-ratelimit", "both", "none"]
HEADER_STYLES: tuple[HeaderStyle, ...] = ("ratelimit", "x-ratelimit", "both", "none")


def rate_limit_headers(result: CallResult, style: HeaderStyle) -> dict[str, str]:
    """The rate-limit headers of a decision (without ``Retry-After``)."""
    reset = max(math.ceil(result.retry_after), 0)
    out: dict[str, str] = {}
    if style in ("ratelimit", "both"):
        out["RateLimit-Limit"] = str(result.limit)
        out["RateLimit-Remaining"] = str(result.remaining)
        out["RateLimit-Reset"] = str(reset)
    if style in ("x-ratelimit", "both"):
        out["X-RateLimit-Limit"] = str(result.limit)
        out["X-RateLimit-Remaining"] = str(result.remaining)
        out["X-RateLimit-Reset"] = str(math.ceil(result.window_end.timestamp()))
    return out


RATE_LIMIT_HEADER_NAMES = frozenset(
    f"{prefix}ratelimit-{field}"
    for prefix in ("", "x-")
    for field in ("limit", "remaining", "reset")
)
"""Every header :func:`rate_limit_headers` can write, in lower case."""


def adds_rate_limit_headers(status: int, header_names: Iterable[str]) -> bool:
    """Whether a limiter adds its rate-limit headers to a response it let through, of this
    status and with headers of these names (any case).

    Not to a 429: the application's own refusal, not the limiter's, which a client must
    tell apart (the limiter's own 429 always carries its headers and ``Retry-After``). Not
    to a response carrying rate-limit headers of its own (another limit's, or the
    application's): it keeps that set alone, never two values of one header. Every other
    response gets them, describing the call the limiter counted."""
    if status == 429:
        return False
    return not any(name.lower() in RATE_LIMIT_HEADER_NAMES for name in header_names)


def retry_after(result: CallResult) -> str:
    """The ``Retry-After`` of a refused call: whole seconds until its window ends, at least 1."""
    return str(max(math.ceil(result.retry_after), 1))


def parse_rate(rate: str, *, sliding: bool = False) -> tuple[int, Window]:
    """``(calls, window)`` of a rate string: ``"1000/day"``, ``"10/minute"``, ``"5/15m"``,
    ``"100/sliding:hour"``, ``"100/sliding:hour by 1m"``.

    The window is anything :func:`pgcounters.quotas.parse_window` reads (``second``,
    ``minute``, ``hour``, ``day``, ``week``, ``month``, a duration such as ``90s``, or
    ``sliding:`` and a fixed length for a sliding window, optionally followed by ``by``
    and the width of its buckets: ``sliding:hour by 1m``). With ``sliding=True`` (the
    decorator, the middlewares, the dependency) ``"100/hour by 1m"`` is the same as
    ``"100/sliding:hour by 1m"``. A bad width raises :class:`InvalidBucketWidth`.
    """
    if not isinstance(rate, str) or rate.count("/") != 1:
        raise InvalidQuotaDefinition(
            f"invalid rate {rate!r}: write calls/window, such as 1000/day or 10/minute"
        )
    calls_text, window = (part.strip() for part in rate.split("/"))
    if not calls_text.isascii() or not calls_text.isdigit() or int(calls_text) < 1:
        raise InvalidQuotaDefinition(
            f"invalid rate {rate!r}: the number of calls must be a positive integer"
        )
    if sliding:
        return int(calls_text), sliding_window(window)  # raises for a window it cannot read
    parse_window(window)  # raises for a window it cannot read
    return int(calls_text), window
