"""Rate limiting of Starlette and FastAPI endpoints: a dependency on pgcounters quotas.

:class:`RateLimit` is a FastAPI dependency (``Depends(RateLimit("10/minute", key="ip"))``)
that registers one call of the request's subject against a quota through an
:class:`pgcounters.AsyncQuotas`. A refused call raises ``HTTPException(429)`` carrying
``Retry-After`` and the rate-limit headers; an allowed one adds the rate-limit headers
to the endpoint's response: the semantics of the Django decorator and of the ASGI
middleware (:mod:`pgcounters.contrib.asgi`), whose subjects and headers it shares.
In a Starlette endpoint, ``await limit.check(request)`` does the same.

The decision is exact under any concurrency: one upsert of the subject's usage row
decides, so no two requests can take the same last unit.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from typing import TypeAlias

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from pgcounters.contrib.asgi import KEY_NAMES, subject_for
from pgcounters.errors import ConfigurationError
from pgcounters.quotas import (
    AsyncQuotas,
    CallResult,
    Window,
    check_quota_name,
    parse_window,
    window_bucket_width,
)
from pgcounters.ratelimit import (
    HEADER_STYLES,
    HeaderStyle,
    parse_rate,
    rate_limit_headers,
    retry_after,
)

__all__ = ["RateLimit", "quota_name"]

RequestKey: TypeAlias = str | Callable[[Request], "str | None"]
"""``"ip"``, ``"user"`` / ``"user_or_ip"`` (``request.user``, as Starlette's
AuthenticationMiddleware sets it), ``"header:<Name>"``, or a callable
``(request) -> str | None`` (None: the request is not limited)."""


def quota_name(rate: str, sliding: bool = False) -> str:
    """The quota a :class:`RateLimit` without a ``quota`` uses: ``ratelimit:<calls>/<window>``,
    such as ``ratelimit:10/60s``, ``ratelimit:10/sliding:60s`` or, with a bucket width,
    ``ratelimit:100/sliding:3600s/60s``."""
    calls, window = parse_rate(rate, sliding=sliding)
    return f"ratelimit:{calls}/{_normal_window(window)}"


def _normal_window(window: Window) -> str:
    period, seconds = parse_window(window)
    if period == "fixed":
        return f"{seconds}s"
    if period == "sliding":
        width = window_bucket_width(window)
        return f"sliding:{seconds}s" + ("" if width is None else f"/{width}s")
    return period


class RateLimit:
    """A dependency limiting an endpoint to ``rate`` (``"1000/day"``, ``"10/minute"``,
    ``"100/sliding:hour"``) per subject.

    ``key``: see :data:`RequestKey` (default ``"user_or_ip"``). ``quota``: the quota's name
    (default :func:`quota_name` of the rate: endpoints limited by the same rate and no name
    share one budget per subject; give each its own name for budgets of their own). The
    quota is defined with the rate's limit and window on the first request (an existing
    quota's default limit follows the rate; its window cannot change). ``sliding=True``
    makes the rate's window a sliding one (``"100/hour"`` -> any span of an hour).
    ``quotas``: the :class:`AsyncQuotas` to use; default ``request.app.state.quotas``, set
    in the application's lifespan. ``cost``: units per request, or a callable
    ``(request) -> int``. ``methods``: only these HTTP methods are limited (default all).
    ``headers``: ``"ratelimit"``, ``"x-ratelimit"``, ``"both"`` or ``"none"``.
    ``ip_header``: the header holding the client address behind a proxy (the last address
    of its list). ``block=False`` lets refused requests through; the decision is in
    ``request.state.ratelimit`` either way (a :class:`pgcounters.quotas.CallResult`, or
    None when the request has no subject or is not limited).
    """

    def __init__(
        self,
        rate: str,
        *,
        key: RequestKey = "user_or_ip",
        quota: str | None = None,
        sliding: bool = False,
        quotas: AsyncQuotas | None = None,
        cost: int | Callable[[Request], int] = 1,
        methods: Iterable[str] | None = None,
        headers: HeaderStyle = "ratelimit",
        ip_header: str | None = None,
        block: bool = True,
    ) -> None:
        self.calls, self.window = parse_rate(rate, sliding=sliding)
        self.quota = check_quota_name(quota) if quota is not None else quota_name(rate, sliding)
        if not callable(key) and not (
            key in KEY_NAMES
            or (isinstance(key, str) and key.startswith("header:") and len(key) > 7)
        ):
            raise ConfigurationError(
                f"invalid rate-limit key {key!r}: use 'user', 'ip', 'user_or_ip', "
                "'header:<Name>' or a callable(request) -> str | None"
            )
        if quotas is not None and not isinstance(quotas, AsyncQuotas):
            raise ConfigurationError("RateLimit takes quotas=AsyncQuotas(pool or conn)")
        if headers not in HEADER_STYLES:
            raise ConfigurationError(
                f"headers must be one of {', '.join(HEADER_STYLES)}, got {headers!r}"
            )
        self.key = key
        self.quotas = quotas
        self.cost = cost
        self.methods = None if methods is None else frozenset(m.upper() for m in methods)
        self.headers: HeaderStyle = headers
        self.ip_header = ip_header
        self.block = block
        # the clients the quota was defined through: held weakly, not by id(), which a
        # new client (of another database, say) may get once the old one is gone
        self._defined: weakref.WeakSet[AsyncQuotas] = weakref.WeakSet()

    def _quotas_of(self, request: Request) -> AsyncQuotas:
        if self.quotas is not None:
            return self.quotas
        found = getattr(request.app.state, "quotas", None)
        if not isinstance(found, AsyncQuotas):
            raise ConfigurationError(
                "RateLimit needs quotas=AsyncQuotas(...) or app.state.quotas set to one "
                "(in the application's lifespan)"
            )
        return found

    async def check(self, request: Request) -> CallResult | None:
        """Register the call of ``request``; the decision, also kept in
        ``request.state.ratelimit`` (None: not limited). Raises the 429 when refused and
        blocking. Does not add headers to a response (``__call__`` does)."""
        result: CallResult | None = None
        if self.methods is None or request.method.upper() in self.methods:
            if callable(self.key):
                subject = self.key(request)
            else:
                subject = subject_for(request.scope, self.key, self.ip_header)
            if subject is not None:
                quotas = self._quotas_of(request)
                if quotas not in self._defined:
                    await quotas.define_quota(self.quota, self.calls, window=self.window)
                    self._defined.add(quotas)
                units = self.cost(request) if callable(self.cost) else self.cost
                result = await quotas.register_call(self.quota, subject, units)
        request.state.ratelimit = result
        if result is not None and not result.allowed and self.block:
            raise HTTPException(
                status_code=429,
                detail="Too Many Requests",
                headers={"Retry-After": retry_after(result), **self.headers_of(result)},
            )
        return result

    def headers_of(self, result: CallResult) -> dict[str, str]:
        """The rate-limit headers of a decision, in this dependency's style."""
        return rate_limit_headers(result, self.headers)

    async def __call__(self, request: Request, response: Response) -> CallResult | None:
        result = await self.check(request)
        if result is not None:
            for name, value in self.headers_of(result).items():
                response.headers[name] = value
        return result
