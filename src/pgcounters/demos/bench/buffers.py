"""The reference techniques from the application's side: increments from one Python process.

Increments (the same random sequence over ``KEYS`` keys for every variant, one
thread, one connection):

* ``incr: update (reference)``: ``UPDATE ... SET n = n + 1`` per increment, autocommit
  (the naive way both reference techniques start from);
* ``incr: direct queue``: :meth:`Counters.incr`, one INSERT into the queue each;
* ``incr: batching``: :class:`BatchingCounters`, timed up to ``close()`` (so the
  time includes writing everything to PostgreSQL);
* ``incr: zincrby (reference)``: the reference ``ZINCRBY`` into a Redis sorted set;
* ``incr: redis buffer``: :class:`RedisBuffer` (one script call to Redis each).

Flushes of ``flush_keys`` distinct pending keys from Redis to PostgreSQL:

* ``flush: reference loop``: the reference management command: per key a ``ZSCORE``+``ZREM``
  transaction and an ``UPDATE``;
* ``flush: redis buffer``: :meth:`RedisBuffer.flush` (one atomic take, one
  database transaction writing the deltas to the queue);
* ``flush: redis buffer + drain``: the same plus draining the queue, so the
  values end where the reference loop puts them.

Every run checks every total exactly.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pgcounters.batching import BatchingCounters
from pgcounters.client import Counters
from pgcounters.config import connect
from pgcounters.demos import sqlfiles
from pgcounters.demos.bench.report import Comparison, Measurement, Scenario
from pgcounters.redis_buffer import REDIS_URL_VARIABLE, RedisBuffer, connect_redis
from pgcounters.schema import install

COUNTER = "bench.events"
PREFIX = "pgcounters-bench"
REFERENCE_ZSET = PREFIX + ":reference:pending"
KEYS = 100

COMPARISONS: tuple[Comparison, ...] = (
    ("incr: direct queue", "incr: update (reference)", None),
    ("incr: batching", "incr: update (reference)", 10.0),
    ("incr: batching", "incr: direct queue", None),
    ("incr: redis buffer", "incr: direct queue", None),
    ("incr: redis buffer", "incr: zincrby (reference)", 0.9),
    ("flush: redis buffer", "flush: reference loop", None),
    ("flush: redis buffer + drain", "flush: reference loop", None),
)


@contextmanager
def redis_for_bench() -> Iterator[str]:
    """``PGCOUNTERS_REDIS_URL`` if set, else a Redis server of our own for the run."""
    configured = os.environ.get(REDIS_URL_VARIABLE, "").strip()
    if configured:
        yield configured
        return
    from pgcounters.demos.redis_server import EmbeddedRedis

    folder = Path(tempfile.mkdtemp(prefix="pgcounters-bench-redis-"))
    try:
        with EmbeddedRedis(folder) as server:
            yield server.url()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _query(name: str) -> str:
    """A statement of ``demos/sql/reference_buffers_ops.sql``."""
    return sqlfiles.named("reference_buffers_ops.sql")[name]


class _Env:
    """Connections and clients of one benchmark run, and the state between variants."""

    def __init__(self, dsn: str, url: str, flush_keys: int) -> None:
        self.dsn, self.url = dsn, url
        self.conn = connect(dsn)
        self.pc = Counters(self.conn)
        self.redis = connect_redis(url)
        install(self.conn)
        self.conn.execute(sqlfiles.read("reference_buffers.sql").encode())
        self.conn.execute(_query("reference_unread_rows"), {"keys": max(KEYS, flush_keys)})

    def reset(self) -> None:
        self.pc.drop_counter(COUNTER)
        self.pc.create_counter(COUNTER, key=int)
        self.conn.execute(
            "UPDATE reference_unread_counts SET unread_count = 0 WHERE unread_count <> 0"
        )
        stale = list(self.redis.scan_iter(match=PREFIX + ":*", count=1000))
        if stale:
            self.redis.delete(*stale)

    def buffer(self) -> RedisBuffer:
        return RedisBuffer(self.dsn, self.redis, name="bench", prefix=PREFIX)

    def reference_values(self) -> dict[int, int]:
        return {int(k): int(v) for k, v in self.conn.execute(_query("reference_unread_values"))}

    def pgc_values(self, keys: int) -> dict[int, int]:
        return {k: v for k, v in enumerate(self.pc.get_many(COUNTER, range(keys))) if v}

    def close(self) -> None:
        self.redis.close()
        self.conn.close()


IncrVariant = Callable[[_Env, list[int]], tuple[float, dict[int, int]]]


def _incr_update(env: _Env, plan: list[int]) -> tuple[float, dict[int, int]]:
    stmt = _query("reference_unread_incr")
    started = time.perf_counter()
    for k in plan:
        env.conn.execute(stmt, (1, k))
    return time.perf_counter() - started, env.reference_values()


def _incr_direct(env: _Env, plan: list[int]) -> tuple[float, dict[int, int]]:
    env.pc.counter(COUNTER)  # a long-lived process has the declaration cached
    started = time.perf_counter()
    for k in plan:
        env.pc.incr(COUNTER, k)
    return time.perf_counter() - started, env.pgc_values(KEYS)


def _incr_batching(env: _Env, plan: list[int]) -> tuple[float, dict[int, int]]:
    batcher = BatchingCounters(env.dsn, interval=1.0, max_pending=10_000, flush_at_exit=False)
    batcher.validate(COUNTER, 0)
    started = time.perf_counter()
    for k in plan:
        batcher.incr(COUNTER, k)
    batcher.close()  # everything written to PostgreSQL
    return time.perf_counter() - started, env.pgc_values(KEYS)


def _incr_zincrby(env: _Env, plan: list[int]) -> tuple[float, dict[int, int]]:
    started = time.perf_counter()
    for k in plan:
        env.redis.zincrby(REFERENCE_ZSET, 1, str(k))
    seconds = time.perf_counter() - started
    scores: list[tuple[Any, float]] = env.redis.zrange(REFERENCE_ZSET, 0, -1, withscores=True)  # type: ignore[assignment]
    return seconds, {int(m): int(s) for m, s in scores}


def _incr_redis(env: _Env, plan: list[int]) -> tuple[float, dict[int, int]]:
    with env.buffer() as buf:
        buf.field(COUNTER, 0)
        started = time.perf_counter()
        for k in plan:
            buf.incr(COUNTER, k)
        seconds = time.perf_counter() - started
        values = {k: v for k in range(KEYS) if (v := buf.get(COUNTER, k))}
    return seconds, values


INCR_VARIANTS: dict[str, IncrVariant] = {
    "incr: update (reference)": _incr_update,
    "incr: direct queue": _incr_direct,
    "incr: batching": _incr_batching,
    "incr: zincrby (reference)": _incr_zincrby,
    "incr: redis buffer": _incr_redis,
}


def _flush_values(keys: int) -> dict[int, int]:
    return {k: k % 5 + 1 for k in range(keys)}


def _flush_reference(env: _Env, keys: int) -> tuple[float, dict[int, int]]:
    with env.redis.pipeline(transaction=False) as pipe:
        for k, v in _flush_values(keys).items():
            pipe.zincrby(REFERENCE_ZSET, v, str(k))
        pipe.execute()
    stmt = _query("reference_unread_incr")
    started = time.perf_counter()
    # the reference management command, as published
    members: list[bytes] = env.redis.zrange(REFERENCE_ZSET, 0, -1)  # type: ignore[assignment]
    for member in members:
        with env.redis.pipeline() as pipe:
            pipe.zscore(REFERENCE_ZSET, member)
            pipe.zrem(REFERENCE_ZSET, member)
            count, _ = pipe.execute()
        count = int(count)
        if not count:
            continue
        env.conn.execute(stmt, (count, int(member)))
    return time.perf_counter() - started, env.reference_values()


def _fill_buffer(env: _Env, buf: RedisBuffer, keys: int) -> None:
    items = [(COUNTER, k, v) for k, v in _flush_values(keys).items()]
    for start in range(0, len(items), 1000):
        buf.incr_many(items[start : start + 1000])


def _flush_pgc(env: _Env, keys: int, *, drain: bool) -> tuple[float, dict[int, int]]:
    with env.buffer() as buf:
        _fill_buffer(env, buf, keys)
        started = time.perf_counter()
        result = buf.flush()
        if drain:
            env.pc.drain()
        seconds = time.perf_counter() - started
        if result.keys != keys or buf.pending() != (0, 0):
            return seconds, {}
    if drain and env.pc.pending() != (0, 0):
        return seconds, {}
    return seconds, env.pgc_values(keys)


FlushVariant = Callable[[_Env, int], tuple[float, dict[int, int]]]
FLUSH_VARIANTS: dict[str, FlushVariant] = {
    "flush: reference loop": _flush_reference,
    "flush: redis buffer": lambda env, keys: _flush_pgc(env, keys, drain=False),
    "flush: redis buffer + drain": lambda env, keys: _flush_pgc(env, keys, drain=True),
}


def redis_buffer(
    dsn: str,
    repeat: int,
    quick: bool,
    *,
    increments: int | None = None,
    flush_keys: int | None = None,
) -> Scenario:
    increments = increments or (2_000 if quick else 20_000)
    flush_keys = flush_keys or (2_000 if quick else 20_000)
    scenario = Scenario(
        "redis-buffer",
        f"One Python process: {increments} increments over {KEYS} keys through each path "
        f"(operations = increments), and flushes of {flush_keys} distinct keys from Redis "
        "to PostgreSQL (operations = keys).",
        unit="operations",
    )
    scenario.headline = ("incr: redis buffer", "incr: zincrby (reference)")
    rng = random.Random(3)
    plan = [rng.randrange(KEYS) for _ in range(increments)]
    expected = dict(Tally(plan))
    flush_expected = _flush_values(flush_keys)
    with redis_for_bench() as url:
        env = _Env(dsn, url, flush_keys)
        try:
            for _ in range(repeat):
                for name, incr in INCR_VARIANTS.items():
                    env.reset()
                    seconds, values = incr(env, plan)
                    scenario.add(name, Measurement(seconds, increments, values == expected))
                for name, flush in FLUSH_VARIANTS.items():
                    env.reset()
                    seconds, values = flush(env, flush_keys)
                    scenario.add(name, Measurement(seconds, flush_keys, values == flush_expected))
            env.reset()
        finally:
            env.close()
    scenario.compare(COMPARISONS)
    return scenario
