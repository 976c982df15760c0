"""``pgcounters flush``: one flush, and the worker mode stopped by SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pgcounters import Counters, cli
from pgcounters.demos.redis_server import EmbeddedRedis, free_port
from pgcounters.redis_buffer import RedisBuffer


@pytest.fixture
def server(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis(tmp_path / "redis") as running:
        yield running


def test_one_flush(
    dsn: str, server: EmbeddedRedis, pc: Counters, capsys: pytest.CaptureFixture[str]
) -> None:
    pc.create_counter("c", key=int)
    with RedisBuffer(dsn, server.url()) as buf:
        buf.incr("c", 1, 3)
        buf.incr("c", 2)
    code = cli.run(["--dsn", dsn, "flush", "--redis-url", server.url()])
    out = capsys.readouterr().out
    assert code == cli.EXIT_OK
    assert out.startswith("flushed 1 (2 keys, total 4)")
    assert "0 keys pending, 0 flushes in flight" in out
    assert pc.get("c", 1) == 3
    assert cli.run(["--dsn", dsn, "flush", "--redis-url", server.url()]) == cli.EXIT_OK
    assert capsys.readouterr().out.startswith("nothing to flush")


def test_flush_errors_exit_1(
    dsn: str, pc: Counters, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    nowhere = f"redis://127.0.0.1:{free_port()}/0"
    assert cli.run(["--dsn", dsn, "flush", "--redis-url", nowhere]) == cli.EXIT_ERROR
    assert "is unreachable" in capsys.readouterr().err
    monkeypatch.delenv("PGCOUNTERS_REDIS_URL", raising=False)
    assert cli.run(["--dsn", dsn, "flush"]) == cli.EXIT_ERROR
    assert "PGCOUNTERS_REDIS_URL" in capsys.readouterr().err
    monkeypatch.setenv("PGCOUNTERS_REDIS_URL", nowhere)
    with pytest.raises(SystemExit) as usage:
        cli.run(["--dsn", dsn, "flush", "--worker", "--interval", "0"])
    assert usage.value.code == cli.EXIT_USAGE
    assert "--interval must be positive" in capsys.readouterr().err


def test_the_worker_flushes_until_sigterm(dsn: str, server: EmbeddedRedis, pc: Counters) -> None:
    pc.create_counter("c")
    worker = subprocess.Popen(
        [sys.executable, "-m", "pgcounters", "--dsn", dsn, "flush", "--worker", "--interval",
         "0.05", "--redis-url", server.url()],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert worker.stdout is not None
        assert worker.stdout.readline().startswith("flushing Redis buffer 'default'")
        with RedisBuffer(dsn, server.url()) as buf:
            for _ in range(3):
                buf.incr("c", delta=5)
        deadline = time.monotonic() + 20
        while pc.get("c") != 15 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pc.get("c") == 15
        worker.send_signal(signal.SIGTERM)
        out, err = worker.communicate(timeout=20)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert worker.returncode == 0, err
    assert "stopped; in all: flushed" in out
    assert pc.get("c") == 15
