"""The example service (examples/service): its Alembic migrations on an empty database, and
the service itself served by uvicorn and driven over real HTTP by many concurrent clients
(likes, unlikes, views, rate-limited API calls) beside a program writing likes in raw SQL;
every count is checked against the truth."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import os
import random
import re
import signal
import socket
import subprocess
import sys
from collections import Counter as Tally
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import uvicorn
from alembic import command
from fastapi import FastAPI

from newsroom.app import Settings, create_app
from newsroom.db import API_QUOTA, VIEWS
from newsroom.migrate import alembic_config, upgrade
from pgcounters import Counters, Quotas
from support import set_database_clock

pytestmark = pytest.mark.slow

STATE = """
SELECT (SELECT array_agg(version_num) FROM alembic_version),
       (SELECT max(version) FROM pgcounters.migrations),
       (SELECT array_agg(name ORDER BY name) FROM pgcounters.specs),
       (SELECT array_agg(name ORDER BY name) FROM pgcounters.targets),
       (SELECT array_agg((oid, tgname) ORDER BY tgname) FROM pg_trigger
         WHERE tgrelid = 'article_like'::regclass AND NOT tgisinternal)::text,
       (SELECT array_agg(oid ORDER BY oid) FROM pg_proc
         WHERE pronamespace = 'pgcounters'::regnamespace)::text,
       (SELECT array_agg(xmin::text ORDER BY name) FROM pgcounters.specs)
"""


def _state(dsn: str) -> tuple[Any, ...]:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(STATE).fetchone()
    assert row is not None
    return tuple(row)


def test_migrations_install_everything_on_an_empty_database_and_twice_is_a_no_op(
    empty_dsn: str,
) -> None:
    upgrade(empty_dsn)
    state = _state(empty_dsn)
    version, schema, specs, targets, triggers, _, _ = state
    assert version == ["0002"]
    assert schema is not None
    assert specs == ["article.like_count"]
    assert "article.views" in targets
    assert "article.like_count" in targets
    assert triggers is not None  # the triggers of article.like_count on article_like
    # the models and the database agree, tables and counters alike
    command.check(alembic_config(empty_dsn))
    # a second upgrade changes nothing: no trigger, function or spec is written again
    upgrade(empty_dsn)
    assert _state(empty_dsn) == state
    # the counter works: rows written in SQL, counted by the triggers, applied by a drain
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO article (title) VALUES ('a'), ('b')")
        conn.execute(
            "INSERT INTO article_like (article_id, user_name)"
            " SELECT a.id, 'u' || g FROM article a, generate_series(1, a.id::int * 3) g"
        )
        Counters(conn).drain()
        rows = conn.execute("SELECT title, like_count FROM article ORDER BY id").fetchall()
    assert [tuple(r) for r in rows] == [("a", 3), ("b", 6)]
    # down to nothing and up again: the triggers go with the tables, and come back
    command.downgrade(alembic_config(empty_dsn), "base")
    with psycopg.connect(empty_dsn) as conn:
        left = conn.execute(
            "SELECT to_regclass('article'), (SELECT count(*) FROM pgcounters.specs),"
            " (SELECT count(*) FROM pgcounters.targets WHERE name = 'article.views')"
        ).fetchone()
    assert left == (None, 0, 0)
    upgrade(empty_dsn)
    assert _state(empty_dsn)[:4] == state[:4]


def test_the_counters_migration_counts_the_likes_written_before_it(empty_dsn: str) -> None:
    upgrade(empty_dsn, "0001")  # the tables alone, as an application before its counters
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO article (title) SELECT 't' || g FROM generate_series(1, 20) g")
        conn.execute(
            "INSERT INTO article_like (article_id, user_name)"
            " SELECT a.id, 'u' || g FROM article a, generate_series(1, a.id::int % 7) g"
        )
        upgrade(empty_dsn)
        # counted by the migration itself: no worker, no drain
        wrong = conn.execute(
            "SELECT a.id, a.like_count, (SELECT count(*) FROM article_like l"
            " WHERE l.article_id = a.id) AS truth FROM article a"
            " WHERE a.like_count <> (SELECT count(*) FROM article_like l"
            " WHERE l.article_id = a.id)"
        ).fetchall()
        total = conn.execute("SELECT sum(like_count) FROM article").fetchone()
    assert wrong == []
    assert total == (sum(i % 7 for i in range(1, 21)),)


def test_python_m_newsroom_migrates_serves_and_stops_on_a_signal(empty_dsn: str) -> None:
    service = Path(__file__).resolve().parent.parent / "examples" / "service"
    env = {**os.environ, "PGCOUNTERS_DSN": empty_dsn}
    env.pop("DATABASE_URL", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "newsroom", "--port", "0", "--api-rate", "2/day"],
        cwd=service,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # printed once migrated and listening
        found = re.search(r"listening on (http://127\.0\.0\.1:\d+/)", line)
        assert found is not None, line + (process.stderr.read() if process.stderr else "")
        base = found.group(1)
        with httpx.Client(base_url=base) as client:
            made = client.post("/articles", json={"title": "hello"})
            assert made.status_code == 201
            article = made.json()["id"]
            assert client.put(f"/articles/{article}/likes/ann").json()["changed"] is True
            assert client.get(f"/articles/{article}").json()["likes"] == 1
            codes = [
                client.get(f"/api/articles/{article}/stats", headers={"X-Api-Key": "k"})
                for _ in range(3)
            ]
            assert [r.status_code for r in codes] == [200, 200, 429]
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
        assert process.returncode == 0, err
        assert out.strip() == "newsroom: stopped"
        assert "Traceback" not in err
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    with psycopg.connect(empty_dsn) as conn:
        views = Counters(conn).get(VIEWS, article)  # written by the lifespan on the way out
        version = conn.execute("SELECT version_num FROM alembic_version").fetchone()
    assert (views, version) == (1, ("0002",))


@contextlib.asynccontextmanager
async def serving(app: FastAPI) -> AsyncIterator[str]:
    """``app`` served by uvicorn on a free port of 127.0.0.1, its lifespan included."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    task = asyncio.create_task(server.serve(sockets=[listener]))
    try:
        while not server.started:  # the lifespan has run and the socket accepts
            if task.done():
                task.result()
                pytest.fail("uvicorn stopped before it started")
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
        listener.close()


LIMIT = 15
ARTICLES = 4
USERS = 30


async def _until(check: Callable[[], Awaitable[bool]], timeout: float = 60.0) -> None:
    """Wait until ``check()`` is true (the state is observed, not a delay assumed)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await check():
        if loop.time() > deadline:
            pytest.fail("the state was not reached in time")
        await asyncio.sleep(0.02)


def _raw_writer(dsn: str, articles: list[int], rounds: int) -> None:
    """Another program: likes inserted and deleted by plain SQL, many rows a statement."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i in range(rounds):
            conn.execute(
                "INSERT INTO article_like (article_id, user_name)"
                " SELECT a, 'raw' || g FROM unnest(%s::bigint[]) a, generate_series(1, %s) g"
                " ON CONFLICT DO NOTHING",
                (articles, 5 + i),
            )
            conn.execute(
                "DELETE FROM article_like WHERE user_name = %s AND article_id = %s",
                (f"raw{i + 1}", articles[i % len(articles)]),
            )


async def _drive(dsn: str) -> None:
    rng = random.Random(18)
    settings = Settings(dsn=dsn, api_rate=f"{LIMIT}/day", views_interval=0.05)
    async with (
        serving(create_app(settings)) as base,
        httpx.AsyncClient(base_url=base, timeout=120) as client,
    ):
        made = await asyncio.gather(
            *(client.post("/articles", json={"title": f"t{i}"}) for i in range(ARTICLES))
        )
        assert [r.status_code for r in made] == [201] * ARTICLES
        articles = [int(r.json()["id"]) for r in made]

        calls: list[tuple[str, str, dict[str, str]]] = []  # method, path, headers
        for article in articles:
            for user in range(USERS):
                path = f"/articles/{article}/likes/u{user}"
                calls.append(("PUT", path, {}))
                if rng.random() < 0.3:
                    calls.append(("PUT", path, {}))  # liked twice: counted once
                if rng.random() < 0.4:
                    calls.append(("DELETE", path, {}))
        for _ in range(120):
            calls.append(("GET", f"/articles/{rng.choice(articles)}", {}))
        keys = ["k1", "k2", "k3", None]  # None: no key, limited by the client's address
        for key in keys:
            headers = {} if key is None else {"X-Api-Key": key}
            for _ in range(LIMIT + 10):
                calls.append(("GET", f"/api/articles/{rng.choice(articles)}/stats", headers))
        rng.shuffle(calls)

        gate = asyncio.Semaphore(40)

        async def call(method: str, path: str, headers: dict[str, str]) -> httpx.Response:
            async with gate:
                return await client.request(method, path, headers=headers)

        # the worker is held off the articles while the load runs (their rows locked as an
        # UPDATE would; likes still insert, their foreign key check takes a weaker lock), so
        # the stored column stays behind and only exact() can be right
        async with await psycopg.AsyncConnection.connect(dsn) as hold:  # rolled back on exit
            await hold.execute("SELECT id FROM article FOR NO KEY UPDATE")
            responses, _ = await asyncio.gather(
                asyncio.gather(*(call(*c) for c in calls)),
                asyncio.to_thread(_raw_writer, dsn, articles, 12),
            )

            views: Tally[int] = Tally()
            api: dict[str | None, list[httpx.Response]] = {key: [] for key in keys}
            for response in responses:
                request = response.request
                path = request.url.path
                if path.startswith("/api/"):
                    api[request.headers.get("X-Api-Key")].append(response)
                    continue
                assert response.status_code == 200, (path, response.text)
                if request.method == "GET":
                    views[int(path.rsplit("/", 1)[1])] += 1

            # the quota: exactly LIMIT calls a key, never one more, and every 429 says why
            for key, answered in api.items():
                allowed = [r for r in answered if r.status_code == 200]
                refused = [r for r in answered if r.status_code == 429]
                assert len(allowed) == LIMIT, key
                assert len(refused) == len(answered) - LIMIT, key
                assert sorted(int(r.headers["RateLimit-Remaining"]) for r in allowed) == list(
                    range(LIMIT)
                )
                for r in refused:
                    assert int(r.headers["Retry-After"]) >= 1
                    assert r.headers["RateLimit-Limit"] == str(LIMIT)
                    assert r.headers["RateLimit-Remaining"] == "0"
                    assert r.json() == {"detail": "Too Many Requests"}

            # every count is exact now, before the worker has caught up: likes as count(*),
            # views as the number of successful view requests (this read is one more)
            async with await psycopg.AsyncConnection.connect(dsn) as conn:
                truth: dict[int, int] = dict(
                    await (
                        await conn.execute(
                            "SELECT a.id, count(l.article_id) FROM article a"
                            " LEFT JOIN article_like l ON l.article_id = a.id GROUP BY a.id"
                        )
                    ).fetchall()
                )
            assert sum(truth.values()) > 0
            for article in articles:
                shown = (await client.get(f"/articles/{article}")).json()
                views[article] += 1
                assert (shown["likes"], shown["views"]) == (truth[article], views[article])
            async with await psycopg.AsyncConnection.connect(dsn) as conn:
                stored = await (
                    await conn.execute("SELECT sum(like_count) FROM article")
                ).fetchone()
            assert stored == (0,)  # nothing applied yet: the likes shown were the exact ones
            await hold.rollback()

        # the worker of the lifespan applies everything: the stored column is the truth
        async def applied() -> bool:
            async with await psycopg.AsyncConnection.connect(dsn) as conn:
                stored = await (
                    await conn.execute(
                        "SELECT a.id, a.like_count, (SELECT count(*) FROM article_like l"
                        " WHERE l.article_id = a.id) FROM article a"
                    )
                ).fetchall()
                queued = await (
                    await conn.execute("SELECT count(*) FROM pgcounters.queue")
                ).fetchone()
            return queued == (0,) and all(n == count for _, n, count in stored)

        await _until(applied)
        ranked = (await client.get("/articles/top")).json()
        assert ranked == [
            {"id": a, "count": n} for a, n in sorted(truth.items(), key=lambda t: (-t[1], t[0]))
        ]

    # the service has stopped: its buffer of views was written on the way out
    with psycopg.connect(dsn, autocommit=True) as sync_conn:
        counters = Counters(sync_conn)
        assert {a: counters.get(VIEWS, a) for a in articles} == dict(views)
        quotas = Quotas(sync_conn)
        for subject in ("header:k1", "header:k2", "header:k3", "ip:127.0.0.1"):
            status = quotas.status(API_QUOTA, subject)
            assert (status.used, status.attempts) == (LIMIT, LIMIT + 10)


def test_the_service_counts_exactly_under_concurrent_load(empty_dsn: str) -> None:
    upgrade(empty_dsn)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        # the quotas' day, fixed: the test cannot straddle midnight
        set_database_clock(conn, dt.datetime(2026, 3, 14, 12, 0, tzinfo=dt.UTC))
    asyncio.run(_drive(empty_dsn))
