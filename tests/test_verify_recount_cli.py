"""``pgcounters verify`` and ``recount``: drift found, repaired, resumed, after a crash."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import random
import select
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from typing import Any

import psycopg
import pytest

import blog_schema
import truth
from pgcounters import Counters, cli, install, triggers
from pgcounters.connection import Conn
from pgcounters.embedded import EmbeddedPostgres
from pgcounters.repair import verify
from pgcounters.specs import CounterSpec
from support import tamper

ARTICLE = "blog.article.public_comments"
TOTAL = "blog.comments_total"


@pytest.fixture
def blog(conn: Conn) -> list[CounterSpec]:
    """The blog schema with every kind of declared counter, some comments, drained."""
    blog_schema.create(conn)
    specs = blog_schema.specs()
    triggers.install(conn, specs)
    conn.execute(
        "INSERT INTO blog_comment (article_id, creator_id, publish_status, score)"
        " SELECT 1 + g % 5, 1 + g % 3, CASE WHEN g % 3 = 0 THEN 'private' ELSE 'public' END, g"
        " FROM generate_series(1, 200) g"
    )
    Counters(conn).drain()
    return specs


def run(
    capsys: pytest.CaptureFixture[str], dsn: str, *argv: str
) -> tuple[int, str, str]:  # exit code, stdout, stderr
    code = cli.run(["--dsn", dsn, *argv])
    out, err = capsys.readouterr()
    return code, out, err


TRUTHS = blog_schema.truths()


def off_keys(conn: Conn) -> set[tuple[str, Any]]:
    """(counter, key) of every exact value the hand-written truth finds wrong."""
    return {(m.counter, m.key) for t in TRUTHS for m in truth.exact_mismatches(conn, t)}


def env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PGCOUNTERS_DSN", "DATABASE_URL")}


def test_verify_finds_tampering_and_recount_repairs_it(
    dsn: str,
    conn: Conn,
    blog: list[CounterSpec],
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(capsys, dsn, "verify")
    assert code == cli.EXIT_OK
    assert f"{ARTICLE}: 5 keys checked, 0 off" in out
    assert "all exact: 5 counters" in out
    # an operator's direct UPDATE of stored values: a column counter and a named one
    tamper(conn, "UPDATE blog_article SET public_comments = public_comments + 7 WHERE id = 2")
    conn.execute(
        "UPDATE pgcounters.counters SET value = value - 3 WHERE target_id ="
        " (SELECT id FROM pgcounters.targets WHERE name = %s)",
        (TOTAL,),
    )
    public = conn.execute(
        "SELECT count(*) FILTER (WHERE publish_status = 'public') FROM blog_comment"
        " WHERE article_id = 2"
    ).fetchone()
    assert public is not None
    assert off_keys(conn) == {(ARTICLE, (2,)), (TOTAL, ())}
    code, out, _ = run(capsys, dsn, "verify")
    assert code == cli.EXIT_DRIFT == 5
    assert f"{ARTICLE}: 5 keys checked, 1 off" in out
    assert f"  key 2: stored + pending {public[0] + 7}, truth {public[0]} (+7)" in out
    assert f"{TOTAL}: 1 keys checked, 1 off" in out
    assert "  key -: stored + pending 197, truth 200 (-3)" in out
    assert "drift found in 2 of 5 counters" in out
    code, out, _ = run(capsys, dsn, "verify", "--json")
    report = json.loads(out)
    assert (code, report["drift"], report["exit_code"]) == (5, True, 5)
    by_name = {c["name"]: c for c in report["counters"]}
    assert by_name[ARTICLE]["differences"] == [
        {"key": [2], "expected": public[0], "actual": public[0] + 7, "difference": 7}
    ]
    assert by_name["blog.user.public_comments"]["keys_off"] == 0
    # one exact counter alone exits 0
    assert run(capsys, dsn, "verify", "blog.user.public_comments")[0] == cli.EXIT_OK
    # repair only the column counter: the named one still drifts
    code, out, _ = run(capsys, dsn, "recount", ARTICLE, "--batch-size", "2")
    assert code == cli.EXIT_OK
    assert f"{ARTICLE}: 5 keys in 3 batches, 1 fixed" in out
    assert run(capsys, dsn, "verify", ARTICLE)[0] == cli.EXIT_OK
    assert off_keys(conn) == {(TOTAL, ())}
    assert run(capsys, dsn, "verify")[0] == cli.EXIT_DRIFT
    code, out, err = run(capsys, dsn, "recount")
    assert code == cli.EXIT_OK
    assert f"{TOTAL}: 1 keys in 1 batches, 1 fixed" in out
    assert err == ""  # not a terminal: no progress bar
    assert run(capsys, dsn, "verify")[0] == cli.EXIT_OK
    truth.assert_drained(conn, TRUTHS)


def test_verify_samples_shows_few_differences_and_refuses_unknown_counters(
    dsn: str,
    conn: Conn,
    blog: list[CounterSpec],
    capsys: pytest.CaptureFixture[str],
) -> None:
    tamper(conn, "UPDATE blog_article SET public_comments = public_comments + 1")
    assert off_keys(conn) == {(ARTICLE, (k,)) for k in range(1, 6)}
    code, out, _ = run(capsys, dsn, "verify", ARTICLE, "--sample", "3", "--show", "1")
    assert code == cli.EXIT_DRIFT
    assert f"{ARTICLE}: 3 keys checked, 3 off" in out
    assert "  ... and 2 more" in out
    assert "(samples of 3 keys)" in out
    code, _, err = run(capsys, dsn, "verify", "no.such.counter")
    assert code == cli.EXIT_ERROR
    assert "no declared counter named no.such.counter" in err
    with pytest.raises(SystemExit) as usage:
        run(capsys, dsn, "verify", "--sample", "0")
    assert usage.value.code == cli.EXIT_USAGE


def test_verify_and_recount_with_no_declared_counters(
    dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, dsn, "verify")
    assert (code, out.strip()) == (0, "no declared counters are recorded in this database")
    assert run(capsys, dsn, "recount")[0] == 0


def test_recount_takes_key_ranges(
    dsn: str,
    conn: Conn,
    blog: list[CounterSpec],
    capsys: pytest.CaptureFixture[str],
) -> None:
    tamper(conn, "UPDATE blog_article SET public_comments = 1000")

    def wrong() -> list[int]:
        rows = conn.execute(
            "SELECT id FROM blog_article WHERE public_comments = 1000 ORDER BY id"
        ).fetchall()
        return [int(r[0]) for r in rows]

    code, out, _ = run(capsys, dsn, "recount", ARTICLE, "--key-from", "2", "--key-to", "3")
    assert code == 0
    assert f"{ARTICLE}: 2 keys in [2, 3] in 1 batches, 2 fixed" in out
    assert wrong() == [1, 4, 5]
    assert off_keys(conn) == {(ARTICLE, (k,)) for k in (1, 4, 5)}
    assert run(capsys, dsn, "recount", ARTICLE, "--key-from", "5")[0] == 0
    assert wrong() == [1, 4]
    # every keyed counter at once; the global one has no key to range over
    code, out, _ = run(capsys, dsn, "recount", "--key-to", "1")
    assert code == 0
    assert TOTAL not in out
    assert wrong() == [4]
    code, _, err = run(capsys, dsn, "recount", TOTAL, "--key-to", "1")
    assert code == cli.EXIT_ERROR
    assert "has no key" in err
    code, _, err = run(capsys, dsn, "recount", ARTICLE, "--key-from", "four")
    assert code == cli.EXIT_ERROR
    assert "'four' is not a valid bigint" in err
    # a range whose ends are swapped holds no key: refused, not reported as a recount of 0
    code, out, err = run(capsys, dsn, "recount", ARTICLE, "--key-from", "5", "--key-to", "1")
    assert (code, out) == (cli.EXIT_ERROR, "")
    assert "the key range from 5 to 1 is empty" in err
    assert wrong() == [4]
    assert off_keys(conn) == {(ARTICLE, (4,))}
    with pytest.raises(SystemExit) as usage:
        run(capsys, dsn, "recount", ARTICLE, "--batch-size", "0")
    assert usage.value.code == cli.EXIT_USAGE


def test_recount_while_writers_and_a_drainer_run_ends_exact(
    dsn: str,
    conn: Conn,
    blog: list[CounterSpec],
    capsys: pytest.CaptureFixture[str],
) -> None:
    tamper(conn, "UPDATE blog_article SET public_comments = 1000, score_total = -5")
    conn.execute("UPDATE pgcounters.counters SET value = value + 11")
    stop = threading.Event()
    errors: list[BaseException] = []
    writes = [0]

    def writer(seed: int) -> None:
        rng = random.Random(seed)
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                while not stop.is_set():
                    c.execute(
                        "INSERT INTO blog_comment (article_id, creator_id, publish_status, score)"
                        " VALUES (%s, %s, %s, %s)",
                        (rng.randint(1, 5), rng.randint(1, 5), rng.choice(["public", "x"]), 2),
                    )
                    c.execute(
                        "UPDATE blog_comment SET publish_status = %s, article_id = %s"
                        " WHERE id = %s",
                        (rng.choice(["public", "x"]), rng.randint(1, 5), rng.randint(1, 250)),
                    )
                    writes[0] += 1
        except BaseException as exc:
            errors.append(exc)

    def drainer() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                pc = Counters(c)
                while not stop.is_set():
                    pc.drain(batch_size=7, max_batches=2)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(2)]
    threads.append(threading.Thread(target=drainer))
    for t in threads:
        t.start()
    try:
        while writes[0] < 20 and not errors:
            time.sleep(0.01)
        code, out, _ = run(capsys, dsn, "recount", "--batch-size", "1")
        during = writes[0]
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert errors == []
    assert code == 0
    assert out.count(" fixed") == 5
    assert writes[0] > 20  # the writers kept writing while the recount ran
    assert during > 20
    # stored + pending is exact at once, and stays so once the queue is drained
    truth.assert_exact(conn, TRUTHS)
    truth.assert_drained(conn, TRUTHS)
    assert run(capsys, dsn, "verify")[0] == cli.EXIT_OK


def _spawn_recount(dsn: str, *args: str, **kwargs: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "pgcounters", "--dsn", dsn, "recount", *args],
        env=env(),
        **kwargs,
    )


def test_an_interrupted_recount_resumes_where_it_stopped(
    dsn: str, conn: Conn, capsys: pytest.CaptureFixture[str]
) -> None:
    blog_schema.create(conn, articles=3000)
    spec = blog_schema.specs()[0]
    triggers.install(conn, [spec])
    tamper(conn, "UPDATE blog_article SET public_comments = 1")  # every key is wrong
    proc = _spawn_recount(
        dsn, ARTICLE, "--batch-size", "1", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 120
        done = 0
        while done < 50:  # some batches committed
            assert time.monotonic() < deadline
            assert proc.poll() is None, "the recount ended before it could be interrupted"
            row = conn.execute(
                "SELECT keys_done FROM pgcounters.recounts WHERE name = %s", (ARTICLE,)
            ).fetchone()
            done = int(row[0]) if row else 0
            time.sleep(0.02)
        proc.kill()  # kill -9: no chance to clean up
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    row = conn.execute(
        "SELECT keys_done, cursor_key, finished_at FROM pgcounters.recounts WHERE name = %s",
        (ARTICLE,),
    ).fetchone()
    assert row is not None
    before, cursor, finished = int(row[0]), row[1], row[2]
    assert 50 <= before < 3000
    assert finished is None
    fixed = conn.execute("SELECT count(*) FROM blog_article WHERE public_comments = 0").fetchone()
    assert fixed is not None
    assert fixed[0] == int(cursor[0])  # exactly the keys up to the cursor were repaired
    code, out, _ = run(capsys, dsn, "recount", ARTICLE, "--batch-size", "500")
    assert code == 0
    assert f"{ARTICLE}: {3000 - before} keys in" in out
    assert "(resumed)" in out
    truth.assert_drained(conn, TRUTHS[:1])
    assert verify(conn, spec).ok
    # finished: the next run starts from the first key again (and finds nothing to fix)
    code, out, _ = run(capsys, dsn, "recount", ARTICLE, "--batch-size", "500")
    assert f"{ARTICLE}: 3000 keys in 6 batches, 0 fixed\n" in out
    # --restart ignores an unfinished run
    conn.execute(
        "UPDATE pgcounters.recounts SET cursor_key = '{2000}', finished_at = NULL WHERE name = %s",
        (ARTICLE,),
    )
    assert "3000 keys" in run(capsys, dsn, "recount", ARTICLE, "--restart")[1]


def test_ctrl_c_stops_a_recount_with_exit_130_and_it_resumes(
    dsn: str, conn: Conn, capsys: pytest.CaptureFixture[str]
) -> None:
    blog_schema.create(conn, articles=3000)
    spec = blog_schema.specs()[0]
    triggers.install(conn, [spec])
    tamper(conn, "UPDATE blog_article SET public_comments = 1")
    proc = _spawn_recount(
        dsn, ARTICLE, "--batch-size", "1", stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            assert time.monotonic() < deadline
            assert proc.poll() is None, "the recount ended before it could be interrupted"
            row = conn.execute(
                "SELECT keys_done FROM pgcounters.recounts WHERE name = %s", (ARTICLE,)
            ).fetchone()
            if row and row[0] >= 20:
                break
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == cli.EXIT_INTERRUPTED == 130
    assert "interrupted; its committed batches stay done" in err.decode()
    assert out == b""
    code, text, _ = run(capsys, dsn, "recount", ARTICLE, "--batch-size", "1000")
    assert code == 0
    assert "(resumed)" in text
    truth.assert_drained(conn, TRUTHS[:1])
    assert verify(conn, spec).ok


def test_the_progress_bar_goes_to_a_terminal_only(
    dsn: str, conn: Conn, blog: list[CounterSpec]
) -> None:
    def recount_on_a_terminal(
        *extra: str, size: tuple[int, int] = (24, 100)
    ) -> tuple[int, str, str]:
        primary, secondary = pty.openpty()
        fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", *size, 0, 0))
        proc = _spawn_recount(
            dsn, ARTICLE, "--batch-size", "2", *extra, stdout=subprocess.PIPE, stderr=secondary
        )
        os.close(secondary)
        chunks: list[bytes] = []
        while True:
            ready, _, _ = select.select([primary], [], [], 60)
            if not ready:
                break
            try:
                data = os.read(primary, 4096)
            except OSError:  # the terminal closed with the process
                break
            if not data:
                break
            chunks.append(data)
        stdout, _ = proc.communicate(timeout=60)
        os.close(primary)
        return proc.returncode, stdout.decode(), b"".join(chunks).decode(errors="replace")

    code, out, terminal = recount_on_a_terminal()
    assert code == 0
    assert "5/5" in recount_on_a_terminal(size=(0, 0))[2]  # a terminal that reports no size
    narrow = recount_on_a_terminal(size=(24, 60))[2]  # the bar fits stderr's terminal
    assert max(len(line) for line in narrow.replace("\r", "\n").splitlines()) <= 60
    assert f"{ARTICLE}: 5 keys" in out
    assert ARTICLE in terminal
    assert "5/5" in terminal
    assert "100%" in terminal
    code, out, terminal = recount_on_a_terminal("--no-progress")
    assert code == 0
    assert f"{ARTICLE}: 5 keys" in out
    assert terminal == ""


@pytest.mark.slow
def test_recount_restores_exactness_after_a_crash_emptied_the_unlogged_queue(
    own_server: EmbeddedPostgres, capsys: pytest.CaptureFixture[str]
) -> None:
    dsn = own_server.dsn()
    specs = blog_schema.specs("unlogged")
    with psycopg.connect(dsn, autocommit=True) as conn:
        install(conn)
        blog_schema.create(conn)
        triggers.install(conn, specs)
        conn.execute(
            "INSERT INTO blog_comment (article_id, creator_id, publish_status, score)"
            " SELECT 1 + g % 5, 1 + g % 3, 'public', g FROM generate_series(1, 100) g"
        )
        Counters(conn).drain()
        conn.execute(
            "INSERT INTO blog_comment (article_id, creator_id, publish_status, score)"
            " SELECT 1 + g % 5, 1 + g % 3, 'public', g FROM generate_series(1, 60) g"
        )
        pending = conn.execute("SELECT count(*) FROM pgcounters.queue_unlogged").fetchone()
        assert pending is not None
        assert pending[0] > 0
        truth.assert_exact(conn, TRUTHS)
    own_server.restart("immediate")  # a crash: unlogged tables come back empty
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM pgcounters.queue_unlogged").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM blog_comment").fetchone() == (160,)
        lost = off_keys(conn)
        assert (TOTAL, ()) in lost
        code, out, _ = run(capsys, dsn, "verify", "--show", "1000")
        assert code == cli.EXIT_DRIFT
        assert "blog.comments_total: 1 keys checked, 1 off" in out
        assert "stored + pending 100, truth 160 (-60)" in out
        assert out.count("  key ") == len(lost)  # verify reports the keys the truth finds off
        assert run(capsys, dsn, "recount")[0] == 0
        truth.assert_exact(conn, TRUTHS)
        assert Counters(conn).get("blog.comments_total") == 160
        assert run(capsys, dsn, "verify")[0] == cli.EXIT_OK
