"""A database with pgcounters dumped and restored, as an operator moves or recovers one:
``pg_dump -Fc`` and ``pg_restore``, and a plain ``pg_dump`` replayed with ``psql``, into new
databases. Named counters with pending deltas in both queues, a declared counter column, a
quota, a delta set aside in the quarantine and a backfill half done: after the restore every
value is what the test wrote, the triggers count, a drain applies what was pending, the
backfill finishes and the quarantine still holds its delta."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from pgcounters import Counters, Quotas, backfill, install, recount, triggers
from pgcounters.connection import Conn
from pgcounters.quarantine import list_quarantined
from pgcounters.repair import verify
from pgcounters.specs import ColumnTarget, CounterSpec, Fragment, Table
from support import pg_tool

pytestmark = pytest.mark.slow

PUBLIC = CounterSpec(
    name="article.public_comments",
    source=Table("comment"),
    keys=("article_id",),
    target=ColumnTarget(Table("article"), "public_comments"),
    where=Fragment("public = %s", (True,)),
)
ALL = CounterSpec(
    name="article.comments",
    source=Table("comment"),
    keys=("article_id",),
    target=ColumnTarget(Table("article"), "comments"),
)


def _args(dsn: str) -> list[str]:
    p = conninfo_to_dict(dsn)
    return ["-h", str(p["host"]), "-p", str(p["port"]), "-U", str(p["user"])]


def _dbname(dsn: str) -> str:
    return str(conninfo_to_dict(dsn)["dbname"])


def _populate(conn: Conn) -> None:
    conn.execute(
        "CREATE TABLE article (id bigint PRIMARY KEY, public_comments bigint NOT NULL DEFAULT 0,"
        " comments bigint NOT NULL DEFAULT 0)"
    )
    conn.execute(
        "CREATE TABLE comment (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
        " article_id bigint NOT NULL REFERENCES article, public boolean NOT NULL)"
    )
    conn.execute("INSERT INTO article (id) SELECT generate_series(1, 3)")
    triggers.install(conn, [PUBLIC])
    # article 1: 2 public + 1 private, article 2: 1 public, article 3: none
    conn.execute(
        "INSERT INTO comment (article_id, public) VALUES"
        " (1, true), (1, true), (1, false), (2, true)"
    )
    pc = Counters(conn)
    pc.drain()
    # a second counter over existing rows, its backfill left half done (one key of three)
    triggers.install(conn, [ALL], backfill=False)
    assert backfill.step(conn, 1) == 1
    pc.create_counter("views", key=int)
    pc.create_counter("hits", key=int, mode="unlogged")
    pc.incr_many([("views", 1, 3), ("views", 2, 1)])
    pc.drain()
    pc.incr_many([("views", 1, 2), ("hits", 7, 4)])  # pending in both queues
    # a delta that cannot be applied: set aside by the next drain
    conn.execute(
        "INSERT INTO pgcounters.queue (target_id, key, delta) VALUES (%s, '{oops', 1)",
        (pc.counter("views").id,),
    )
    assert pc.drain(max_batches=1).quarantined == 1
    pc.incr("views", 2, 5)  # pending again
    # pending deltas of both declared counters (articles 1 and 2)
    conn.execute("INSERT INTO comment (article_id, public) VALUES (1, true), (2, true)")
    q = Quotas(conn)
    q.define_quota("api", 10)
    for _ in range(3):
        assert q.register_call("api", "customer-1").allowed


def _check(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        pc = Counters(conn)
        # what the test wrote, pending included
        assert pc.get_many("views", [1, 2]) == [5, 6]
        assert pc.get("hits", 7) == 4
        # views 2; each declared counter: articles 1 and 2
        assert pc.pending() == (5, 1)
        assert [pc.get("article.public_comments", a) for a in (1, 2, 3)] == [3, 2, 0]
        assert [(d.counter, d.key, d.delta) for d in list_quarantined(conn)] == [
            ("views", "{oops", 1)
        ]
        assert Quotas(conn).status("api", "customer-1").used == 3
        # the triggers count after the restore
        conn.execute("INSERT INTO comment (article_id, public) VALUES (3, true), (3, false)")
        assert pc.get("article.public_comments", 3) == 1
        # the backfill goes on where it was, the drain applies what was pending
        while backfill.step(conn, 1000):
            pass
        pc.drain()
        assert pc.pending() == (0, 0)
        assert pc.get_many("views", [1, 2], exact=False) == [5, 6]
        assert pc.get("hits", 7, exact=False) == 4
        rows = conn.execute(
            "SELECT id, public_comments, comments FROM article ORDER BY id"
        ).fetchall()
        assert rows == [(1, 3, 4), (2, 2, 2), (3, 1, 2)]
        # the same, counted here
        truth = conn.execute(
            "SELECT a.id, count(*) FILTER (WHERE c.public), count(c.id) FROM article AS a"
            " LEFT JOIN comment AS c ON c.article_id = a.id GROUP BY a.id ORDER BY a.id"
        ).fetchall()
        assert rows == truth
        assert verify(conn, "article.public_comments").ok
        assert verify(conn, "article.comments").ok


@pytest.mark.parametrize("form", ["custom", "plain"])
def test_a_dump_restored_into_a_new_database_counts_on_exactly(
    dsn: str, another_empty_dsn: str, tmp_path: Path, form: str
) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        _populate(conn)
    dump = tmp_path / "dump"
    restore: Callable[[], object]
    if form == "custom":
        subprocess.run(
            [pg_tool("pg_dump"), *_args(dsn), "-Fc", "-f", str(dump), _dbname(dsn)], check=True
        )

        def restore() -> object:
            return subprocess.run(
                [pg_tool("pg_restore"), *_args(another_empty_dsn), "--exit-on-error",
                 "-d", _dbname(another_empty_dsn), str(dump)],
                check=True,
            )  # fmt: skip
    else:
        subprocess.run([pg_tool("pg_dump"), *_args(dsn), "-f", str(dump), _dbname(dsn)], check=True)

        def restore() -> object:
            return subprocess.run(
                [pg_tool("psql"), *_args(another_empty_dsn), "-X", "-q", "-v", "ON_ERROR_STOP=1",
                 "-d", _dbname(another_empty_dsn), "-f", str(dump)],
                check=True, capture_output=True,
            )  # fmt: skip

    restore()
    _check(another_empty_dsn)


def test_a_dump_of_the_application_s_schema_alone_loses_the_counting_until_installed_again(
    dsn: str, another_empty_dsn: str, tmp_path: Path
) -> None:
    """What docs/production.md says of ``pg_dump -n public``: the counting triggers call
    functions of the pgcounters schema, so they are not restored (pg_restore reports it);
    installing the counters again makes them count, and recount sets the columns right."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        _populate(conn)
    dump = tmp_path / "app.dump"
    subprocess.run(
        [pg_tool("pg_dump"), *_args(dsn), "-Fc", "-n", "public", "-f", str(dump), _dbname(dsn)],
        check=True,
    )
    with psycopg.connect(another_empty_dsn, autocommit=True) as conn:
        install(conn)
    restored = subprocess.run(
        [pg_tool("pg_restore"), *_args(another_empty_dsn), "-d", _dbname(another_empty_dsn),
         str(dump)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert restored.returncode == 1
    assert "function pgcounters.pgc_article_public_comments_" in restored.stderr
    with psycopg.connect(another_empty_dsn, autocommit=True) as conn:
        # the columns as dumped: the pending deltas stayed in the other database
        rows = conn.execute("SELECT id, public_comments FROM article ORDER BY id").fetchall()
        assert rows == [(1, 2), (2, 1), (3, 0)]
        conn.execute("INSERT INTO comment (article_id, public) VALUES (3, true)")
        assert Counters(conn).pending() == (0, 0)  # nothing counts it
        triggers.install(conn, [PUBLIC, ALL])
        recount(conn, "article.public_comments")
        conn.execute("INSERT INTO comment (article_id, public) VALUES (3, true)")
        pc = Counters(conn)
        assert [pc.get("article.public_comments", a) for a in (1, 2, 3)] == [3, 2, 2]
        assert [pc.get("article.comments", a) for a in (1, 2, 3)] == [4, 2, 2]
