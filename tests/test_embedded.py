from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from pgcounters import cli
from pgcounters.embedded import EmbeddedPostgres, running
from support import wait_for

as_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="only a server started as root runs as a user of its own"
)


@pytest.fixture
def data_dir(server_folder: Path) -> Path:
    return server_folder / "data"


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


def _postmaster(data_dir: Path) -> int | None:
    """The pid of a live postmaster on ``data_dir`` (read as root), or None."""
    try:
        pid = int((data_dir / "postmaster.pid").read_text().splitlines()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pid if _alive(pid) else None


def _alive(pid: int) -> bool:
    """Whether a process runs (an exited one nobody has reaped yet does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture
def closed_later(server_folder: Path) -> Iterator[Path]:
    """A data directory whose parent folder the test closes to other users once the server
    runs, as a pytest run started as root does to its base folder. Whatever the test's
    outcome, no server is left running on it."""
    data = server_folder / "closed" / "data"
    yield data
    pid = _postmaster(data)
    if pid is not None:  # the test failed with its server running: stop it like a crash
        os.kill(pid, signal.SIGQUIT)
        wait_for(lambda: not _alive(pid))


@as_root
def test_a_server_run_as_its_own_user_outlives_its_parent_folder_closed_to_others(
    closed_later: Path,
) -> None:
    server = EmbeddedPostgres(closed_later)
    server.start()
    closed_later.parent.chmod(0o700)  # the server's user may no longer go through it
    with psycopg.connect(server.dsn(), autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (x int); INSERT INTO kept VALUES (1)")
    server.restart("fast")
    with psycopg.connect(server.dsn()) as conn:
        assert conn.execute("SELECT x FROM kept").fetchall() == [(1,)]
    closed_later.parent.chmod(0o700)
    pid = _postmaster(closed_later)
    assert pid is not None
    server.stop()
    assert (_alive(pid), (closed_later / "postmaster.pid").exists()) == (False, False)
    closed_later.parent.chmod(0o700)  # closed while no server runs: the next start opens it
    with running(closed_later) as again, psycopg.connect(again.dsn()) as conn:
        assert conn.execute("SELECT x FROM kept").fetchall() == [(1,)]
    assert _postmaster(closed_later) is None


@as_root
def test_the_cli_server_stops_its_server_when_the_parent_folder_was_closed(
    closed_later: Path,
) -> None:
    """`pgcounters server` as root, then its data directory's parent closed to others: Ctrl-C
    still stops the server it started, and says nothing of an error."""
    env = {k: v for k, v in os.environ.items() if k not in ("PGCOUNTERS_DSN", "DATABASE_URL")}
    env["PGCOUNTERS_DATA_DIR"] = str(closed_later)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgcounters", "server"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("PGCOUNTERS_DSN=")
        assert proc.stdout.readline().startswith("serving")
        pid = _postmaster(closed_later)
        assert pid is not None
        closed_later.parent.chmod(0o700)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()
    assert (proc.returncode, err) == (cli.EXIT_INTERRUPTED, "pgcounters: interrupted\n")
    assert (_alive(pid), (closed_later / "postmaster.pid").exists()) == (False, False)
