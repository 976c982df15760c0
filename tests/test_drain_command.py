"""``pgcounters drain`` as a cron job: bounds, exit codes, quiet and JSON output, signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psycopg
import pytest

from pgcounters import Counters, cli
from pgcounters.connection import Conn


def run(capsys: pytest.CaptureFixture[str], dsn: str, *args: str) -> tuple[int, str, str]:
    code = cli.run(["--dsn", dsn, "drain", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def queued(pc: Counters) -> Counters:
    pc.create_counter("c", int)
    pc.create_counter("u", int, mode="unlogged")
    pc.incr_many([("c", i, 1) for i in range(30)] + [("u", i, 2) for i in range(20)])
    return pc


def test_json_output_and_exit_0_when_emptied(
    dsn: str, queued: Counters, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, dsn, "--json", "--batch-size", "7", "--max-batch-size", "7")
    report = json.loads(out)
    assert code == report["exit_code"] == cli.EXIT_OK
    assert (report["deltas"], report["keys"], report["remaining"]) == (
        50, 50, {"logged": 0, "unlogged": 0},
    )  # fmt: skip
    # 30 in batches of 7, 20 in batches of 7 (an empty queue costs no batch)
    assert report["batches"] == 5 + 3
    assert report["stopped_by_signal"] is False
    assert queued.get("u", 3, exact=False) == 2


def test_a_bound_with_deltas_left_exits_3_and_the_queues_take_turns(
    dsn: str, queued: Counters, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(
        capsys, dsn, "--json", "--batch-size", "5", "--max-batch-size", "5", "--max-batches", "2"
    )
    report = json.loads(out)
    assert code == cli.EXIT_MORE
    # one batch from each queue, not two from the logged one
    assert report["remaining"] == {"logged": 25, "unlogged": 15}
    code, out, _ = run(capsys, dsn, "--quiet", "--time-limit", "600")
    assert (code, out) == (cli.EXIT_OK, "")


def test_quiet_prints_nothing_but_errors_still_show(
    dsn: str, empty_dsn: str, queued: Counters, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(capsys, dsn, "-q") == (0, "", "")
    code, out, err = run(capsys, empty_dsn, "-q")
    assert (code, out) == (cli.EXIT_ERROR, "")
    assert "pgcounters install" in err
    with pytest.raises(SystemExit) as usage:
        run(capsys, dsn, "--batch-size", "0")
    assert usage.value.code == cli.EXIT_USAGE
    assert "--batch-size must be a positive integer" in capsys.readouterr().err


def test_statement_timeout_aborts_a_stuck_batch_and_keeps_its_deltas(
    dsn: str, conn: Conn, pc: Counters, capsys: pytest.CaptureFixture[str]
) -> None:
    conn.execute("CREATE TABLE article (id bigint PRIMARY KEY, n bigint NOT NULL DEFAULT 0)")
    conn.execute("INSERT INTO article (id) VALUES (1)")
    pc.create_column_counter("article.n", "article", "n")
    pc.incr("article.n", 1)
    with psycopg.connect(dsn) as blocker:
        # a parent row held by another transaction is skipped, not waited for; a lock on
        # the queue itself (an operator's LOCK TABLE) makes the batch wait
        blocker.execute("LOCK TABLE pgcounters.queue IN SHARE MODE")
        code, _, err = run(capsys, dsn, "--statement-timeout", "0.2")
    assert code == cli.EXIT_ERROR
    assert "cancelled by the statement timeout" in err
    assert pc.pending() == (1, 0)


def test_sigterm_stops_after_the_current_batch_with_exit_3(
    dsn: str, conn: Conn, pc: Counters
) -> None:
    pc.create_counter("c", int)
    conn.execute(
        "INSERT INTO pgcounters.queue (target_id, key, delta)"
        " SELECT %s, ARRAY[(g %% 100)::text], 1 FROM generate_series(1, 300000) g",
        (pc.counter("c").id,),
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PGCOUNTERS_DSN", "DATABASE_URL")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgcounters", "--dsn", dsn, "drain", "--batch-size", "200",
         "--max-batch-size", "200", "--json"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while conn.execute("SELECT count(*) FROM pgcounters.drain_stats").fetchone() == (0,):
        assert time.monotonic() < deadline, "the drain did not start"
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == cli.EXIT_MORE, err.decode()
    report = json.loads(out)
    assert report["stopped_by_signal"] is True
    assert report["remaining"]["logged"] == 300_000 - report["deltas"] > 0
    assert pc.get("c", 5) == 3000
