"""The ASGI rate-limit middleware, called as an ASGI server calls it, on a real PostgreSQL."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from pgcounters import AsyncQuotas, Quotas
from pgcounters.connection import Conn
from pgcounters.contrib.asgi import Message, RateLimitMiddleware, Receive, Scope, Send
from pgcounters.errors import ConfigurationError, InvalidBucketWidth, InvalidQuotaDefinition
from pgcounters.ratelimit import parse_rate

T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
Response = tuple[int, dict[str, str], bytes]


async def hello(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"x-app", b"yes")]})
    await send({"type": "http.response.body", "body": b"hello"})


async def call(
    app: Callable[[Scope, Receive, Send], Awaitable[None]],
    path: str = "/api/items",
    *,
    method: str = "GET",
    headers: dict[str, str] | None = None,
    client: str = "10.0.0.1",
    user: object = None,
) -> Response:
    """One HTTP request through ``app``, as an ASGI server makes it; the response."""
    scope: Scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
        "client": (client, 40000),
        "server": ("testserver", 80),
    }
    if user is not None:
        scope["user"] = user
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope, receive, send)
    start, *bodies = sent
    response_headers = {bytes(k).decode(): bytes(v).decode() for k, v in start["headers"]}
    return start["status"], response_headers, b"".join(m.get("body", b"") for m in bodies)


def run_with_pool(dsn: str, body: Callable[[AsyncQuotas], Awaitable[None]]) -> None:
    async def main() -> None:
        pool = AsyncConnectionPool(dsn, min_size=2, max_size=8, open=False)
        await pool.open()
        async with pool:
            await body(AsyncQuotas(pool, clock=lambda: T0))

    asyncio.run(main())


def test_a_rate_string_defines_the_quota_and_the_429_carries_the_headers(
    dsn: str, conn: Conn
) -> None:
    def limited(quotas: AsyncQuotas) -> RateLimitMiddleware:
        return RateLimitMiddleware(hello, quotas=quotas, quota="api", rate="3/minute", key="ip")

    async def body(quotas: AsyncQuotas) -> None:
        app = limited(quotas)
        responses = [await call(app) for _ in range(5)]
        assert [status for status, _, _ in responses] == [200, 200, 200, 429, 429]
        assert [h["ratelimit-remaining"] for _, h, _ in responses] == ["2", "1", "0", "0", "0"]
        assert {h["ratelimit-limit"] for _, h, _ in responses} == {"3"}
        # at 12:00:00 the minute's window ends in 60 s
        assert {h["ratelimit-reset"] for _, h, _ in responses} == {"60"}
        _, headers, text = responses[3]
        assert (headers["retry-after"], text) == ("60", b"Too Many Requests\n")
        assert "x-app" not in headers  # the application was not called
        assert responses[0][1]["x-app"] == "yes"
        assert "retry-after" not in responses[0][1]
        assert responses[0][2] == b"hello"
        # another client has its own budget
        assert (await call(app, client="10.0.0.2"))[0] == 200

    run_with_pool(dsn, body)
    quota = Quotas(conn).quota("api")
    assert (quota.default_limit, quota.window) == (3, "60s")
    status = Quotas(conn).status("api", "ip:10.0.0.1", at=T0)
    assert (status.used, status.attempts, status.rejected) == (3, 5, 2)


def test_concurrent_requests_never_get_one_call_over_the_limit(dsn: str, conn: Conn) -> None:
    statuses: list[int] = []

    async def body(quotas: AsyncQuotas) -> None:
        app = RateLimitMiddleware(
            hello, quotas=quotas, quota="api", rate="25/hour", key="header:X-Api-Key"
        )
        responses = await asyncio.gather(
            *(call(app, headers={"X-Api-Key": "k1"}) for _ in range(60))
        )
        statuses.extend(status for status, _, _ in responses)

    run_with_pool(dsn, body)
    assert statuses.count(200) == 25
    assert statuses.count(429) == 35
    status = Quotas(conn).status("api", "header:k1", at=T0)
    assert (status.used, status.attempts) == (25, 60)


class User:
    """A user as Starlette's AuthenticationMiddleware puts it in the scope."""

    def __init__(self, identity: str, authenticated: bool = True) -> None:
        self.identity = identity
        self.is_authenticated = authenticated


def test_keys_paths_and_methods(dsn: str, conn: Conn) -> None:
    async def body(quotas: AsyncQuotas) -> None:
        await quotas.define_quota("api", 1, window="hour")
        by_user = RateLimitMiddleware(hello, quotas=quotas, quota="api")
        assert (await call(by_user, user=User("ann")))[0] == 200
        assert (await call(by_user, user=User("ann")))[0] == 429
        # anonymous: the client address
        assert (await call(by_user, user=User("", authenticated=False)))[0] == 200
        assert (await call(by_user, user=User("", authenticated=False)))[0] == 429
        # a header key without its header falls back to the address (already used up)
        by_header = RateLimitMiddleware(hello, quotas=quotas, quota="api", key="header:X-Key")
        assert (await call(by_header))[0] == 429
        assert (await call(by_header, headers={"X-Key": "abc"}))[0] == 200
        # a callable key: None means not limited, and no headers
        skip = RateLimitMiddleware(hello, quotas=quotas, quota="api", key=lambda scope: None)
        status, headers, _ = await call(skip)
        assert status == 200
        assert "ratelimit-limit" not in headers
        # only POST under /api is limited; GETs and other paths go through untouched
        only = RateLimitMiddleware(
            hello,
            quotas=quotas,
            quota="api",
            key=lambda scope: "fixed",
            paths=["/api/"],
            methods=["post"],
            headers="both",
        )
        status, headers, _ = await call(only, method="POST")
        assert status == 200
        assert headers["x-ratelimit-reset"] == str(int((T0 + dt.timedelta(hours=1)).timestamp()))
        assert (await call(only, method="POST"))[0] == 429
        assert (await call(only, method="GET"))[0] == 200
        assert (await call(only, "/health", method="POST"))[0] == 200
        # block=False lets the refused request through, its decision in the scope's state
        seen: list[Any] = []

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            seen.append(scope["state"]["ratelimit"].allowed)
            await hello(scope, receive, send)

        soft = RateLimitMiddleware(app, quotas=quotas, quota="api", key="ip", block=False)
        assert (await call(soft, client="10.9.9.9"))[0] == 200
        assert (await call(soft, client="10.9.9.9"))[0] == 200
        assert seen == [True, False]

    run_with_pool(dsn, body)
    assert Quotas(conn).status("api", "user:ann", at=T0).attempts == 2


def test_a_proxy_header_gives_the_client_address(dsn: str, conn: Conn) -> None:
    async def body(quotas: AsyncQuotas) -> None:
        app = RateLimitMiddleware(
            hello, quotas=quotas, quota="api", rate="1/day", key="ip", ip_header="X-Real-IP"
        )
        assert (await call(app, headers={"X-Real-IP": "1.2.3.4, 5.6.7.8"}))[0] == 200
        assert (await call(app, headers={"X-Real-IP": "5.6.7.8"}))[0] == 429

    run_with_pool(dsn, body)
    assert Quotas(conn).status("api", "ip:5.6.7.8", at=T0).attempts == 2


def test_rate_strings() -> None:
    assert parse_rate("1000/day") == (1000, "day")
    assert parse_rate("10/minute") == (10, "minute")
    assert parse_rate(" 5 / 15m ") == (5, "15m")
    for bad in ("10", "x/day", "0/day", "-1/day", "10/fortnight", "10/day/2", "\uff11\uff10/day"):
        with pytest.raises(InvalidQuotaDefinition):
            parse_rate(bad)


def test_bad_configuration_is_refused_at_once(dsn: str) -> None:
    async def body(quotas: AsyncQuotas) -> None:
        with pytest.raises(ConfigurationError, match="invalid rate-limit key"):
            RateLimitMiddleware(hello, quotas=quotas, quota="api", key="cookie")
        with pytest.raises(ConfigurationError, match="headers must be one of"):
            RateLimitMiddleware(hello, quotas=quotas, quota="api", headers="all")  # type: ignore[arg-type]
        with pytest.raises(InvalidQuotaDefinition):
            RateLimitMiddleware(hello, quotas=quotas, quota="api", rate="often")
        aconn = await psycopg.AsyncConnection.connect(dsn)
        async with aconn:
            with pytest.raises(ConfigurationError, match="AsyncQuotas"):
                RateLimitMiddleware(hello, quotas=aconn, quota="api")  # type: ignore[arg-type]

    run_with_pool(dsn, body)


def test_other_scopes_pass_through(dsn: str) -> None:
    async def body(quotas: AsyncQuotas) -> None:
        seen: list[str] = []

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            seen.append(scope["type"])

        limited = RateLimitMiddleware(app, quotas=quotas, quota="never.defined")

        async def receive() -> Message:
            return {"type": "lifespan.startup"}

        async def send(message: Message) -> None:
            raise AssertionError("nothing is sent for the middleware")

        await limited({"type": "lifespan"}, receive, send)
        assert seen == ["lifespan"]

    run_with_pool(dsn, body)


def test_a_sliding_rate(dsn: str, conn: Conn) -> None:
    """``sliding=True`` (or ``"2/sliding:minute"``): a call of 12:00:50 still counts at
    12:01:10, where a fixed minute would have started afresh."""
    instants = [T0 + dt.timedelta(seconds=50)]

    async def main() -> None:
        async with AsyncConnectionPool(dsn, open=False) as pool:
            quotas = AsyncQuotas(pool, clock=lambda: instants[-1])
            app = RateLimitMiddleware(
                hello, quotas=quotas, quota="api", rate="2/minute", sliding=True, key="ip"
            )
            same = RateLimitMiddleware(hello, quotas=quotas, quota="api2", rate="2/sliding:minute")
            for limited in (app, same):
                assert [(await call(limited))[0] for _ in range(2)] == [200, 200]
            instants.append(T0 + dt.timedelta(seconds=70))
            for limited in (app, same):
                status, headers, _ = await call(limited)
                assert status == 429
                # the calls of second 50 leave the window when second 111 begins
                assert headers["retry-after"] == "41"
            instants.append(T0 + dt.timedelta(seconds=111))
            assert (await call(app))[0] == 200

    asyncio.run(main())
    assert Quotas(conn).quota("api").window == "sliding:60s"
    assert Quotas(conn).quota("api2").window == "sliding:60s"
    with pytest.raises(ConfigurationError, match="goes with a rate"):
        RateLimitMiddleware(hello, quotas=AsyncQuotas.__new__(AsyncQuotas), quota="x", sliding=True)


def test_a_rate_with_a_bucket_width(dsn: str, conn: Conn) -> None:
    """``"2/sliding:minute by 15s"``, or ``"2/minute by 15s"`` with ``sliding=True``: the
    quota is defined with buckets of 15 s; a bad width is refused when the middleware is
    built."""

    async def body(quotas: AsyncQuotas) -> None:
        app = RateLimitMiddleware(hello, quotas=quotas, quota="api", rate="2/sliding:minute by 15s")
        same = RateLimitMiddleware(
            hello, quotas=quotas, quota="api2", rate="2/minute by 15s", sliding=True
        )
        for limited in (app, same):
            assert [(await call(limited))[0] for _ in range(3)] == [200, 200, 429]
        for bad, message in (
            ("2/sliding:minute by 7s", "do not divide"),
            ("2/minute by 0s", "positive duration"),
        ):
            with pytest.raises(InvalidBucketWidth, match=message):
                RateLimitMiddleware(hello, quotas=quotas, quota="x", rate=bad, sliding=True)

    run_with_pool(dsn, body)
    for name in ("api", "api2"):
        quota = Quotas(conn).quota(name)
        assert (quota.window, quota.bucket_seconds) == ("sliding:60s", 15)
