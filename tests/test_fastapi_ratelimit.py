"""The rate-limit dependency in real FastAPI and Starlette apps, on a real PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import gc
import socket
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated

import httpx
import psycopg
import pytest
import uvicorn
from fastapi import Depends, FastAPI, HTTPException
from fastapi.responses import JSONResponse
from psycopg_pool import AsyncConnectionPool
from starlette.applications import Starlette
from starlette.authentication import (
    AuthCredentials,
    AuthenticationBackend,
    BaseUser,
    SimpleUser,
)
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import HTTPConnection, Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

import pgcounters.contrib.starlette as starlette_contrib
from pgcounters import AsyncQuotas, Quotas, install
from pgcounters.connection import Conn
from pgcounters.contrib.asgi import RateLimitMiddleware
from pgcounters.contrib.starlette import RateLimit, quota_name
from pgcounters.errors import ConfigurationError, InvalidBucketWidth, InvalidQuotaDefinition
from pgcounters.quotas import CallResult

T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)


class HeaderUser(AuthenticationBackend):
    """Authenticates ``X-User: <name>`` (for the tests of the ``user`` key)."""

    async def authenticate(self, conn: HTTPConnection) -> tuple[AuthCredentials, BaseUser] | None:
        name = conn.headers.get("X-User")
        return (AuthCredentials(["authenticated"]), SimpleUser(name)) if name else None


def fastapi_app() -> FastAPI:
    app = FastAPI(middleware=[Middleware(AuthenticationMiddleware, backend=HeaderUser())])
    by_ip = RateLimit("3/minute", key="ip")

    @app.get("/items", dependencies=[Depends(by_ip)])
    async def items() -> dict[str, str]:
        return {"items": "all"}

    @app.get("/search")
    async def search(
        limit: Annotated[CallResult | None, Depends(RateLimit("2/hour", quota="search"))],
    ) -> dict[str, int]:
        assert limit is not None
        return {"remaining": limit.remaining}

    @app.get("/keyed", dependencies=[Depends(RateLimit("2/hour", key="header:X-Api-Key"))])
    async def keyed() -> str:
        return "ok"

    def tenant(request: Request) -> str | None:
        return request.path_params.get("tenant")

    @app.post(
        "/t/{tenant}",
        dependencies=[Depends(RateLimit("5/day", key=tenant, cost=2, methods=["POST"]))],
    )
    async def per_tenant(tenant: str) -> str:
        return tenant

    @app.get("/soft", dependencies=[Depends(RateLimit("1/hour", key="ip", block=False))])
    async def soft(request: Request) -> dict[str, bool]:
        return {"allowed": request.state.ratelimit.allowed}

    @app.get(
        "/sliding",
        dependencies=[Depends(RateLimit("25/hour", key="ip", sliding=True, headers="both"))],
    )
    async def sliding() -> str:
        return "ok"

    return app


def run_app(dsn: str, app: FastAPI, body: Callable[[httpx.AsyncClient], Awaitable[None]]) -> None:
    """``body`` with a client of ``app``, whose quotas are on a pool of the test database."""

    async def main() -> None:
        async with AsyncConnectionPool(dsn, min_size=2, max_size=8, open=False) as pool:
            app.state.quotas = AsyncQuotas(pool, clock=lambda: T0)
            transport = httpx.ASGITransport(app=app, client=("10.0.0.1", 40000))
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                await body(client)

    asyncio.run(main())


def test_429_with_retry_after_and_the_headers(dsn: str, conn: Conn) -> None:
    async def body(client: httpx.AsyncClient) -> None:
        responses = [await client.get("/items") for _ in range(5)]
        assert [r.status_code for r in responses] == [200, 200, 200, 429, 429]
        assert [r.headers["RateLimit-Remaining"] for r in responses] == ["2", "1", "0", "0", "0"]
        assert {r.headers["RateLimit-Limit"] for r in responses} == {"3"}
        assert {r.headers["RateLimit-Reset"] for r in responses} == {"60"}
        assert responses[0].json() == {"items": "all"}
        assert "Retry-After" not in responses[0].headers
        assert responses[3].headers["Retry-After"] == "60"
        assert responses[3].json() == {"detail": "Too Many Requests"}
        # the decision reaches the endpoint too
        searched = [await client.get("/search") for _ in range(3)]
        assert [r.status_code for r in searched] == [200, 200, 429]
        assert searched[0].json() == {"remaining": 1}

    run_app(dsn, fastapi_app(), body)
    quotas = Quotas(conn)
    assert quota_name("3/minute") == "ratelimit:3/60s"
    assert (quotas.quota("ratelimit:3/60s").default_limit, quotas.quota("search").window) == (
        3,
        "3600s",
    )
    status = quotas.status("ratelimit:3/60s", "ip:10.0.0.1", at=T0)
    assert (status.used, status.attempts, status.rejected) == (3, 5, 2)


def test_keys_by_user_header_and_callable(dsn: str, conn: Conn) -> None:
    async def body(client: httpx.AsyncClient) -> None:
        # the user's budget, then the address's (user_or_ip is the default key)
        for who in ("ann", "bob"):
            codes = [(await client.get("/search", headers={"X-User": who})).status_code]
            codes += [(await client.get("/search", headers={"X-User": who})).status_code]
            codes += [(await client.get("/search", headers={"X-User": who})).status_code]
            assert codes == [200, 200, 429]
        assert (await client.get("/search")).status_code == 200
        # by header, falling back to the address without it
        keyed = [
            (await client.get("/keyed", headers={"X-Api-Key": k})).status_code
            for k in ("k1", "k1", "k1", "k2")
        ]
        assert keyed == [200, 200, 429, 200]
        assert (await client.get("/keyed")).status_code == 200
        # by a callable of the request, cost 2 against 5 a day, POST only
        posts = [(await client.post("/t/acme")).status_code for _ in range(3)]
        assert posts == [200, 200, 429]
        assert (await client.post("/t/other")).status_code == 200
        assert (await client.get("/t/acme")).status_code == 405  # not a limited method

    run_app(dsn, fastapi_app(), body)
    report = {(r.subject, r.used, r.rejected) for r in Quotas(conn).report("search")}
    assert report == {("user:ann", 2, 1), ("user:bob", 2, 1), ("ip:10.0.0.1", 1, 0)}
    keyed = {(r.subject, r.attempts) for r in Quotas(conn).report("ratelimit:2/3600s")}
    assert keyed == {("header:k1", 3), ("header:k2", 1), ("ip:10.0.0.1", 1)}
    tenants = {(r.subject, r.used) for r in Quotas(conn).report("ratelimit:5/day")}
    assert tenants == {("acme", 4), ("other", 2)}


def test_block_false_lets_the_endpoint_decide(dsn: str) -> None:
    async def body(client: httpx.AsyncClient) -> None:
        answers = [(await client.get("/soft")).json() for _ in range(2)]
        assert answers == [{"allowed": True}, {"allowed": False}]

    run_app(dsn, fastapi_app(), body)


@pytest.mark.parametrize("path", ["/sliding", "/keyed"])
def test_concurrent_requests_never_get_one_call_over_the_limit(
    dsn: str, conn: Conn, path: str
) -> None:
    statuses: list[int] = []

    async def body(client: httpx.AsyncClient) -> None:
        responses = await asyncio.gather(
            *(client.get(path, headers={"X-Api-Key": "k"}) for _ in range(60))
        )
        statuses.extend(r.status_code for r in responses)
        if path == "/sliding":
            remaining = sorted(int(r.headers["X-RateLimit-Remaining"]) for r in responses)
            assert remaining[-25:] == list(range(25))  # each unit handed out once

    run_app(dsn, fastapi_app(), body)
    limit = 25 if path == "/sliding" else 2
    assert statuses.count(200) == limit
    assert statuses.count(429) == 60 - limit
    name = "ratelimit:25/sliding:3600s" if path == "/sliding" else "ratelimit:2/3600s"
    subject = "ip:10.0.0.1" if path == "/sliding" else "header:k"
    status = Quotas(conn).status(name, subject, at=T0)
    assert (status.used, status.attempts) == (limit, 60)


def test_a_starlette_app_with_its_lifespan(dsn: str, conn: Conn) -> None:
    """A Starlette app whose pool is made in its lifespan; the endpoint calls ``check``."""
    limit = RateLimit("2/minute", key="header:X-Api-Key", quota="starlette")

    async def endpoint(request: Request) -> PlainTextResponse:
        result = await limit.check(request)
        assert result is not None
        return PlainTextResponse("ok", headers=limit.headers_of(result))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with AsyncConnectionPool(dsn, open=False) as pool:
            app.state.quotas = AsyncQuotas(pool)
            yield

    app = Starlette(routes=[Route("/", endpoint)], lifespan=lifespan)
    responses: list[httpx.Response] = []

    async def main() -> None:
        transport = httpx.ASGITransport(app=app)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=transport, base_url="http://test") as client,
        ):
            for _ in range(3):
                responses.append(await client.get("/", headers={"X-Api-Key": "k"}))

    asyncio.run(main())
    assert [r.status_code for r in responses] == [200, 200, 429]
    assert responses[1].headers["RateLimit-Remaining"] == "0"
    assert responses[2].text == "Too Many Requests"
    assert int(responses[2].headers["Retry-After"]) >= 1
    assert Quotas(conn).quota("starlette").default_limit == 2


def test_bad_arguments_are_errors(dsn: str) -> None:
    with pytest.raises(InvalidQuotaDefinition):
        RateLimit("ten/minute")
    with pytest.raises(InvalidQuotaDefinition):
        RateLimit("10/sliding:month")
    with pytest.raises(ConfigurationError, match="invalid rate-limit key"):
        RateLimit("10/minute", key="header:")
    with pytest.raises(ConfigurationError, match="headers must be"):
        RateLimit("10/minute", headers="loud")  # type: ignore[arg-type]
    with pytest.raises(InvalidQuotaDefinition):
        RateLimit("10/minute", quota="not a name")
    app = FastAPI()

    @app.get("/", dependencies=[Depends(RateLimit("1/minute", key="ip"))])
    async def root() -> str:
        return "ok"

    async def main() -> None:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=True)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            with pytest.raises(ConfigurationError, match=r"app\.state\.quotas"):
                await client.get("/")

    asyncio.run(main())


def test_a_client_at_the_address_of_a_dead_one_gets_its_quota_defined(
    dsn: str, another_empty_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One dependency (a module's) serving one lifespan after another, each with its own
    AsyncQuotas on its own database, as a test suite with a database per test does: the
    quota is defined in each database. CPython gives a new object the address of one that
    is gone, so a client must not be remembered by ``id()``: here every object has the same
    one, as the second client has the first's address when the allocator reuses it."""
    monkeypatch.setattr(starlette_contrib, "id", lambda _: 1, raising=False)
    with psycopg.connect(another_empty_dsn) as conn:
        install(conn)
        conn.commit()
    app = FastAPI()

    @app.get("/x", dependencies=[Depends(RateLimit("2/minute", key="ip"))])
    async def x() -> str:
        return "ok"

    async def main() -> None:
        transport = httpx.ASGITransport(app=app, client=("10.0.0.1", 40000))
        async with (
            AsyncConnectionPool(dsn, open=False) as first,
            AsyncConnectionPool(another_empty_dsn, open=False) as second,
            httpx.AsyncClient(transport=transport, base_url="http://test") as client,
        ):
            app.state.quotas = AsyncQuotas(first, clock=lambda: T0)
            assert (await client.get("/x")).status_code == 200
            gone = weakref.ref(app.state.quotas)
            del app.state.quotas
            gc.collect()
            assert gone() is None  # the dependency does not keep a client alive
            app.state.quotas = AsyncQuotas(second, clock=lambda: T0)
            response = await client.get("/x")
            assert response.status_code == 200, response.text
            assert response.headers["RateLimit-Remaining"] == "1"

    asyncio.run(main())


def test_a_dependency_with_a_bucket_width(dsn: str, conn: Conn) -> None:
    """``RateLimit("3/hour by 5m", sliding=True)`` and ``RateLimit("3/sliding:hour by 5m")``
    share one quota, named with its width, whose buckets are 5 minutes wide; a rate with
    another width is another quota; a bad width is refused when the dependency is built."""
    assert quota_name("3/hour by 5m", sliding=True) == "ratelimit:3/sliding:3600s/300s"
    assert quota_name("3/sliding:hour by 5m") == "ratelimit:3/sliding:3600s/300s"
    assert quota_name("3/sliding:hour by 10m") == "ratelimit:3/sliding:3600s/600s"
    assert quota_name("3/sliding:hour") == "ratelimit:3/sliding:3600s"
    app = FastAPI()

    @app.get("/a", dependencies=[Depends(RateLimit("3/hour by 5m", key="ip", sliding=True))])
    async def a() -> str:
        return "a"

    @app.get("/b", dependencies=[Depends(RateLimit("3/sliding:hour by 5m", key="ip"))])
    async def b() -> str:
        return "b"

    @app.get("/c", dependencies=[Depends(RateLimit("3/sliding:hour by 10m", key="ip"))])
    async def c() -> str:
        return "c"

    async def body(client: httpx.AsyncClient) -> None:
        codes = [(await client.get(p)).status_code for p in ("/a", "/b", "/a", "/b", "/c")]
        assert codes == [200, 200, 200, 429, 200]

    run_app(dsn, app, body)
    quotas = Quotas(conn)
    assert quotas.quota("ratelimit:3/sliding:3600s/300s").bucket_seconds == 300
    assert quotas.quota("ratelimit:3/sliding:3600s/600s").bucket_seconds == 600
    with pytest.raises(InvalidBucketWidth, match="at most 1000"):
        RateLimit("3/day by 1s", sliding=True)
    with pytest.raises(InvalidBucketWidth, match="only a sliding window"):
        RateLimit("3/day by 1h")


@contextlib.asynccontextmanager
async def serving(app: FastAPI) -> AsyncIterator[str]:
    """``app`` served by uvicorn on a free port of 127.0.0.1, its lifespan included."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    task = asyncio.create_task(server.serve(sockets=[listener]))
    try:
        while not server.started:
            if task.done():
                task.result()
                pytest.fail("uvicorn stopped before it started")
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
        listener.close()


RATE_LIMIT_HEADERS = {
    f"{prefix}ratelimit-{field}"
    for prefix in ("", "x-")
    for field in ("limit", "remaining", "reset")
}


def rate_limit_headers_of(response: httpx.Response) -> dict[str, list[str]]:
    """The rate-limit headers of a response, each with every value it was sent with."""
    return {
        name: response.headers.get_list(name)
        for name in sorted(RATE_LIMIT_HEADERS)
        if name in response.headers
    }


def test_over_http_a_client_tells_the_middlewares_429_from_an_endpoints_own(
    dsn: str, conn: Conn
) -> None:
    """Served by uvicorn: the middleware's 429 carries ``Retry-After`` and its
    ``RateLimit-*``; an endpoint's own 429 comes as the endpoint sent it, without them; an
    endpoint's other responses get them added, unless they carry rate-limit headers of
    their own (a dependency's), which stay alone."""

    pool = AsyncConnectionPool(dsn, min_size=1, max_size=4, open=False)
    quotas = AsyncQuotas(pool, clock=lambda: T0)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with pool:
            app.state.quotas = quotas
            yield

    app = FastAPI(lifespan=lifespan)
    app.add_middleware(
        RateLimitMiddleware, quotas=quotas, quota="api.daily", rate="4/day", key="ip",
        paths=["/api/"],
    )  # fmt: skip

    @app.get("/api/items")
    async def items() -> list[str]:
        return ["a"]

    @app.get("/api/busy")
    async def busy() -> JSONResponse:
        # the endpoint's own refusal (a queue of its own is full, say)
        return JSONResponse({"detail": "busy"}, status_code=429, headers={"Retry-After": "7"})

    @app.get("/api/raised")
    async def raised() -> str:
        raise HTTPException(status_code=429, detail="raised")

    @app.get("/api/search", dependencies=[Depends(RateLimit("10/minute", key="ip"))])
    async def search() -> str:
        return "found"

    # outside the middleware's paths: a dependency's endpoint refusing by itself
    @app.get("/own", dependencies=[Depends(RateLimit("10/minute", key="ip", quota="own"))])
    async def refuses_by_itself() -> str:
        raise HTTPException(status_code=429, detail="own")

    async def main() -> list[httpx.Response]:
        async with serving(app) as url, httpx.AsyncClient(base_url=url) as client:
            return [
                await client.get(path)
                for path in ("/api/items", "/api/busy", "/api/raised", "/api/search",
                             "/api/items", "/api/busy", "/own")
            ]  # fmt: skip

    item, busy_429, raised_429, searched, refused, refused_busy, own = asyncio.run(main())
    assert [r.status_code for r in (item, busy_429, raised_429, searched, refused)] == [
        200, 429, 429, 200, 429,
    ]  # fmt: skip
    # an allowed response: the middleware's headers (1 of 4 used)
    assert rate_limit_headers_of(item) == {
        "ratelimit-limit": ["4"],
        "ratelimit-remaining": ["3"],
        "ratelimit-reset": ["43200"],  # noon: half a day left
    }
    # the endpoint's own 429s: as the endpoint sent them, no header of the middleware's
    assert busy_429.json() == {"detail": "busy"}
    assert busy_429.headers.get_list("retry-after") == ["7"]
    assert rate_limit_headers_of(busy_429) == {}
    assert (raised_429.json(), "retry-after" in raised_429.headers) == ({"detail": "raised"}, False)
    assert rate_limit_headers_of(raised_429) == {}
    # a dependency's headers stay alone: one limit's set, never two values of a header
    assert rate_limit_headers_of(searched) == {
        "ratelimit-limit": ["10"],
        "ratelimit-remaining": ["9"],
        "ratelimit-reset": ["60"],
    }
    # the middleware's own 429 (the 5th call of the day): its body, Retry-After, headers
    assert (refused.text, refused.headers["retry-after"]) == ("Too Many Requests\n", "43200")
    assert rate_limit_headers_of(refused) == {
        "ratelimit-limit": ["4"],
        "ratelimit-remaining": ["0"],
        "ratelimit-reset": ["43200"],
    }
    # past the limit the endpoint is not reached: the middleware answers
    assert (refused_busy.status_code, refused_busy.text) == (429, "Too Many Requests\n")
    # the dependency's headers go with what it allowed, not on the endpoint's own 429
    assert (own.status_code, own.json()) == (429, {"detail": "own"})
    assert rate_limit_headers_of(own) == {}
    status = Quotas(conn).status("api.daily", "ip:127.0.0.1", at=T0)
    assert (status.used, status.attempts, status.rejected) == (4, 6, 2)
    assert Quotas(conn).status("own", "ip:127.0.0.1", at=T0).used == 1
