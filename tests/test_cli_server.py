"""`pgcounters server` as a shell script runs it: in the background of a non-interactive
shell (which starts it with SIGINT ignored), its DSN read from `--dsn-file`, stopped by
SIGINT or SIGTERM, leaving no PostgreSQL running."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from pgcounters import cli

# Start the server in the background as a script would, wait for its DSN file, connect
# with the DSN, send the signal, and say how the server ended. A server still running 60 s
# after the signal is reported, then killed, so that a failing test leaves nothing behind.
SCRIPT = r"""
rm -f "$DSN_FILE"
pgcounters server --dsn-file "$DSN_FILE" >"$OUT" 2>"$ERR" &
pid=$!
for _ in $(seq 1200); do
    [ -s "$DSN_FILE" ] && break
    kill -0 "$pid" 2>/dev/null || { echo "server-died"; exit 0; }
    sleep 0.1
done
[ -s "$DSN_FILE" ] || { echo "no-dsn-file"; kill -KILL "$pid"; exit 0; }
dsn=$(cat "$DSN_FILE")
echo "dsn=$dsn"
head -n 1 "$DATA_DIR/postmaster.pid" | sed 's/^/postmaster=/'
python -c "$CONNECT" "$dsn"
kill -"$SIGNAL" "$pid"
for _ in $(seq 600); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
done
if kill -0 "$pid" 2>/dev/null; then
    echo "still-running"
    kill -KILL "$pid"
    exit 0
fi
wait "$pid"
echo "exit=$?"
[ -e "$DSN_FILE" ] && echo "dsn-file-left"
exit 0
"""
CONNECT = """
import sys, psycopg
print("select", psycopg.connect(sys.argv[1]).execute("SELECT 41 + 1").fetchone()[0])
"""


def run_script(tmp_path: Path, signal_name: str, *, extra_env: dict[str, str]) -> dict[str, str]:
    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if k not in ("PGCOUNTERS_DSN", "DATABASE_URL")} | {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PGCOUNTERS_DATA_DIR": str(data),
        "DSN_FILE": str(tmp_path / "run" / "dsn"),
        "DATA_DIR": str(data),
        "OUT": str(tmp_path / "out"),
        "ERR": str(tmp_path / "err"),
        "SIGNAL": signal_name,
        "CONNECT": CONNECT,
        **extra_env,
    }
    (tmp_path / "run").mkdir()
    try:
        done = subprocess.run(
            ["bash", "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300, check=True
        )
    finally:
        with contextlib.suppress(FileNotFoundError):  # the test failed: leave nothing running
            os.kill(int((data / "postmaster.pid").read_text().split()[0]), signal.SIGINT)
    said = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    flags = {line for line in done.stdout.splitlines() if "=" not in line}
    said["flags"] = " ".join(sorted(flags))
    said["out"] = (tmp_path / "out").read_text()
    said["err"] = (tmp_path / "err").read_text()
    return said


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs: a zombie (ended, its parent not told yet) does not."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def assert_stopped(said: dict[str, str]) -> None:
    """The postmaster that served is gone, and its DSN no longer connects."""
    assert not alive(int(said["postmaster"]))
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(said["dsn"], connect_timeout=5)


@pytest.mark.parametrize(
    ("signal_name", "code"), [("INT", cli.EXIT_INTERRUPTED), ("TERM", cli.EXIT_OK)]
)
def test_a_background_server_of_a_script_stops_on_sigint_and_sigterm(
    tmp_path: Path, signal_name: str, code: int
) -> None:
    said = run_script(tmp_path, signal_name, extra_env={})
    assert said["flags"] == "select 42", said
    assert int(said["exit"]) == code, said
    assert said["dsn"].startswith("host=127.0.0.1 port=")
    # stdout: the DSN for a person, then (on SIGTERM) that it stopped
    lines = said["out"].splitlines()
    assert lines[:2] == [
        f"PGCOUNTERS_DSN='{said['dsn']}'",
        "serving; Ctrl-C (SIGINT) or SIGTERM stops it",
    ]
    if signal_name == "TERM":
        assert (lines[2:], said["err"]) == (["stopped"], "")
    else:
        assert (lines[2:], said["err"]) == ([], "pgcounters: interrupted\n")
    assert_stopped(said)
    assert not (tmp_path / "data" / "postmaster.pid").exists()


def test_a_server_on_a_given_dsn_writes_it_and_stops_nothing(tmp_path: Path, dsn: str) -> None:
    """With a DSN, `server` checks that it accepts connections, writes it, and on SIGTERM
    leaves that server running."""
    said = run_script(tmp_path, "TERM", extra_env={"PGCOUNTERS_DSN": dsn, "DATA_DIR": "/dev/null"})
    assert (said["dsn"], said["flags"], said["exit"]) == (dsn, "select 42", "0"), said
    assert said["out"].splitlines()[-1] == "stopped"
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert not (tmp_path / "data").exists()  # no embedded server was started


def test_a_dsn_file_in_a_missing_folder_is_bad_usage(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PGCOUNTERS_DSN", "DATABASE_URL")}
    done = subprocess.run(
        [sys.executable, "-m", "pgcounters", "--data-dir", str(tmp_path / "data"), "server",
         "--dsn-file", str(tmp_path / "nowhere" / "dsn")],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == cli.EXIT_USAGE
    assert done.stderr.startswith("pgcounters server: error: --dsn-file ")
    assert f"no folder {tmp_path / 'nowhere'}" in done.stderr
    assert not (tmp_path / "data").exists()  # refused before any server was started
