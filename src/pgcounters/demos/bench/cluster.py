"""The Redis buffer on one Redis server and on a Redis Cluster of three masters.

Both run on this machine (the cluster is started from the bundled redis-server,
AOF off like the single server), so the figures show what the cluster client and
the slots cost, not what more machines would add: on a cluster the load of one
buffer is spread over the masters that hold its slots.
"""

from __future__ import annotations

import random
import shutil
import tempfile
import time
from collections import Counter as Tally
from pathlib import Path

from pgcounters.client import Counters
from pgcounters.config import connect
from pgcounters.demos.bench.report import Comparison, Measurement, Scenario
from pgcounters.demos.redis_server import EmbeddedRedis, EmbeddedRedisCluster
from pgcounters.redis_buffer import RedisBuffer
from pgcounters.schema import install

COUNTER = "bench.cluster"
KEYS = 1000
VARIANTS = (
    "incr: one server",
    "incr: cluster, 16 slots",
    "flush: one server",
    "flush: cluster, 16 slots",
    "flush: cluster, 3 slots",
)
COMPARISONS: tuple[Comparison, ...] = (
    ("incr: cluster, 16 slots", "incr: one server", None),
    ("flush: cluster, 16 slots", "flush: one server", None),
    ("flush: cluster, 3 slots", "flush: one server", None),
)


def redis_cluster(dsn: str, repeat: int, quick: bool) -> Scenario:
    increments = 2_000 if quick else 20_000
    scenario = Scenario(
        "redis-cluster",
        f"One Python process: {increments:,} increments over {KEYS:,} keys into a Redis buffer "
        "(operations = increments), then one flush of what they left (operations = keys): "
        "on one Redis server, and on a Redis Cluster of 3 masters with the buffer spread over "
        "16 or 3 hash slots (a flush is one PostgreSQL transaction per slot).",
        unit="operations",
    )
    scenario.headline = ("incr: cluster, 16 slots", "incr: one server")
    rng = random.Random(11)
    plan = [rng.randrange(KEYS) for _ in range(increments)]
    expected = Tally(plan)
    folder = Path(tempfile.mkdtemp(prefix="pgcounters-bench-cluster-"))
    try:
        with (
            EmbeddedRedis(folder / "single") as single,
            EmbeddedRedisCluster(folder / "cluster", persistence="none") as cluster,
            connect(dsn) as conn,
        ):
            install(conn)
            pc = Counters(conn)
            urls = {"one server": (single.url(), None), "cluster, 16 slots": (cluster.url(), 16)}
            flush_urls = {**urls, "cluster, 3 slots": (cluster.url(), 3)}
            for run in range(repeat):
                for where, (url, slots) in flush_urls.items():
                    pc.drop_counter(COUNTER)
                    pc.create_counter(COUNTER, key=int)
                    name = f"b{run}{len(where)}{slots}"
                    with RedisBuffer(dsn, url, name=name, slots=slots) as buf:
                        buf.field(COUNTER, 0)
                        started = time.perf_counter()
                        for key in plan:
                            buf.incr(COUNTER, key)
                        seconds = time.perf_counter() - started
                        if where in urls:
                            scenario.add(f"incr: {where}", Measurement(seconds, increments))
                        started = time.perf_counter()
                        result = buf.flush()
                        seconds = time.perf_counter() - started
                        exact = result.keys == len(expected) and buf.pending() == (0, 0)
                    values = pc.get_many(COUNTER, range(KEYS))
                    exact = exact and values == [expected[k] for k in range(KEYS)]
                    scenario.add(f"flush: {where}", Measurement(seconds, len(expected), exact))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    scenario.runs = {v: scenario.runs[v] for v in VARIANTS}
    scenario.compare(COMPARISONS)
    return scenario
