"""The sharded path (a PL/Proxy proxy in front of two shards) against one server, in one run.

Every server is started here from the distribution's PostgreSQL 15 binaries (the
embedded wheel has no PL/Proxy), durable settings, on this machine: the figures
show what the proxy hop costs, not what more machines would add.
"""

from __future__ import annotations

import tempfile
import threading
import time
from collections import Counter as Tally
from collections.abc import Callable
from pathlib import Path

import psycopg
from psycopg import sql

from pgcounters.config import connect
from pgcounters.demos.bench.report import Comparison, Measurement, Scenario
from pgcounters.embedded import EmbeddedPostgres
from pgcounters.errors import ConfigurationError
from pgcounters.schema import install
from pgcounters.sharding import install_proxy

PG_BIN = Path("/usr/lib/postgresql/15/bin")
PLPROXY = Path("/usr/lib/postgresql/15/lib/plproxy.so")
COUNTER = "bench.sharded"
KEYS = 1000
WRITERS = 4
VARIANTS = (
    "incr: one server",
    "incr: proxy, 2 shards",
    "get: one server",
    "get: proxy, 2 shards",
)
COMPARISONS: tuple[Comparison, ...] = (
    ("incr: proxy, 2 shards", "incr: one server", None),
    ("get: proxy, 2 shards", "get: one server", None),
)


def sharded(dsn: str, repeat: int, quick: bool) -> Scenario:
    if not PLPROXY.exists():
        raise ConfigurationError(
            f"the sharded scenario needs PL/Proxy for PostgreSQL 15 ({PLPROXY}): "
            "apt-get install postgresql-15-plproxy"
        )
    per_writer = 200 if quick else 1000
    scenario = Scenario(
        "sharded",
        f"{WRITERS} concurrent writers x {per_writer:,} increments over {KEYS:,} keys of a queued "
        "counter, each its own transaction, then the same number of exact reads: through "
        "pgcounters.incr / pgcounters.get on one PostgreSQL 15 server, and through "
        "pgcounters_proxy.incr / get on a PL/Proxy proxy in front of two shards (three "
        "servers on this machine).",
        unit="operations",
    )
    scenario.headline = ("incr: proxy, 2 shards", "incr: one server")
    with tempfile.TemporaryDirectory(prefix="pgcounters-bench-sharded-") as folder:
        servers = [
            EmbeddedPostgres(Path(folder) / name, bin_dir=PG_BIN)
            for name in ("single", "s0", "s1", "proxy")
        ]
        started: list[EmbeddedPostgres] = []
        try:
            for server in servers:
                server.start()
                started.append(server)
            single, shards, proxy = servers[0].dsn(), [s.dsn() for s in servers[1:3]], servers[3]
            for target in (single, *shards):
                with connect(target) as conn:
                    install(conn)
            with connect(proxy.dsn()) as conn:
                install_proxy(conn, shards)
            paths = {
                "one server": (single, "pgcounters"),
                "proxy, 2 shards": (proxy.dsn(), "pgcounters_proxy"),
            }
            for target, schema in paths.values():
                with connect(target) as conn:
                    conn.execute(_call(schema, "create_counter(%s, ARRAY['bigint'])"), (COUNTER,))
            totals = {where: Tally[int]() for where in paths}
            for _ in range(repeat):
                for where, (target, schema) in paths.items():
                    seconds = _writers(target, schema, per_writer, totals[where])
                    scenario.add(f"incr: {where}", Measurement(seconds, WRITERS * per_writer))
                    seconds, exact = _reads(target, schema, per_writer, totals[where])
                    scenario.add(f"get: {where}", Measurement(seconds, WRITERS * per_writer, exact))
        finally:
            for server in started:
                server.stop()
    scenario.runs = {v: scenario.runs[v] for v in VARIANTS}
    scenario.compare(COMPARISONS)
    return scenario


def _call(schema: str, call: str) -> sql.Composed:
    """``SELECT schema.call``, the schema quoted by the driver."""
    return sql.SQL("SELECT {}." + call).format(sql.Identifier(schema))


def _run_threads(work: Callable[[int], None]) -> float:
    threads = [threading.Thread(target=work, args=(i,)) for i in range(WRITERS)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - started


def _writers(target: str, schema: str, per_writer: int, expected: Tally[int]) -> float:
    lock = threading.Lock()
    errors: list[BaseException] = []
    statement = _call(schema, "incr(%s, ARRAY[%s], 1)")

    def work(index: int) -> None:
        mine = Tally[int]()
        try:
            with psycopg.connect(target, autocommit=True) as conn:
                for i in range(per_writer):
                    key = (index * 7919 + i * 31) % KEYS
                    conn.execute(statement, (COUNTER, str(key)))
                    mine[key] += 1
        except BaseException as exc:
            errors.append(exc)
        with lock:
            expected.update(mine)

    seconds = _run_threads(work)
    if errors:
        raise errors[0]
    return seconds


def _reads(target: str, schema: str, per_reader: int, expected: Tally[int]) -> tuple[float, bool]:
    statement = _call(schema, "get(%s, ARRAY[%s])")
    wrong: list[int] = []

    def work(index: int) -> None:
        with psycopg.connect(target, autocommit=True) as conn:
            for i in range(per_reader):
                key = (index * 104729 + i * 17) % KEYS
                row = conn.execute(statement, (COUNTER, str(key))).fetchone()
                if row is None or int(row[0]) != expected[key]:
                    wrong.append(key)

    seconds = _run_threads(work)
    return seconds, not wrong
