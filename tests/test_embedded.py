from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from pgcounters.embedded import EmbeddedPostgres, running


@pytest.fixture
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(tmp_path_factory.mktemp("embedded")) / "data"


def test_start_adopt_and_stop(data_dir: Path) -> None:
    first = EmbeddedPostgres(data_dir)
    dsn = first.start()
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    # a second handle (say, after the first owner was killed) adopts the running server
    second = EmbeddedPostgres(data_dir)
    assert second.start() == dsn
    second.stop()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(dsn, connect_timeout=2)
    second.stop()  # stopping twice is fine
    # the data survives a restart
    with running(data_dir) as again, psycopg.connect(again.dsn(), autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (x int)")
    with running(data_dir) as again, psycopg.connect(again.dsn()) as conn:
        assert conn.execute("SELECT count(*) FROM kept").fetchone() == (0,)


def test_the_cli_stops_its_server_on_exit(data_dir: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PGCOUNTERS_DSN", "DATABASE_URL")}
    env["PGCOUNTERS_DATA_DIR"] = str(data_dir)
    done = subprocess.run(
        [sys.executable, "-m", "pgcounters", "install"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "installed the pgcounters schema" in done.stdout
    assert (data_dir / "PG_VERSION").exists()
    assert not (data_dir / "postmaster.pid").exists()


def test_a_command_leaves_a_server_it_did_not_start_running(data_dir: Path) -> None:
    """A command run without a DSN beside `pgcounters server` on the same data directory
    uses that server and leaves it running for the programs connected to it."""
    env = {k: v for k, v in os.environ.items() if k not in ("PGCOUNTERS_DSN", "DATABASE_URL")}
    env["PGCOUNTERS_DATA_DIR"] = str(data_dir)
    with running(data_dir) as server, psycopg.connect(server.dsn(), autocommit=True) as conn:
        done = subprocess.run(
            [sys.executable, "-m", "pgcounters", "install"],
            env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "using the embedded PostgreSQL server already running (left running)" in done.stderr
        # the connection made before the command still works: the server was not stopped
        assert conn.execute("SELECT max(version) FROM pgcounters.migrations").fetchone() is not None
        assert (data_dir / "postmaster.pid").exists()
    assert not (data_dir / "postmaster.pid").exists()  # its starter stopped it
