"""A database of release 0.1.0 (tests/release/0.1.0.sql: schema version 30, populated by
tests/release/make_0_1_0.py) upgraded to this code with `pgcounters upgrade` while writers and
a drain of the old release keep running: nothing lost, nothing doubled. Every later schema
change must pass it."""

from __future__ import annotations

import datetime as dt
import subprocess
import threading
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from pgcounters import Counters, Quotas, upgrade
from pgcounters.sqlfiles import latest_version
from support import pg_tool, wait_for

pytestmark = pytest.mark.slow

RELEASE = Path(__file__).resolve().parent / "release" / "0.1.0.sql"
RELEASE_VERSION = 30


def _restore(dsn: str) -> None:
    p = conninfo_to_dict(dsn)
    subprocess.run(
        [pg_tool("psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1",
         "-h", str(p["host"]), "-p", str(p["port"]), "-U", str(p["user"]),
         "-d", str(p["dbname"]), "-f", str(RELEASE)],
        check=True, capture_output=True,
    )  # fmt: skip


class _Loop(threading.Thread):
    """One statement in a loop on a connection of its own until stopped; counts successes
    and keeps the errors."""

    def __init__(self, dsn: str, statement: str) -> None:
        super().__init__(daemon=True)
        self.dsn, self.statement = dsn, statement
        self.stop = threading.Event()
        self.done = 0
        self.errors: list[str] = []

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stop.is_set():
                try:
                    conn.execute(self.statement)
                    self.done += 1
                except psycopg.Error as exc:
                    self.errors.append(f"{type(exc).__name__}: {exc}")


def test_release_0_1_0_upgrades_under_writers_and_a_drain_exactly(empty_dsn: str) -> None:
    _restore(empty_dsn)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        row = conn.execute("SELECT max(version) FROM pgcounters.migrations").fetchone()
        assert row == (RELEASE_VERSION,)
        loops = [
            _Loop(empty_dsn, "SELECT pgcounters.incr('views', ARRAY['1'], 1)"),
            _Loop(empty_dsn, "INSERT INTO comment (article_id, public) VALUES (3, true)"),
            # the old release's drain: a batch of each queue, a transaction
            _Loop(
                empty_dsn,
                "SELECT pgcounters.drain_batch(10000), pgcounters.drain_batch(10000, true)",
            ),
        ]
        for loop in loops:
            loop.start()
        try:
            wait_for(lambda: all(loop.done >= 10 for loop in loops))
            applied = upgrade(conn)
            # and on for a while after it, against the upgraded schema
            done = [loop.done for loop in loops]
            wait_for(lambda: all(loop.done >= d + 10 for loop, d in zip(loops, done, strict=True)))
        finally:
            for loop in loops:
                loop.stop.set()
            for loop in loops:
                loop.join(timeout=60)
        assert applied == list(range(RELEASE_VERSION + 1, latest_version() + 1))
        assert [loop.errors for loop in loops] == [[], [], []]
        increments, comments = loops[0].done, loops[1].done
        assert increments > 0
        assert comments > 0
        pc = Counters(conn)
        # what release 0.1.0 held (make_0_1_0.py) and what the writers added
        assert pc.get_many("views", [1, 2]) == [13 + increments, 4]
        assert pc.get("hits", 7) == 5
        assert [pc.get("article.public_comments", a) for a in (1, 2, 3)] == [3, 1, comments]
        pc.drain()
        assert pc.pending() == (0, 0)
        assert pc.get_many("views", [1, 2], exact=False) == [13 + increments, 4]
        rows = conn.execute("SELECT id, public_comments FROM article ORDER BY id").fetchall()
        assert rows == [(1, 3), (2, 1), (3, comments)]
        at = dt.datetime(2026, 1, 1, 13, tzinfo=dt.UTC)
        assert Quotas(conn).status("api", "customer-1", at=at).used == 3
        # the flush in doubt is known: a retry of it is not applied again
        row = conn.execute(
            "SELECT pgcounters.record_flush('0123456789abcdef0123456789abcdef', 'buffer', 1, 2)"
        ).fetchone()
        assert row == (False,)
        # the triggers count after the upgrade
        conn.execute("INSERT INTO comment (article_id, public) VALUES (2, true), (2, false)")
        assert pc.get("article.public_comments", 2) == 2
