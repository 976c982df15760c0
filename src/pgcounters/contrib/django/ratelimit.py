"""Rate limiting for Django views on pgcounters quotas: a view decorator and a middleware.

Each request registers one call of a subject (the user, the client address, a
header, or what a callable returns) against a quota defined with
:meth:`pgcounters.Quotas.define_quota` (or ``pgcounters quota define``). A refused
call is answered ``429 Too Many Requests`` with ``Retry-After`` and the
rate-limit headers; the view's responses carry the rate-limit headers too, but for a 429
of its own and a response with rate-limit headers of its own, passed on as the view made
them (:func:`pgcounters.ratelimit.adds_rate_limit_headers`, the ASGI middleware's rule).

    from pgcounters.contrib.django.ratelimit import ratelimit

    @ratelimit("api.calls", key="user_or_ip")
    def my_view(request): ...

    @ratelimit("api.calls", key="header:X-Api-Key", methods=["POST"])
    class MyView(View): ...

Settings (all optional, prefixed ``PGCOUNTERS_RATELIMIT_``) are described in
:class:`RateLimitSettings` and in ``docs/quotas.md``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar, cast

from django.conf import settings as django_settings
from django.http import HttpRequest, HttpResponse
from django.utils.module_loading import import_string

from pgcounters.contrib.django.db import psycopg_connection
from pgcounters.contrib.django.errors import SettingsError
from pgcounters.errors import PgCountersError
from pgcounters.quotas import CallResult, Quotas, Window
from pgcounters.ratelimit import (
    HEADER_STYLES,
    HeaderStyle,
    adds_rate_limit_headers,
    parse_rate,
    rate_limit_headers,
    retry_after,
)

KeyFunc: TypeAlias = Callable[[HttpRequest], "str | None"]
Key: TypeAlias = str | KeyFunc
"""``"user"``, ``"ip"``, ``"user_or_ip"``, ``"header:<Name>"``, or a callable."""
Cost: TypeAlias = int | Callable[[HttpRequest], int]
ResponseFactory: TypeAlias = Callable[[HttpRequest, CallResult], HttpResponse]
V = TypeVar("V")

PREFIX = "PGCOUNTERS_RATELIMIT_"


@dataclass(frozen=True)
class RateLimitSettings:
    """The ``PGCOUNTERS_RATELIMIT_*`` settings, read when a request is limited.

    ``QUOTA``: the quota of the middleware (required by it). ``RATE``: its rate
    (``"1000/day"``, ``"100/sliding:hour"``), which defines the quota on the first
    request (default: none, the quota must be defined). ``SLIDING``: True makes the
    rate's window a sliding one. ``KEY``: its key
    (default ``"user_or_ip"``). ``PATHS``: path prefixes the middleware limits
    (default: every path). ``METHODS``: HTTP methods it limits (default: all).
    ``HEADERS``: ``"ratelimit"`` (``RateLimit-Limit``, ``RateLimit-Remaining``,
    ``RateLimit-Reset`` in seconds, the default), ``"x-ratelimit"``
    (``X-RateLimit-*``, reset as a Unix time), ``"both"`` or ``"none"``.
    ``IP_META``: the ``request.META`` entry holding the client address (default
    ``"REMOTE_ADDR"``; behind a proxy, one it sets, such as ``"HTTP_X_REAL_IP"``;
    of a comma-separated list the last address is used). ``DATABASE``: the
    database alias (default ``"default"``). ``SYNCHRONOUS_COMMIT``: False lets
    calls made outside a transaction commit without waiting for the WAL flush
    (see :class:`pgcounters.Quotas`). ``RESPONSE``: dotted path of a callable
    ``(request, result) -> HttpResponse`` for refused requests. ``LOG_DETAILS``:
    pass method, path, client address and user agent as details to the
    request log of quotas that keep one (default False).
    """

    quota: str | None = None
    rate: tuple[int, Window] | None = None
    key: Key = "user_or_ip"
    paths: tuple[str, ...] = ("/",)
    methods: frozenset[str] | None = None
    headers: HeaderStyle = "ratelimit"
    ip_meta: str = "REMOTE_ADDR"
    database: str = "default"
    synchronous_commit: bool = True
    response: ResponseFactory | None = None
    log_details: bool = False

    @classmethod
    def load(cls) -> RateLimitSettings:
        def get(name: str, default: Any) -> Any:
            return getattr(django_settings, PREFIX + name, default)

        headers = get("HEADERS", "ratelimit")
        if headers not in HEADER_STYLES:
            raise SettingsError(
                f"{PREFIX}HEADERS must be one of {', '.join(HEADER_STYLES)}, got {headers!r}"
            )
        quota = get("QUOTA", None)
        if quota is not None and not isinstance(quota, str):
            raise SettingsError(f"{PREFIX}QUOTA must be a quota name, got {quota!r}")
        paths = get("PATHS", ("/",))
        if isinstance(paths, str) or not all(isinstance(p, str) for p in paths):
            raise SettingsError(f"{PREFIX}PATHS must be a list of path prefixes")
        response = get("RESPONSE", None)
        if isinstance(response, str):
            try:
                response = import_string(response)
            except ImportError as exc:
                raise SettingsError(f"{PREFIX}RESPONSE: {exc}") from None
        if response is not None and not callable(response):
            raise SettingsError(f"{PREFIX}RESPONSE must be a callable or its dotted path")
        key = get("KEY", "user_or_ip")
        _check_key(key)
        flags = {name: get(name, default) for name, default in _FLAGS.items()}
        for name, value in flags.items():
            if not isinstance(value, bool):
                raise SettingsError(f"{PREFIX}{name} must be True or False, got {value!r}")
        ip_meta = get("IP_META", "REMOTE_ADDR")
        if not isinstance(ip_meta, str) or not ip_meta:
            raise SettingsError(
                f"{PREFIX}IP_META must name the request.META entry holding the client "
                f"address (such as 'HTTP_X_REAL_IP'), got {ip_meta!r}"
            )
        rate = get("RATE", None)
        try:
            definition = None if rate is None else rate_definition(rate, flags["SLIDING"])
        except PgCountersError as exc:
            raise SettingsError(f"{PREFIX}RATE: {exc}") from None
        return cls(
            quota=quota,
            rate=definition,
            key=key,
            paths=tuple(paths),
            methods=_methods(get("METHODS", None)),
            headers=headers,
            ip_meta=ip_meta,
            database=str(get("DATABASE", "default")),
            synchronous_commit=flags["SYNCHRONOUS_COMMIT"],
            response=response,
            log_details=flags["LOG_DETAILS"],
        )


# the settings that are True or False, with their defaults
_FLAGS = {"SLIDING": False, "SYNCHRONOUS_COMMIT": True, "LOG_DETAILS": False}


def rate_definition(rate: str, sliding: object = False) -> tuple[int, Window]:
    """``(calls, window)`` of a rate, its window made sliding when ``sliding``."""
    if not isinstance(sliding, bool):
        raise SettingsError(f"sliding must be True or False, got {sliding!r}")
    return parse_rate(rate, sliding=sliding)


def _define(
    config: RateLimitSettings,
    quota: str,
    rate: tuple[int, Window] | None,
    defined: set[tuple[str, str, int, str]],
) -> None:
    """Define ``quota`` with ``rate``, once per decorated view or middleware (and database)."""
    if rate is None:
        return
    marker = (config.database, quota, rate[0], str(rate[1]))
    if marker in defined:
        return
    with psycopg_connection(config.database) as conn:
        Quotas(conn, check_schema=False).define_quota(quota, rate[0], window=rate[1])
    defined.add(marker)


def _methods(methods: Iterable[str] | None) -> frozenset[str] | None:
    if methods is None:
        return None
    if isinstance(methods, str):
        methods = [methods]
    return frozenset(m.upper() for m in methods)


def _check_key(key: object) -> None:
    if callable(key):
        return
    if key in ("user", "ip", "user_or_ip"):
        return
    if isinstance(key, str) and key.startswith("header:") and len(key) > len("header:"):
        return
    raise SettingsError(
        f"invalid rate-limit key {key!r}: use 'user', 'ip', 'user_or_ip', 'header:<Name>' "
        "or a callable(request) -> str | None"
    )


def client_ip(request: HttpRequest, meta: str = "REMOTE_ADDR") -> str | None:
    """The client address from ``request.META[meta]`` (the last of a comma-separated list),
    else the peer's address (``REMOTE_ADDR``): a request that did not come through the
    proxy setting ``meta`` is limited by where it came from, it does not escape the limit."""
    for entry in (meta, "REMOTE_ADDR"):
        value = request.META.get(entry)
        last = str(value).split(",")[-1].strip() if value else ""
        if last:
            return last
    return None


def subject_for(request: HttpRequest, key: Key, config: RateLimitSettings) -> str | None:
    """The quota subject of ``request``: ``user:<pk>``, ``ip:<address>``, ``header:<value>``,
    or what a callable key returns. None: the request is not limited."""
    if callable(key):
        return key(request)
    user = getattr(request, "user", None)
    if key in ("user", "user_or_ip") and user is not None and user.is_authenticated:
        return f"user:{user.pk}"
    if key.startswith("header:"):
        value = request.headers.get(key[len("header:") :])
        if value:
            return f"header:{value}"
        # without the header the client falls back to its address: leaving a header out
        # must not escape the limit
    ip = client_ip(request, config.ip_meta)
    return f"ip:{ip}" if ip else None


def too_many_requests(request: HttpRequest, result: CallResult) -> HttpResponse:
    """The default answer to a refused call."""
    return HttpResponse("Too Many Requests\n", status=429, content_type="text/plain; charset=utf-8")


def _details(request: HttpRequest, config: RateLimitSettings) -> dict[str, Any]:
    return {
        "method": request.method,
        "path": request.path,
        "ip": client_ip(request, config.ip_meta),
        "user_agent": request.headers.get("User-Agent"),
    }


def check_request(
    request: HttpRequest,
    quota: str,
    key: Key,
    cost: Cost,
    config: RateLimitSettings,
) -> CallResult | None:
    """Register the call of ``request``; None when it has no subject (not limited)."""
    subject = subject_for(request, key, config)
    if subject is None:
        return None
    units = cost(request) if callable(cost) else cost
    with psycopg_connection(config.database) as conn:
        quotas = Quotas(conn, check_schema=False, synchronous_commit=config.synchronous_commit)
        return quotas.register_call(
            quota,
            subject,
            units,
            details=_details(request, config) if config.log_details else None,
        )


def ratelimit_headers(result: CallResult) -> dict[str, str]:
    """The rate-limit headers of a decision (``request.ratelimit``) in the style of
    ``PGCOUNTERS_RATELIMIT_HEADERS``, without ``Retry-After``: for a view that refuses by
    the decision itself (``block=False``), whose own 429 the limiter leaves untouched."""
    return rate_limit_headers(result, RateLimitSettings.load().headers)


def _finish(
    request: HttpRequest,
    result: CallResult | None,
    config: RateLimitSettings,
    get_response: Callable[[], HttpResponse],
    block: bool,
) -> HttpResponse:
    """The limiter's own 429 with ``Retry-After`` and its rate-limit headers, or the view's
    response, with the rate-limit headers added unless it is a 429 of the view's own or
    carries rate-limit headers of its own (a limit nearer the view set them)."""
    request.ratelimit = result  # type: ignore[attr-defined]
    if result is None:
        return get_response()
    headers = rate_limit_headers(result, config.headers)
    if not result.allowed and block:
        response = (config.response or too_many_requests)(request, result)
        response["Retry-After"] = retry_after(result)
    else:
        response = get_response()
        if not adds_rate_limit_headers(response.status_code, response.headers):
            return response
    for name, value in headers.items():
        response[name] = value
    return response


def ratelimit(
    quota: str,
    *,
    rate: str | None = None,
    sliding: bool = False,
    key: Key = "user_or_ip",
    cost: Cost = 1,
    methods: Iterable[str] | None = None,
    block: bool = True,
) -> Callable[[V], V]:
    """Limit a view (function or class-based) by a quota.

    ``rate`` (``"1000/day"``, ``"10/minute"``, ``"100/sliding:hour"``): define the quota
    with that limit and window on the first request (an existing quota's limit follows
    it; its window cannot change); without it the quota must be defined already.
    ``sliding=True`` makes the rate's window a sliding one.
    ``key``: ``"user"`` / ``"user_or_ip"`` (the authenticated user, else the client
    address), ``"ip"``, ``"header:<Name>"`` (else the client address), or a
    callable ``(request) -> str | None`` (None: this request is not limited).
    ``cost``: units per request, or a callable ``(request) -> int``. ``methods``:
    only these HTTP methods are limited (default: all). ``block=False`` lets a
    refused request through to the view, which finds the decision in
    ``request.ratelimit`` (a :class:`pgcounters.quotas.CallResult`).

    The decorator's own 429 carries ``Retry-After`` and the rate-limit headers. The view's
    responses get the rate-limit headers added, except a 429 of its own (with
    ``block=False``, add :func:`ratelimit_headers` to it yourself) and a response that
    carries rate-limit headers of its own, both passed on as the view made them.

    On a class-based view the decorator wraps ``dispatch``; on a method, use
    ``django.utils.decorators.method_decorator``.
    """
    _check_key(key)
    only = _methods(methods)
    if sliding and rate is None:
        raise SettingsError("sliding=True goes with a rate, such as rate='100/hour'")
    definition = None if rate is None else rate_definition(rate, sliding)
    defined: set[tuple[str, str, int, str]] = set()

    def limit(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @functools.wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if only is not None and (request.method or "").upper() not in only:
                return view(request, *args, **kwargs)
            config = RateLimitSettings.load()
            _define(config, quota, definition, defined)
            result = check_request(request, quota, key, cost, config)
            return _finish(request, result, config, lambda: view(request, *args, **kwargs), block)

        return wrapper

    def decorate(target: V) -> V:
        if isinstance(target, type):
            dispatch = target.dispatch  # type: ignore[attr-defined]

            @functools.wraps(dispatch)
            def limited_dispatch(self: Any, request: HttpRequest, *a: Any, **kw: Any) -> Any:
                return limit(functools.partial(dispatch, self))(request, *a, **kw)

            target.dispatch = limited_dispatch  # type: ignore[attr-defined]
            return target
        return cast(V, limit(cast(Callable[..., HttpResponse], target)))

    return decorate


class RateLimitMiddleware:
    """Limit every request under ``PGCOUNTERS_RATELIMIT_PATHS`` by ``PGCOUNTERS_RATELIMIT_QUOTA``.

    Place it after ``AuthenticationMiddleware`` when the key uses the user.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        self._defined: set[tuple[str, str, int, str]] = set()
        config = RateLimitSettings.load()
        if not config.quota:
            raise SettingsError(
                f"RateLimitMiddleware needs {PREFIX}QUOTA, the name of a defined quota"
            )

    def __call__(self, request: HttpRequest) -> HttpResponse:
        config = RateLimitSettings.load()
        assert config.quota is not None
        if not any(request.path.startswith(p) for p in config.paths) or (
            config.methods is not None and (request.method or "").upper() not in config.methods
        ):
            return self.get_response(request)
        _define(config, config.quota, config.rate, self._defined)
        result = check_request(request, config.quota, config.key, 1, config)
        return _finish(request, result, config, lambda: self.get_response(request), True)
