"""Build the populated database of release 0.1.0 (schema version 30) and dump it as plain SQL
into ``0.1.0.sql`` beside this file: what tests/test_release_upgrade.py restores and upgrades.

Run once, with the code of release 0.1.0 checked out (the file is kept as it was made)::

    python tests/release/make_0_1_0.py

What it holds, as the test expects it (values written by hand in the test):

* named counter ``views`` (queued, int keys): key 1 stored 10 and pending +3, key 2 stored 4;
* named counter ``hits`` (unlogged): key 7 pending +5 (the unlogged queue);
* tables ``article`` (3 rows) and ``comment``; declared counter ``article.public_comments``
  (public comments per article, a counter column): article 1 has 2 public comments stored and
  1 pending, article 2 has 1 stored;
* quota ``api`` (10 a day): 3 calls of ``customer-1`` on 2026-01-01;
* buffer flush ``0123456789abcdef0123456789abcdef`` recorded (a Redis flush whose
  acknowledgement was lost).
"""

from __future__ import annotations

import datetime as dt
import subprocess
import tempfile
from pathlib import Path

import psycopg

from pgcounters import Counters, Quotas, install, triggers
from pgcounters.embedded import EmbeddedPostgres, binaries_dir
from pgcounters.specs import ColumnTarget, CounterSpec, Fragment, Table

HERE = Path(__file__).resolve().parent
PUBLIC = CounterSpec(
    name="article.public_comments",
    source=Table("comment"),
    keys=("article_id",),
    target=ColumnTarget(Table("article"), "public_comments"),
    where=Fragment("public = %s", (True,)),
)


def populate(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    install(conn)
    conn.execute(
        "CREATE TABLE article (id bigint PRIMARY KEY, public_comments bigint NOT NULL DEFAULT 0)"
    )
    conn.execute(
        "CREATE TABLE comment (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
        " article_id bigint NOT NULL REFERENCES article, public boolean NOT NULL)"
    )
    conn.execute("INSERT INTO article (id) SELECT generate_series(1, 3)")
    triggers.install(conn, [PUBLIC])
    conn.execute("INSERT INTO comment (article_id, public) VALUES (1, true), (1, true),"
                 " (1, false), (2, true)")  # fmt: skip
    pc = Counters(conn)
    pc.create_counter("views", key=int)
    pc.create_counter("hits", key=int, mode="unlogged")
    pc.incr_many([("views", 1, 10), ("views", 2, 4)])
    pc.drain()
    pc.incr("views", 1, 3)
    pc.incr("hits", 7, 5)
    conn.execute("INSERT INTO comment (article_id, public) VALUES (1, true)")
    quotas = Quotas(conn)
    quotas.define_quota("api", 10, window="day", time_zone="UTC")
    at = dt.datetime(2026, 1, 1, 12, tzinfo=dt.UTC)
    for _ in range(3):
        assert quotas.register_call("api", "customer-1", at=at).allowed
    row = conn.execute(
        "SELECT pgcounters.record_flush('0123456789abcdef0123456789abcdef', 'buffer', 1, 2)"
    ).fetchone()
    assert row == (True,)


def main() -> None:
    with (
        tempfile.TemporaryDirectory(prefix="pgcounters-release-") as folder,
        EmbeddedPostgres(Path(folder) / "data") as server,
    ):
        with psycopg.connect(server.dsn(), autocommit=True) as conn:
            conn.execute("CREATE DATABASE release")
        with psycopg.connect(server.dsn("release"), autocommit=True) as conn:
            populate(conn)
        subprocess.run(
            [str(binaries_dir() / "pg_dump"), "-h", "127.0.0.1", "-p", str(server.port),
             "-U", "postgres", "--no-owner", "--no-privileges", "-f",
             str(HERE / "0.1.0.sql"), "release"],
            check=True,
        )  # fmt: skip
    # restorable on PostgreSQL 15 too (a setting of 17 and later)
    dump = HERE / "0.1.0.sql"
    lines = dump.read_text(encoding="utf-8").splitlines(keepends=True)
    dump.write_text(
        "".join(line for line in lines if not line.startswith("SET transaction_timeout")),
        encoding="utf-8",
    )


if __name__ == "__main__":
    main()
