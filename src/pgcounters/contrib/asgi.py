"""Rate limiting for ASGI applications (Starlette, FastAPI, any ASGI app) on pgcounters quotas.

A plain ASGI middleware: each HTTP request registers one call of a subject (the
client address, a header, the authenticated user, or what a callable returns)
against a quota, through an :class:`pgcounters.AsyncQuotas`. A refused call is
answered ``429 Too Many Requests`` with ``Retry-After`` and the rate-limit headers;
the application's responses carry the rate-limit headers too, but for a 429 of its own,
passed on untouched so that a client can tell which refused it. Subjects and headers are
the Django decorator's (``pgcounters.contrib.django.ratelimit``), whose header code it
shares.

    pool = AsyncConnectionPool(dsn, open=False)
    app.add_middleware(
        RateLimitMiddleware, quotas=AsyncQuotas(pool), quota="api.calls",
        rate="1000/day", key="header:X-Api-Key",
    )

The decision is exact under any concurrency: one upsert of the subject's usage row
decides, so no two requests can take the same last unit.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any, TypeAlias

from pgcounters.errors import ConfigurationError
from pgcounters.quotas import AsyncQuotas, CallResult, check_quota_name
from pgcounters.ratelimit import (
    HEADER_STYLES,
    HeaderStyle,
    adds_rate_limit_headers,
    parse_rate,
    rate_limit_headers,
    retry_after,
)

__all__ = ["KEY_NAMES", "RateLimitMiddleware", "client_ip", "parse_rate", "subject_for"]

KEY_NAMES = ("user", "ip", "user_or_ip")
"""The named keys (besides ``"header:<Name>"`` and callables)."""

Scope: TypeAlias = MutableMapping[str, Any]
Message: TypeAlias = MutableMapping[str, Any]
Receive: TypeAlias = Callable[[], Awaitable[Message]]
Send: TypeAlias = Callable[[Message], Awaitable[None]]
ASGIApp: TypeAlias = Callable[[Scope, Receive, Send], Awaitable[None]]
KeyFunc: TypeAlias = Callable[[Scope], "str | None"]
Key: TypeAlias = str | KeyFunc
"""``"ip"``, ``"user"`` / ``"user_or_ip"`` (``scope["user"]``, as Starlette's
AuthenticationMiddleware sets it), ``"header:<Name>"``, or a callable ``(scope) -> str | None``
(None: the request is not limited)."""


def _check_key(key: object) -> None:
    if callable(key) or key in KEY_NAMES:
        return
    if isinstance(key, str) and key.startswith("header:") and len(key) > len("header:"):
        return
    raise ConfigurationError(
        f"invalid rate-limit key {key!r}: use 'user', 'ip', 'user_or_ip', 'header:<Name>' "
        "or a callable(scope) -> str | None"
    )


def _header(scope: Scope, name: str) -> str | None:
    wanted = name.lower().encode("latin-1")
    for header, value in scope.get("headers") or ():
        if bytes(header).lower() == wanted:
            return bytes(value).decode("latin-1")
    return None


def client_ip(scope: Scope, ip_header: str | None = None) -> str | None:
    """The client address: ``ip_header`` (the last of a comma-separated list) when given,
    as a proxy sets it, else the address of the connection."""
    if ip_header is not None:
        value = _header(scope, ip_header)
        last = value.split(",")[-1].strip() if value else ""
        return last or None
    client = scope.get("client")
    return str(client[0]) if client else None


def _user_identity(user: object) -> str | None:
    """The identity of an authenticated ``scope["user"]`` (Starlette's BaseUser), else None."""
    if not getattr(user, "is_authenticated", False):
        return None
    for attribute in ("identity", "display_name"):
        try:
            value = getattr(user, attribute, None)
        except NotImplementedError:  # BaseUser's identity, when a subclass leaves it out
            continue
        if value:
            return str(value)
    return None


def subject_for(scope: Scope, key: Key, ip_header: str | None = None) -> str | None:
    """The quota subject of a request: ``user:<id>``, ``ip:<address>``, ``header:<value>``,
    or what a callable key returns. None: the request is not limited."""
    if callable(key):
        return key(scope)
    if key in ("user", "user_or_ip"):
        identity = _user_identity(scope.get("user"))
        if identity:
            return f"user:{identity}"
    if key.startswith("header:"):
        value = _header(scope, key[len("header:") :])
        if value:
            return f"header:{value}"
        # without the header the client falls back to its address: leaving a header out
        # must not escape the limit
    ip = client_ip(scope, ip_header)
    return f"ip:{ip}" if ip else None


def _with_headers(start: Message, extra: list[tuple[bytes, bytes]]) -> Message:
    """The application's ``http.response.start`` with the middleware's headers added, or as
    the application sent it when :func:`pgcounters.ratelimit.adds_rate_limit_headers` says
    so (a 429 of its own, a response with rate-limit headers of its own)."""
    headers = list(start.get("headers", ()))
    names = (bytes(name).decode("latin-1") for name, _ in headers)
    if not adds_rate_limit_headers(int(start.get("status", 200)), names):
        return start
    return {**start, "headers": [*headers, *extra]}


class RateLimitMiddleware:
    """Limit the HTTP requests of an ASGI app by a quota of ``quotas`` (an AsyncQuotas).

    ``rate`` (``"1000/day"``, ``"10/minute"``, ``"100/sliding:hour"``): define the quota
    with that limit and window on the first request (an existing quota's limit follows it;
    its window cannot change); without it the quota must be defined already.
    ``sliding=True`` makes the rate's window a sliding one (``"100/hour"``: any span of an
    hour holds at most 100 calls). ``key``: see :data:`Key`. ``cost``: units
    per request, or a callable ``(scope) -> int``. ``paths``: path prefixes limited (default
    all). ``methods``: HTTP methods limited (default all). ``headers``: ``"ratelimit"``,
    ``"x-ratelimit"``, ``"both"`` or ``"none"``. ``ip_header``: the header holding the client
    address behind a proxy. ``block=False`` lets refused requests through, the decision in
    ``scope["state"]["ratelimit"]``.

    The middleware's own 429 carries ``Retry-After`` and the rate-limit headers. The
    application's responses get the rate-limit headers added, except a 429 of its own,
    which passes as the application sent it, and a header the application set itself.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        quotas: AsyncQuotas,
        quota: str,
        rate: str | None = None,
        sliding: bool = False,
        key: Key = "user_or_ip",
        cost: int | Callable[[Scope], int] = 1,
        paths: Iterable[str] = ("/",),
        methods: Iterable[str] | None = None,
        headers: HeaderStyle = "ratelimit",
        ip_header: str | None = None,
        block: bool = True,
    ) -> None:
        if not isinstance(quotas, AsyncQuotas):
            raise ConfigurationError("RateLimitMiddleware takes quotas=AsyncQuotas(pool or conn)")
        check_quota_name(quota)
        _check_key(key)
        if headers not in HEADER_STYLES:
            raise ConfigurationError(
                f"headers must be one of {', '.join(HEADER_STYLES)}, got {headers!r}"
            )
        self.app = app
        self.quotas = quotas
        self.quota = quota
        if sliding and rate is None:
            raise ConfigurationError("sliding=True goes with a rate, such as rate='100/hour'")
        self.rate = None if rate is None else parse_rate(rate, sliding=sliding)
        self.key = key
        self.cost = cost
        self.paths = tuple(paths)
        self.methods = None if methods is None else frozenset(m.upper() for m in methods)
        self.headers: HeaderStyle = headers
        self.ip_header = ip_header
        self.block = block
        self._defined = self.rate is None

    def headers_of(self, result: CallResult) -> dict[str, str]:
        """The rate-limit headers of a decision, in this middleware's style (for an
        application that refuses by the decision itself, with ``block=False``)."""
        return rate_limit_headers(result, self.headers)

    def _limited(self, scope: Scope) -> bool:
        if scope.get("type") != "http":
            return False
        path = str(scope.get("path", ""))
        method = str(scope.get("method", "")).upper()
        return any(path.startswith(p) for p in self.paths) and (
            self.methods is None or method in self.methods
        )

    async def decide(self, scope: Scope) -> CallResult | None:
        """Register the call of a request; None when it has no subject (not limited)."""
        subject = subject_for(scope, self.key, self.ip_header)
        if subject is None:
            return None
        if not self._defined and self.rate is not None:
            calls, window = self.rate
            await self.quotas.define_quota(self.quota, calls, window=window)
            self._defined = True
        units = self.cost(scope) if callable(self.cost) else self.cost
        return await self.quotas.register_call(self.quota, subject, units)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self._limited(scope):
            await self.app(scope, receive, send)
            return
        result = await self.decide(scope)
        scope.setdefault("state", {})["ratelimit"] = result
        if result is None:
            await self.app(scope, receive, send)
            return
        extra = [
            (name.lower().encode("latin-1"), value.encode("latin-1"))
            for name, value in self.headers_of(result).items()
        ]
        if not result.allowed and self.block:
            body = b"Too Many Requests\n"
            await send(
                {
                    "type": "http.response.start",
                    "status": 429,
                    "headers": [
                        (b"content-type", b"text/plain; charset=utf-8"),
                        (b"content-length", str(len(body)).encode()),
                        (b"retry-after", retry_after(result).encode()),
                        *extra,
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return

        async def send_with_headers(message: Message) -> None:
            if message.get("type") == "http.response.start" and extra:
                message = _with_headers(message, extra)
            await send(message)

        await self.app(scope, receive, send_with_headers)
