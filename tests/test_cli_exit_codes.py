"""The command line's contract: each documented exit code from a real case, bad usage of
every verb group as one line and exit 2 before any database is opened, and the notice of
the embedded server."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import blog_schema
from pgcounters import Counters, cli, triggers
from pgcounters.connection import Conn
from support import tamper

NOTICE = re.compile(
    r"^pgcounters: no --dsn, PGCOUNTERS_DSN or DATABASE_URL: starting the embedded "
    r"PostgreSQL server, "
    r"its data in (?P<path>.+)$"
)


def run(capsys: pytest.CaptureFixture[str], dsn: str, *argv: str) -> tuple[int, str, str]:
    code = cli.run(["--dsn", dsn, *argv])
    out, err = capsys.readouterr()
    return code, out, err


def no_dsn_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PGCOUNTERS_DSN", "DATABASE_URL")}
    return {**env, **extra}


def test_every_documented_exit_code_comes_from_a_real_case(
    dsn: str, conn: Conn, pc: Counters, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(capsys, dsn, "install")[0] == cli.EXIT_OK == 0
    code, _, err = run(capsys, dsn, "incr", "missing")
    assert (code, err.count("\n")) == (cli.EXIT_ERROR, 1)
    with pytest.raises(SystemExit) as usage:
        run(capsys, dsn, "incr")
    assert usage.value.code == cli.EXIT_USAGE == 2
    pc.create_counter("c", int)
    pc.incr_many([("c", k, 1) for k in range(5)])
    bound = ("--batch-size", "2", "--max-batch-size", "2", "--max-batches", "1")
    assert run(capsys, dsn, "drain", *bound)[0] == 3
    assert cli.EXIT_MORE == 3
    run(capsys, dsn, "quota", "define", "q", "--limit", "1")
    assert run(capsys, dsn, "quota", "call", "q", "s")[0] == cli.EXIT_OK
    assert run(capsys, dsn, "quota", "call", "q", "s")[0] == cli.EXIT_REFUSED == 4
    blog_schema.create(conn)
    triggers.install(conn, blog_schema.specs())
    conn.execute("INSERT INTO blog_comment (article_id, creator_id) VALUES (1, 1)")
    assert run(capsys, dsn, "verify")[0] == cli.EXIT_OK
    tamper(conn, "UPDATE blog_article SET public_comments = public_comments + 1")
    assert run(capsys, dsn, "verify")[0] == cli.EXIT_DRIFT == 5


def test_interrupted_exits_130(dsn: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgcounters", "--dsn", dsn, "status", "--serve", "0"],
        env=no_dsn_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("serving /metrics")  # it is serving: interrupt it
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert (proc.returncode, err) == (cli.EXIT_INTERRUPTED, "pgcounters: interrupted\n")


def test_sigterm_stops_the_status_server_cleanly(dsn: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgcounters", "--dsn", dsn, "status", "--serve", "0"],
        env=no_dsn_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("serving /metrics")
    proc.send_signal(signal.SIGTERM)  # how a service manager stops it
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out, err) == (cli.EXIT_OK, "stopped\n", "")


# one bad command line per verb group, each refused by an argument type or a check of the
# options together; no --dsn and no PGCOUNTERS_DSN, so a database opened would show
BAD_USAGE = {
    "operations": ["drain", "--batch-size", "0"],
    "operations (seconds)": ["wakeup", "on", "--interval", "-1"],
    "operations (worker)": ["worker", "--min-interval", "0"],
    "operations (worker intervals)": ["worker", "--min-interval", "1", "--max-interval", "0.5"],
    "operations (port)": ["status", "--serve", "70000"],
    "operations (bind without serve)": ["status", "--bind", "0.0.0.0"],
    "operations (interval without on)": ["wakeup", "off", "--interval", "1"],
    "operations (interval over an hour)": ["wakeup", "on", "--interval", "7200"],
    "counters": ["top", "c", "-n", "-1"],
    "counters (backfill)": ["backfill", "--batch-size", "many"],
    "quotas": ["quota", "call", "q", "s", "--at", "yesterday"],
    "quotas (window)": ["quota", "define", "q", "--window", "fortnight"],
    "quotas (duration)": ["quota", "purge", "--older-than", "month"],
    "quotas (too long ago)": ["quota", "purge", "--older-than", "900000000d"],
    "repair": ["verify", "--show", "-1"],
    "repair (quarantine)": ["quarantine", "replay"],
    "repair (recount)": ["recount", "--batch-size", "0"],
    "security": ["grant"],
    "demos": ["bench", "--repeat", "0"],
    "demos (scenario)": ["bench", "no-such-scenario"],
    "no verb": [],
    "unknown verb": ["frobnicate"],
}


@pytest.mark.parametrize("argv", BAD_USAGE.values(), ids=BAD_USAGE.keys())
def test_bad_usage_of_each_verb_group_is_one_line_and_exit_2(
    argv: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name in ("PGCOUNTERS_DSN", "DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SystemExit) as usage:
        cli.run(["--data-dir", str(tmp_path / "data"), *argv])
    out, err = capsys.readouterr()
    assert usage.value.code == cli.EXIT_USAGE
    assert out == ""
    assert err.count("\n") == 1
    assert re.match(r"pgcounters( [a-z]+)*: error: .+ \(see `pgcounters( [a-z]+)* --help`\)$", err)
    assert "embedded" not in err
    assert not (tmp_path / "data").exists()  # no server was started for it


def test_bad_usage_from_the_console_script_has_no_traceback(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pgcounters", "drain", "--time-limit", "soon"],
        env=no_dsn_env(PGCOUNTERS_DATA_DIR=str(tmp_path / "data")),
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert (done.returncode, done.stdout) == (cli.EXIT_USAGE, "")
    assert done.stderr == (
        "pgcounters drain: error: --time-limit must be a number of seconds, got 'soon' "
        "(see `pgcounters drain --help`)\n"
    )


def test_library_errors_keep_exit_1_after_the_usage_checks(
    dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # well-formed arguments a library rule refuses: an error of pgcounters, not of usage
    code, _, err = run(capsys, dsn, "quota", "define", "q", "--window", "2h", "--time-zone", "X/Y")
    assert (code, err.startswith("pgcounters: error: ")) == (cli.EXIT_ERROR, True)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = str(taken.getsockname()[1])
        code, _, err = run(capsys, dsn, "status", "--serve", busy)
    assert (code, err.startswith("pgcounters: error: cannot serve status on")) == (1, True)
    code, _, err = run(capsys, dsn, "backfill", "nope")
    assert (code, "no backfill is pending for nope" in err) == (cli.EXIT_ERROR, True)


def test_without_a_dsn_a_command_says_it_starts_the_embedded_server(server_folder: Path) -> None:
    data = server_folder / "data"
    env = no_dsn_env(PGCOUNTERS_DATA_DIR=str(data))
    done = subprocess.run(
        [sys.executable, "-m", "pgcounters", "install"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    [notice] = [m for m in map(NOTICE.match, done.stderr.splitlines()) if m]
    assert Path(notice["path"]) == data.absolute()
    assert done.stdout.startswith("installed the pgcounters schema")  # stdout is the output
    # `server` says which database it runs itself: no notice
    server = subprocess.Popen(
        [sys.executable, "-m", "pgcounters", "server"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert server.stdout is not None
    printed = server.stdout.readline().strip()
    assert printed.startswith("PGCOUNTERS_DSN=")
    assert server.stdout.readline().startswith("serving")
    # with a DSN, a command runs on it and says nothing of an embedded server
    version = subprocess.run(
        [sys.executable, "-m", "pgcounters", "--dsn", printed.partition("=")[2].strip("'"),
         "version"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    server.send_signal(signal.SIGINT)
    _, err = server.communicate(timeout=120)
    assert (version.returncode, version.stderr) == (0, ""), version.stderr
    assert version.stdout.startswith("package ")
    assert server.returncode == cli.EXIT_INTERRUPTED, err
    assert "embedded" not in err
