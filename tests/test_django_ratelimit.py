"""The Django rate limiting on quotas: decorator (function and class-based views), middleware."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import AnonymousUser, User
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.test import Client, RequestFactory
from django.urls import URLPattern, path
from django.utils.decorators import method_decorator
from django.views import View
from pytest_django.fixtures import Settings as SettingsWrapper

from pgcounters import InvalidBucketWidth, Quotas, UnknownQuota
from pgcounters.contrib.django import ratelimit_headers
from pgcounters.contrib.django.db import psycopg_connection
from pgcounters.contrib.django.ratelimit import RateLimitMiddleware, ratelimit
from pgcounters.quotas import CallResult
from support import set_clock

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def quotas() -> Iterator[Quotas]:
    """The quotas of the test database; Django's flush between tests does not reach them."""
    with psycopg_connection() as conn:
        quotas = Quotas(conn)
        for quota in quotas.quotas():
            quotas.drop_quota(quota.name)
        yield quotas


@pytest.fixture
def rf() -> RequestFactory:
    return RequestFactory()


def ok(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
    return HttpResponse("ok")


def request(
    rf: RequestFactory, path: str = "/x", method: str = "get", user: Any = None, **meta: Any
) -> HttpRequest:
    req: HttpRequest = getattr(rf, method)(path, **meta)
    req.user = user or AnonymousUser()
    return req


def subjects(quotas: Quotas, quota: str) -> dict[str, int]:
    return {r.subject: r.attempts for r in quotas.report(quota)}


def custom_429(request: HttpRequest, result: CallResult) -> HttpResponse:
    return HttpResponse(f"slow down, {result.used}/{result.limit}", status=429)


def test_function_view_gets_429_with_retry_after_and_headers(
    quotas: Quotas, rf: RequestFactory
) -> None:
    quotas.define_quota("api", 2, window="hour")
    view = ratelimit("api", key="ip")(ok)
    responses = [view(request(rf)) for _ in range(3)]
    assert [r.status_code for r in responses] == [200, 200, 429]
    assert [r["RateLimit-Limit"] for r in responses] == ["2", "2", "2"]
    assert [r["RateLimit-Remaining"] for r in responses] == ["1", "0", "0"]
    refused = responses[2]
    assert refused.content == b"Too Many Requests\n"
    reset = int(refused["RateLimit-Reset"])
    assert 0 <= reset <= 3600
    assert int(refused["Retry-After"]) == max(reset, 1)
    assert "Retry-After" not in responses[0]
    assert subjects(quotas, "api") == {"ip:127.0.0.1": 3}


def test_keys_user_ip_header_and_callable(quotas: Quotas, rf: RequestFactory) -> None:
    quotas.define_quota("api", 1)
    alice = User.objects.create(username="alice")
    bob = User.objects.create(username="bob")
    by_user = ratelimit("api", key="user")(ok)
    assert by_user(request(rf, user=alice)).status_code == 200
    assert by_user(request(rf, user=bob)).status_code == 200  # same address, other budget
    assert by_user(request(rf, user=alice)).status_code == 429
    assert by_user(request(rf)).status_code == 200  # anonymous: by address

    by_ip = ratelimit("api", key="ip")(ok)
    assert by_ip(request(rf, user=alice, REMOTE_ADDR="10.0.0.9")).status_code == 200
    assert by_ip(request(rf, user=bob, REMOTE_ADDR="10.0.0.9")).status_code == 429

    by_header = ratelimit("api", key="header:X-Api-Key")(ok)
    assert by_header(request(rf, HTTP_X_API_KEY="k1")).status_code == 200
    assert by_header(request(rf, HTTP_X_API_KEY="k1")).status_code == 429
    # without the header the client is limited by its address, not let through
    assert by_header(request(rf, REMOTE_ADDR="10.0.0.7")).status_code == 200
    assert by_header(request(rf, REMOTE_ADDR="10.0.0.7")).status_code == 429

    def tenant(req: HttpRequest) -> str | None:
        return req.GET.get("tenant")

    by_tenant = ratelimit("api", key=tenant)(ok)
    assert by_tenant(request(rf, "/x?tenant=t1")).status_code == 200
    assert by_tenant(request(rf, "/x?tenant=t1")).status_code == 429
    unlimited = by_tenant(request(rf, "/x"))  # None: this request is not limited
    assert unlimited.status_code == 200
    assert "RateLimit-Limit" not in unlimited

    assert subjects(quotas, "api") == {
        f"user:{alice.pk}": 2,
        f"user:{bob.pk}": 1,
        "ip:127.0.0.1": 1,
        "ip:10.0.0.9": 2,
        "header:k1": 2,
        "ip:10.0.0.7": 2,
        "t1": 2,
    }


def test_class_based_views(quotas: Quotas, rf: RequestFactory) -> None:
    quotas.define_quota("api", 1)

    @ratelimit("api", key="ip")
    class Whole(View):
        def get(self, request: HttpRequest) -> HttpResponse:
            return HttpResponse("get")

        def post(self, request: HttpRequest) -> HttpResponse:
            return HttpResponse("post")

    class OnlyPost(View):
        def get(self, request: HttpRequest) -> HttpResponse:
            return HttpResponse("get")

        @method_decorator(ratelimit("api", key="ip"))
        def post(self, request: HttpRequest) -> HttpResponse:
            return HttpResponse("post")

    whole = Whole.as_view()
    assert whole(request(rf, REMOTE_ADDR="10.0.0.1")).status_code == 200
    assert whole(request(rf, method="post", REMOTE_ADDR="10.0.0.1")).status_code == 429
    only_post = OnlyPost.as_view()
    for _ in range(3):
        assert only_post(request(rf, REMOTE_ADDR="10.0.0.2")).status_code == 200
    assert only_post(request(rf, method="post", REMOTE_ADDR="10.0.0.2")).status_code == 200
    assert only_post(request(rf, method="post", REMOTE_ADDR="10.0.0.2")).status_code == 429
    assert subjects(quotas, "api") == {"ip:10.0.0.1": 2, "ip:10.0.0.2": 2}


def test_methods_cost_and_block_false(quotas: Quotas, rf: RequestFactory) -> None:
    quotas.define_quota("api", 10)
    posts_only = ratelimit("api", key="ip", methods=["post"], cost=4)(ok)
    for _ in range(5):
        assert posts_only(request(rf)).status_code == 200  # GET: not counted
    assert [posts_only(request(rf, method="post")).status_code for _ in range(3)] == [
        200,
        200,
        429,
    ]
    seen: list[CallResult | None] = []

    def soft(req: HttpRequest) -> HttpResponse:
        seen.append(req.ratelimit)  # type: ignore[attr-defined]
        return HttpResponse("soft")

    weighted = ratelimit("api", key="ip", cost=lambda req: int(req.GET.get("n", "1")), block=False)
    response = weighted(soft)(request(rf, "/x?n=3"))
    assert (response.status_code, response["RateLimit-Remaining"]) == (200, "2")
    assert seen[-1] is not None
    assert (seen[-1].allowed, seen[-1].used) == (False, 8)
    assert subjects(quotas, "api") == {"ip:127.0.0.1": 4}


def test_header_styles_and_custom_response(
    quotas: Quotas, rf: RequestFactory, settings: SettingsWrapper
) -> None:
    quotas.define_quota("api", 1)
    view = ratelimit("api", key="ip")(ok)
    settings.PGCOUNTERS_RATELIMIT_HEADERS = "x-ratelimit"
    first = view(request(rf, REMOTE_ADDR="10.0.0.1"))
    assert "RateLimit-Limit" not in first
    assert (first["X-RateLimit-Limit"], first["X-RateLimit-Remaining"]) == ("1", "0")
    status = quotas.status("api", "ip:10.0.0.1")
    assert int(first["X-RateLimit-Reset"]) == math.ceil(status.window_end.timestamp())
    settings.PGCOUNTERS_RATELIMIT_HEADERS = "both"
    settings.PGCOUNTERS_RATELIMIT_RESPONSE = "test_django_ratelimit.custom_429"
    second = view(request(rf, REMOTE_ADDR="10.0.0.1"))
    assert (second.status_code, second.content) == (429, b"slow down, 1/1")
    assert {"RateLimit-Reset", "X-RateLimit-Reset", "Retry-After"} <= set(second.headers)
    settings.PGCOUNTERS_RATELIMIT_HEADERS = "none"
    third = view(request(rf, REMOTE_ADDR="10.0.0.1"))
    assert "RateLimit-Limit" not in third
    assert "X-RateLimit-Limit" not in third
    assert "Retry-After" in third
    settings.PGCOUNTERS_RATELIMIT_HEADERS = "draft-42"
    with pytest.raises(ImproperlyConfigured, match="HEADERS"):
        view(request(rf))


def test_middleware_limits_configured_paths(
    quotas: Quotas, rf: RequestFactory, settings: SettingsWrapper
) -> None:
    quotas.define_quota("site", 2, log=True)
    with pytest.raises(ImproperlyConfigured, match="PGCOUNTERS_RATELIMIT_QUOTA"):
        RateLimitMiddleware(ok)
    settings.PGCOUNTERS_RATELIMIT_QUOTA = "site"
    settings.PGCOUNTERS_RATELIMIT_PATHS = ["/api/"]
    settings.PGCOUNTERS_RATELIMIT_IP_META = "HTTP_X_FORWARDED_FOR"
    settings.PGCOUNTERS_RATELIMIT_LOG_DETAILS = True
    settings.PGCOUNTERS_RATELIMIT_SYNCHRONOUS_COMMIT = False
    middleware = RateLimitMiddleware(ok)
    proxied = {"HTTP_X_FORWARDED_FOR": "203.0.113.5, 198.51.100.7"}
    codes = [middleware(request(rf, "/api/items", **proxied)).status_code for _ in range(3)]
    assert codes == [200, 200, 429]
    assert middleware(request(rf, "/home", **proxied)).status_code == 200
    assert subjects(quotas, "site") == {"ip:198.51.100.7": 3}
    logged = quotas.logged_calls("site")
    assert [c.allowed for c in logged] == [False, True, True]
    assert logged[0].details == {
        "method": "GET",
        "path": "/api/items",
        "ip": "198.51.100.7",
        "user_agent": None,
    }
    # a request that did not come through the proxy (no X-Forwarded-For) is limited by its
    # peer's address: leaving the entry out must not escape the limit
    direct = [middleware(request(rf, "/api/items")).status_code for _ in range(3)]
    assert direct == [200, 200, 429]
    assert subjects(quotas, "site") == {"ip:198.51.100.7": 3, "ip:127.0.0.1": 3}
    settings.PGCOUNTERS_RATELIMIT_KEY = "nonsense"
    with pytest.raises(ImproperlyConfigured, match="invalid rate-limit key"):
        middleware(request(rf, "/api/items"))


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("IP_META", None, "IP_META must name the request.META entry"),
        ("IP_META", "", "IP_META must name the request.META entry"),
        ("SYNCHRONOUS_COMMIT", "no", "SYNCHRONOUS_COMMIT must be True or False, got 'no'"),
        ("LOG_DETAILS", 1, "LOG_DETAILS must be True or False, got 1"),
        ("SLIDING", "yes", "PGCOUNTERS_RATELIMIT_SLIDING must be True or False, got 'yes'"),
        ("RESPONSE", "no.such.func", "PGCOUNTERS_RATELIMIT_RESPONSE: No module named 'no'"),
    ],
)
def test_a_wrong_middleware_setting_is_a_settings_error(
    quotas: Quotas, settings: SettingsWrapper, name: str, value: object, message: str
) -> None:
    settings.PGCOUNTERS_RATELIMIT_QUOTA = "site"
    settings.PGCOUNTERS_RATELIMIT_RATE = "3/minute"
    setattr(settings, f"PGCOUNTERS_RATELIMIT_{name}", value)
    with pytest.raises(ImproperlyConfigured, match=message):
        RateLimitMiddleware(ok)
    assert quotas.quotas() == []


def test_unknown_quota_and_bad_key_are_errors(quotas: Quotas, rf: RequestFactory) -> None:
    with pytest.raises(UnknownQuota):
        ratelimit("missing", key="ip")(ok)(request(rf))
    with pytest.raises(ImproperlyConfigured):
        ratelimit("api", key="header:")
    assert quotas.quotas() == []


def test_retry_after_is_the_time_to_the_window_end(quotas: Quotas, rf: RequestFactory) -> None:
    """At chosen instants (the database's quota clock): 3.5 s before the minute ends, then
    0.2 s before (Retry-After is never 0), then in the next minute."""
    quotas.define_quota("api", 1, window="minute")
    view = ratelimit("api", key="ip")(ok)
    try:
        set_clock(quotas.conn, dt.datetime(2026, 3, 10, 12, 34, 56, 500000, tzinfo=dt.UTC))
        assert view(request(rf)).status_code == 200
        refused = view(request(rf))
        assert refused.status_code == 429
        assert refused["Retry-After"] == str(math.ceil(3.5))
        status = quotas.status("api", "ip:127.0.0.1")
        assert status.window_end == dt.datetime(2026, 3, 10, 12, 35, tzinfo=dt.UTC)
        set_clock(quotas.conn, dt.datetime(2026, 3, 10, 12, 34, 59, 800000, tzinfo=dt.UTC))
        assert view(request(rf))["Retry-After"] == "1"
        set_clock(quotas.conn, dt.datetime(2026, 3, 10, 12, 35, tzinfo=dt.UTC))
        assert view(request(rf)).status_code == 200
    finally:
        set_clock(quotas.conn, None)


def test_manage_py_pgcounters_quota(quotas: Quotas, capsys: pytest.CaptureFixture[str]) -> None:
    """The quota verbs come with the shared parser: ``manage.py pgcounters quota ...``."""
    call_command("pgcounters", "quota", "define", "api", "--limit", "1", "--window", "hour")
    assert capsys.readouterr().out == "api: window 3600s, default limit 1\n"
    call_command("pgcounters", "quota", "call", "api", "user:1")
    assert capsys.readouterr().out.startswith("allowed: used 1/1")
    with pytest.raises(CommandError) as refused:
        call_command("pgcounters", "quota", "call", "api", "user:1")
    assert refused.value.returncode == 4
    assert quotas.status("api", "user:1").rejected == 1


def test_a_sliding_rate_on_the_decorator_and_the_middleware(
    quotas: Quotas, rf: RequestFactory, settings: SettingsWrapper
) -> None:
    """``rate="2/minute", sliding=True`` defines a sliding quota on the first request: a call
    of 12:34:50 still counts at 12:35:10 (a fixed minute would have started afresh)."""
    view = ratelimit("api", rate="2/minute", sliding=True, key="ip")(ok)
    try:
        set_clock(quotas.conn, dt.datetime(2026, 3, 10, 12, 34, 50, tzinfo=dt.UTC))
        assert [view(request(rf)).status_code for _ in range(2)] == [200, 200]
        set_clock(quotas.conn, dt.datetime(2026, 3, 10, 12, 35, 10, tzinfo=dt.UTC))
        refused = view(request(rf))
        assert refused.status_code == 429
        # the calls of 12:34:50 leave the window when second 12:35:51 begins
        assert refused["Retry-After"] == "41"
        set_clock(quotas.conn, dt.datetime(2026, 3, 10, 12, 35, 51, tzinfo=dt.UTC))
        assert view(request(rf)).status_code == 200
    finally:
        set_clock(quotas.conn, None)
    quota = quotas.quota("api")
    assert (quota.window, quota.default_limit, quota.bucket_seconds) == ("sliding:60s", 2, 1)

    settings.PGCOUNTERS_RATELIMIT_QUOTA = "site"
    settings.PGCOUNTERS_RATELIMIT_RATE = "3/sliding:hour"
    middleware = RateLimitMiddleware(ok)
    codes = [middleware(request(rf, "/a")).status_code for _ in range(4)]
    assert codes == [200, 200, 200, 429]
    assert quotas.quota("site").window == "sliding:3600s"
    settings.PGCOUNTERS_RATELIMIT_RATE = "3/fortnight"
    with pytest.raises(ImproperlyConfigured, match="PGCOUNTERS_RATELIMIT_RATE"):
        middleware(request(rf, "/a"))
    with pytest.raises(ImproperlyConfigured, match="goes with a rate"):
        ratelimit("api", sliding=True)


def test_a_rate_with_a_bucket_width(
    quotas: Quotas, rf: RequestFactory, settings: SettingsWrapper
) -> None:
    """``"2/sliding:minute by 10s"`` (or ``"2/minute by 10s"`` with ``sliding=True``) on the
    decorator and in the middleware's settings: the quota's buckets are that wide."""
    view = ratelimit("fine", rate="2/sliding:minute by 10s", key="ip")(ok)
    assert [view(request(rf)).status_code for _ in range(3)] == [200, 200, 429]
    assert quotas.quota("fine").bucket_seconds == 10
    other = ratelimit("fine2", rate="2/minute by 15s", sliding=True, key="ip")(ok)
    assert other(request(rf)).status_code == 200
    assert (quotas.quota("fine2").window, quotas.quota("fine2").bucket_seconds) == (
        "sliding:60s",
        15,
    )
    with pytest.raises(InvalidBucketWidth, match="do not divide"):
        ratelimit("bad", rate="2/sliding:minute by 7s")
    with pytest.raises(InvalidBucketWidth, match="only a sliding window"):
        ratelimit("bad", rate="2/minute by 10s")

    settings.PGCOUNTERS_RATELIMIT_QUOTA = "site"
    settings.PGCOUNTERS_RATELIMIT_RATE = "3/hour by 10m"
    settings.PGCOUNTERS_RATELIMIT_SLIDING = True
    middleware = RateLimitMiddleware(ok)
    assert [middleware(request(rf, "/a")).status_code for _ in range(4)] == [200, 200, 200, 429]
    assert quotas.quota("site").bucket_seconds == 600
    settings.PGCOUNTERS_RATELIMIT_RATE = "3/hour by 0m"
    with pytest.raises(ImproperlyConfigured, match="RATE: invalid bucket width '0m'"):
        RateLimitMiddleware(ok)
    with pytest.raises(UnknownQuota):
        quotas.quota("bad")


# -- which response carries which rate-limit headers, through Django's whole request handler


def busy(request: HttpRequest) -> HttpResponse:
    """A view's own refusal (a queue of its own is full, say)."""
    return HttpResponse("busy", status=429, headers={"Retry-After": "7"})


def own_headers(request: HttpRequest) -> HttpResponse:
    """A view that describes a limit of its own."""
    return HttpResponse(
        "own",
        headers={"RateLimit-Limit": "50", "RateLimit-Remaining": "49", "RateLimit-Reset": "9"},
    )


def by_decision(request: HttpRequest) -> HttpResponse:
    """``block=False``: the view refuses by the decision itself, with the headers it adds."""
    result: CallResult = request.ratelimit  # type: ignore[attr-defined]
    if result.allowed:
        return HttpResponse("ok")
    return HttpResponse("later", status=429, headers=ratelimit_headers(result))


def _urls() -> list[URLPattern]:
    """The URLs, their views decorated afresh: a decorator defines its quota once."""
    return [
        path("api/items", ok),
        path("api/busy", busy),
        path("api/own", own_headers),
        path("api/search", ratelimit("search", rate="2/minute", key="ip")(ok)),
        path("busy", ratelimit("solo", rate="10/minute", key="ip")(busy)),
        path("soft", ratelimit("soft", rate="1/minute", key="ip", block=False)(by_decision)),
    ]


urlpatterns = _urls()

RATE_LIMIT_HEADERS = {
    f"{prefix}RateLimit-{field}"
    for prefix in ("", "X-")
    for field in ("Limit", "Remaining", "Reset")
}
NOON = dt.datetime(2026, 3, 10, 12, tzinfo=dt.UTC)


def rate_limit_headers_of(response: HttpResponseBase) -> dict[str, str]:
    return {name: response[name] for name in sorted(RATE_LIMIT_HEADERS) if name in response}


@pytest.fixture
def client(quotas: Quotas, settings: SettingsWrapper) -> Iterator[Client]:
    """A test client through the project's middleware and the middleware limiting ``/api/``
    to 4 calls a day, the URLs above, at noon by the quotas' clock."""
    urlpatterns[:] = _urls()
    settings.ROOT_URLCONF = __name__
    settings.MIDDLEWARE = [
        *settings.MIDDLEWARE,
        "pgcounters.contrib.django.ratelimit.RateLimitMiddleware",
    ]
    settings.PGCOUNTERS_RATELIMIT_QUOTA = "site"
    settings.PGCOUNTERS_RATELIMIT_RATE = "4/day"
    settings.PGCOUNTERS_RATELIMIT_KEY = "ip"
    settings.PGCOUNTERS_RATELIMIT_PATHS = ["/api/"]
    set_clock(quotas.conn, NOON)
    try:
        yield Client()
    finally:
        set_clock(quotas.conn, None)


def test_a_views_own_429_passes_as_the_view_made_it(quotas: Quotas, client: Client) -> None:
    """The view's refusal, not the limit's: under the middleware, under the decorator, and a
    ``block=False`` view's 429 carries the headers the view put on it and no others."""
    under_middleware = client.get("/api/busy")
    under_decorator = client.get("/busy")
    for response in (under_middleware, under_decorator):
        assert (response.status_code, response.content) == (429, b"busy")
        assert response["Retry-After"] == "7"
        assert rate_limit_headers_of(response) == {}
    allowed, refused = client.get("/soft"), client.get("/soft")
    assert (allowed.status_code, allowed["RateLimit-Remaining"]) == (200, "0")
    assert (refused.status_code, refused.content) == (429, b"later")
    assert "Retry-After" not in refused
    assert rate_limit_headers_of(refused) == {
        "RateLimit-Limit": "1",
        "RateLimit-Remaining": "0",
        "RateLimit-Reset": "60",
    }
    assert subjects(quotas, "site") == {"ip:127.0.0.1": 1}
    assert subjects(quotas, "solo") == {"ip:127.0.0.1": 1}
    assert subjects(quotas, "soft") == {"ip:127.0.0.1": 2}


def test_a_response_with_rate_limit_headers_of_its_own_keeps_them_alone(
    quotas: Quotas, client: Client, settings: SettingsWrapper
) -> None:
    """A view's own headers, and a decorated view's (a limit nearer the view) under the
    middleware: kept as they are, never overwritten by the middleware's."""
    own = client.get("/api/own")
    assert (own.status_code, own.content) == (200, b"own")
    assert rate_limit_headers_of(own) == {
        "RateLimit-Limit": "50",
        "RateLimit-Remaining": "49",
        "RateLimit-Reset": "9",
    }
    searched = client.get("/api/search")
    assert rate_limit_headers_of(searched) == {
        "RateLimit-Limit": "2",
        "RateLimit-Remaining": "1",
        "RateLimit-Reset": "60",
    }
    # headers of the other style are the view's own too: none is added beside them
    settings.PGCOUNTERS_RATELIMIT_HEADERS = "both"
    own_both = client.get("/api/own")
    assert rate_limit_headers_of(own_both) == rate_limit_headers_of(own)
    # a plain response gets the middleware's, of the call it counted (the 4th of 4)
    items = client.get("/api/items")
    assert rate_limit_headers_of(items) == {
        "RateLimit-Limit": "4",
        "RateLimit-Remaining": "0",
        "RateLimit-Reset": "43200",
        "X-RateLimit-Limit": "4",
        "X-RateLimit-Remaining": "0",
        "X-RateLimit-Reset": str(int((NOON + dt.timedelta(hours=12)).timestamp())),
    }
    assert subjects(quotas, "site") == {"ip:127.0.0.1": 4}
    assert subjects(quotas, "search") == {"ip:127.0.0.1": 1}


def test_each_limiters_own_429_carries_its_own_headers(quotas: Quotas, client: Client) -> None:
    """The decorator's refusal under the middleware carries the decorator's headers, not the
    middleware's; the middleware's refusal carries its own; neither reaches the view."""
    codes = [client.get("/api/search").status_code for _ in range(3)]
    assert codes == [200, 200, 429]
    by_decorator = client.get("/api/search")  # the 4th call of the day for the middleware
    assert (by_decorator.status_code, by_decorator.content) == (429, b"Too Many Requests\n")
    assert by_decorator["Retry-After"] == "60"
    assert rate_limit_headers_of(by_decorator) == {
        "RateLimit-Limit": "2",
        "RateLimit-Remaining": "0",
        "RateLimit-Reset": "60",
    }
    by_middleware = client.get("/api/search")  # the 5th: refused before the decorator
    assert (by_middleware.status_code, by_middleware.content) == (429, b"Too Many Requests\n")
    assert by_middleware["Retry-After"] == "43200"
    assert rate_limit_headers_of(by_middleware) == {
        "RateLimit-Limit": "4",
        "RateLimit-Remaining": "0",
        "RateLimit-Reset": "43200",
    }
    status = quotas.status("site", "ip:127.0.0.1")
    assert (status.used, status.attempts, status.rejected) == (4, 5, 1)
    search = quotas.status("search", "ip:127.0.0.1")
    assert (search.used, search.attempts, search.rejected) == (2, 4, 2)
