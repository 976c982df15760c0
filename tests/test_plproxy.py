"""Counters and quotas sharded over two PostgreSQL servers through PL/Proxy: a proxy and two
shards, all started from the distribution's PostgreSQL 15 binaries (the embedded wheel has no
PL/Proxy). `make test` installs the package; without it these tests are skipped, saying so."""

from __future__ import annotations

import datetime as dt
import random
import threading
from collections import Counter as Tally
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgcounters.connection import Conn
from pgcounters.dberrors import translated
from pgcounters.embedded import EmbeddedPostgres
from pgcounters.errors import ConfigurationError, InvalidKey, ShardingError, UnknownCounter
from pgcounters.schema import install
from pgcounters.sharding import install_proxy

PG_BIN = Path("/usr/lib/postgresql/15/bin")
PLPROXY = Path("/usr/lib/postgresql/15/lib/plproxy.so")

if not PLPROXY.exists():
    pytest.skip(
        f"PL/Proxy is not installed ({PLPROXY} is missing): apt-get install "
        "postgresql-15-plproxy (`make test` installs it)",
        allow_module_level=True,
    )


def _dsn(server: EmbeddedPostgres, dbname: str) -> str:
    return server.dsn(dbname)


@pytest.fixture(scope="module")
def proxy(server_folders: Callable[[str], Path]) -> Iterator[tuple[str, list[str]]]:
    """(proxy DSN, shard DSNs): two shards with pgcounters installed, a proxy in front."""
    folder = server_folders("plproxy")
    servers = [EmbeddedPostgres(folder / name, bin_dir=PG_BIN) for name in ("s0", "s1", "px")]
    started: list[EmbeddedPostgres] = []
    try:
        for server in servers:
            server.start()
            started.append(server)
            with psycopg.connect(server.dsn(), autocommit=True) as admin:
                admin.execute("CREATE DATABASE app")
        shard_dsns = [_dsn(s, "app") for s in servers[:2]]
        for dsn in shard_dsns:
            with psycopg.connect(dsn, autocommit=True) as conn:
                install(conn)
        proxy_dsn = _dsn(servers[2], "app")
        with psycopg.connect(proxy_dsn, autocommit=True) as conn:
            install_proxy(conn, shard_dsns)
        yield proxy_dsn, shard_dsns
    finally:
        for server in started:
            server.stop()


@pytest.fixture
def px(proxy: tuple[str, list[str]]) -> Iterator[Conn]:
    with psycopg.connect(proxy[0], autocommit=True) as conn:
        yield conn


def _one(conn: Conn, query: str, params: Any = None) -> Any:
    with translated():
        row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def test_install_needs_a_power_of_two_of_shards(px: Conn) -> None:
    with pytest.raises(ConfigurationError, match="power of two"):
        install_proxy(px, ["host=a", "host=b", "host=c"])


def test_counters_are_spread_over_the_shards_by_key_and_read_back_exactly(
    px: Conn, proxy: tuple[str, list[str]]
) -> None:
    px.execute("SELECT pgcounters_proxy.create_counter('sh.views', ARRAY['bigint'])")
    px.execute("SELECT pgcounters_proxy.create_counter('sh.daily', ARRAY['text', 'date'])")
    px.execute("SELECT pgcounters_proxy.create_counter('sh.likes', ARRAY['text'], 'direct')")
    px.execute("SELECT pgcounters_proxy.create_counter('sh.total')")
    truth: Tally[int] = Tally()
    for i in range(60):
        key = i % 20
        spelled = f"{key:03d}" if i % 2 else str(key)  # '007' and '7' are one key
        px.execute("SELECT pgcounters_proxy.incr('sh.views', ARRAY[%s], %s)", (spelled, i + 1))
        truth[key] += i + 1
    px.execute("SELECT pgcounters_proxy.incr('sh.daily', ARRAY['home', '2026-11-24'], 3)")
    px.execute("SELECT pgcounters_proxy.incr('sh.total')")
    assert _one(px, "SELECT pgcounters_proxy.incr('sh.likes', ARRAY['a'], 2)") == 2
    assert _one(px, "SELECT pgcounters_proxy.incr('sh.likes', ARRAY['a'], 5)") == 7
    for key, value in truth.items():
        assert _one(px, "SELECT pgcounters_proxy.get('sh.views', ARRAY[%s])", (str(key),)) == value
    keys = [f"{{{k}}}" for k in range(22)]
    rows = px.execute("SELECT key, value FROM pgcounters_proxy.get_many('sh.views', %s)", (keys,))
    assert [(list(k), v) for k, v in rows] == [([str(k)], truth[k]) for k in range(22)]
    assert _one(px, "SELECT pgcounters_proxy.get('sh.daily', ARRAY['home', '2026-11-24'])") == 3
    assert _one(px, "SELECT pgcounters_proxy.get('sh.total')") == 1
    # every shard holds part of the counter, and only its part
    held = []
    for dsn in proxy[1]:
        with psycopg.connect(dsn, autocommit=True) as shard:
            held.append(
                _one(
                    shard,
                    "SELECT count(*) FROM pgcounters.queue q JOIN pgcounters.targets t"
                    " ON t.id = q.target_id WHERE t.name = 'sh.views'",
                )
            )
    assert all(held)
    assert sum(held) == 60
    # drained: stored on the shards, ranked over both
    assert _one(px, "SELECT pgcounters_proxy.drain()") == 62
    top = px.execute("SELECT key, value FROM pgcounters_proxy.top('sh.views', 5)").fetchall()
    expected = sorted(((v, str(k)) for k, v in truth.items()), key=lambda r: (-r[0], r[1]))[:5]
    assert [(list(k), v) for k, v in top] == [([k], v) for v, k in expected]
    assert _one(px, "SELECT pgcounters_proxy.get('sh.views', ARRAY['7'])") == truth[7]


def test_bad_keys_and_unknown_counters_are_refused_at_the_proxy(
    px: Conn,
) -> None:
    px.execute("SELECT pgcounters_proxy.create_counter('sh.checked', ARRAY['bigint'])")
    with pytest.raises(InvalidKey, match="invalid key"):
        _one(px, "SELECT pgcounters_proxy.incr('sh.checked', ARRAY['x'])")
    with pytest.raises(InvalidKey, match="takes a key"):
        _one(px, "SELECT pgcounters_proxy.incr('sh.checked', ARRAY['1', '2'])")
    with pytest.raises(UnknownCounter):
        _one(px, "SELECT pgcounters_proxy.get('sh.nothing', ARRAY['1'])")


def test_incr_many_is_one_transaction_on_one_shard_and_refused_across_shards(
    px: Conn,
) -> None:
    px.execute("SELECT pgcounters_proxy.create_counter('sh.batch', ARRAY['bigint'])")
    shard_of = {
        k: _one(px, "SELECT pgcounters_proxy.shard_of('sh.batch', ARRAY[%s])", (str(k),))
        for k in range(40)
    }
    same = [k for k in range(40) if shard_of[k] == shard_of[0]][:3]
    other = next(k for k in range(40) if shard_of[k] != shard_of[0])
    assert len(same) == 3
    written = _one(
        px,
        "SELECT pgcounters_proxy.incr_many(%s, %s, %s)",
        (["sh.batch"] * 3, [f"{{{k}}}" for k in same], [1, 2, 3]),
    )
    assert written == 3
    with pytest.raises(ShardingError, match="more than one shard"):
        _one(
            px,
            "SELECT pgcounters_proxy.incr_many(%s, %s, %s)",
            (["sh.batch"] * 2, [f"{{{same[0]}}}", f"{{{other}}}"], [10, 10]),
        )
    values = [
        _one(px, "SELECT pgcounters_proxy.get('sh.batch', ARRAY[%s])", (str(k),))
        for k in (*same, other)
    ]
    assert values == [1, 2, 3, 0]  # the refused call wrote nothing


def test_concurrent_load_on_the_proxy_matches_the_truth(
    proxy: tuple[str, list[str]],
) -> None:
    proxy_dsn = proxy[0]
    limit = 25
    with psycopg.connect(proxy_dsn, autocommit=True) as setup:
        setup.execute("SELECT pgcounters_proxy.create_counter('load.views', ARRAY['bigint'])")
        setup.execute(
            "SELECT pgcounters_proxy.create_counter('load.likes', ARRAY['text'], 'direct')"
        )
        setup.execute("SELECT pgcounters_proxy.define_quota('load.api', %s)", (limit,))
    at = dt.datetime(2026, 11, 24, 12, tzinfo=dt.UTC)
    stop = threading.Event()
    errors: list[BaseException] = []
    views: list[Tally[int]] = []
    likes: list[Tally[str]] = []
    calls: list[Tally[str]] = []
    granted: list[Tally[str]] = []

    def writer(seed: int) -> None:
        rng = random.Random(seed)
        v: Tally[int] = Tally()
        lk: Tally[str] = Tally()
        c: Tally[str] = Tally()
        g: Tally[str] = Tally()
        try:
            with psycopg.connect(proxy_dsn, autocommit=True) as conn:
                for _ in range(150):
                    action = rng.random()
                    if action < 0.5:
                        key = rng.randrange(30)
                        spelled = f"{key:04d}" if rng.random() < 0.3 else str(key)
                        delta = rng.randint(1, 3)
                        conn.execute(
                            "SELECT pgcounters_proxy.incr('load.views', ARRAY[%s], %s)",
                            (spelled, delta),
                        )
                        v[key] += delta
                    elif action < 0.65:
                        who = f"u{rng.randrange(5)}"
                        conn.execute(
                            "SELECT pgcounters_proxy.incr('load.likes', ARRAY[%s], 1)", (who,)
                        )
                        lk[who] += 1
                    elif action < 0.75:
                        keys = [rng.randrange(30) for _ in range(2)]
                        try:
                            conn.execute(
                                "SELECT pgcounters_proxy.incr_many(%s, %s, %s)",
                                (["load.views"] * 2, [f"{{{k}}}" for k in keys], [1, 1]),
                            )
                        except psycopg.Error as exc:
                            if exc.sqlstate != "PCS01":
                                raise
                        else:
                            for k in keys:
                                v[k] += 1
                    else:
                        subject = f"s{rng.randrange(6)}"
                        row = conn.execute(
                            "SELECT allowed FROM pgcounters_proxy.register_call("
                            "'load.api', %s, 1, %s)",
                            (subject, at),
                        ).fetchone()
                        assert row is not None
                        c[subject] += 1
                        if row[0]:
                            g[subject] += 1
        except BaseException as exc:  # reported below
            errors.append(exc)
        views.append(v)
        likes.append(lk)
        calls.append(c)
        granted.append(g)

    def drainer() -> None:
        try:
            with psycopg.connect(proxy_dsn, autocommit=True) as conn:
                while not stop.is_set():
                    conn.execute("SELECT pgcounters_proxy.drain(500)")
        except BaseException as exc:
            errors.append(exc)

    background = threading.Thread(target=drainer)
    background.start()
    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    background.join()
    assert not errors
    truth_views = sum(views, Tally[int]())
    truth_likes = sum(likes, Tally[str]())
    truth_calls = sum(calls, Tally[str]())
    truth_granted = sum(granted, Tally[str]())
    with psycopg.connect(proxy_dsn, autocommit=True) as conn:
        # exact before the last drain, and after it
        for drained in (False, True):
            if drained:
                conn.execute("SELECT pgcounters_proxy.drain()")
            keys = [f"{{{k}}}" for k in range(30)]
            rows = conn.execute(
                "SELECT value FROM pgcounters_proxy.get_many('load.views', %s)", (keys,)
            ).fetchall()
            assert [v for (v,) in rows] == [truth_views[k] for k in range(30)]
            for who, n in truth_likes.items():
                assert (
                    _one(conn, "SELECT pgcounters_proxy.get('load.likes', ARRAY[%s])", (who,)) == n
                )
        top = conn.execute(
            "SELECT key, value FROM pgcounters_proxy.top('load.views', 5)"
        ).fetchall()
        ranked = sorted(((v, str(k)) for k, v in truth_views.items()), key=lambda r: (-r[0], r[1]))
        assert [(list(k), v) for k, v in top] == [([k], v) for v, k in ranked[:5]]
        for subject, n in truth_calls.items():
            status = conn.execute(
                "SELECT used, attempts, rejected FROM pgcounters_proxy.quota_status("
                "'load.api', %s, %s)",
                (subject, at),
            ).fetchone()
            assert truth_granted[subject] == min(n, limit)
            assert status == (truth_granted[subject], n, n - truth_granted[subject])


def test_the_sharded_bench_scenario_is_exact_and_runs_only_when_named(dsn: str) -> None:
    from pgcounters.demos import bench
    from pgcounters.demos.bench.sharded import VARIANTS, sharded

    assert "sharded" in bench.SCENARIOS
    assert "sharded" in bench.ON_REQUEST
    scenario = sharded(dsn, 1, True)
    assert list(scenario.runs) == list(VARIANTS)
    for variant, runs in scenario.runs.items():
        assert [r.exact for r in runs] == [True], variant
        assert runs[0].operations == 800
