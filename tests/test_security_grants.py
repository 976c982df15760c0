"""What grant_app and grant_worker give for counters over paths, generic relations and
periods: to roles granted before the upgrade that brought them, and to the worker's
backfills (the tables of a path, a generic relation's content type table)."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterator

import psycopg
import pytest

from pgcounters import (
    Bucket,
    ColumnTarget,
    Counters,
    CounterSpec,
    NamedTarget,
    Via,
    backfill,
    generic_relation,
    schema,
    security,
    sqlfiles,
    triggers,
)
from pgcounters.connection import Conn
from pgcounters.errors import PermissionDenied
from pgcounters.worker import Worker, WorkerSettings
from roles import login_role

DAY = dt.datetime(2026, 11, 21, 12, tzinfo=dt.UTC)


def _tables(conn: Conn) -> None:
    conn.execute(
        "CREATE TABLE author (id bigint PRIMARY KEY, comments bigint NOT NULL DEFAULT 0);"
        "CREATE TABLE article (id bigint PRIMARY KEY, author_id bigint, edits bigint"
        " NOT NULL DEFAULT 0);"
        "CREATE TABLE comment (id bigserial PRIMARY KEY, article_id bigint,"
        " created_at timestamptz NOT NULL);"
        "INSERT INTO author (id) VALUES (1), (2);"
        "INSERT INTO article (id, author_id) VALUES (10, 1), (20, 2), (30, 1)"
    )


def _upgrade_specs() -> list[CounterSpec]:
    return [
        CounterSpec(
            name="article.edits",
            source="comment",
            keys=("article_id",),
            target=ColumnTarget("article", "edits"),
            mode="direct",
        ),
        CounterSpec(
            name="comments_per_day",
            source="comment",
            keys=("article_id",),
            target=NamedTarget(("bigint",)),
            bucket=Bucket("created_at", "day", "UTC"),
        ),
    ]


def test_roles_granted_at_version_19_write_direct_and_period_counters_after_the_upgrade(
    empty_dsn: str,
) -> None:
    """An application role and a worker role granted at version 19 write tables whose
    triggers note direct changes and compute periods, and drain them, once the schema is
    upgraded, without being granted again."""
    with psycopg.connect(empty_dsn, autocommit=True) as admin:
        for migration in sqlfiles.migrations():
            if migration.version <= 19:
                with admin.transaction():
                    assert schema.apply_migration(admin, migration.filename)
        _tables(admin)
        with (
            login_role(empty_dsn, "app") as (app, app_dsn),
            login_role(empty_dsn, "worker") as (worker, worker_dsn),
        ):
            admin.execute("SELECT pgcounters.grant_app(%s)", (app,))
            admin.execute("SELECT pgcounters.grant_worker(%s)", (worker,))
            # the application's rights on its own tables are the user's to give
            admin.execute(f'GRANT SELECT, INSERT, UPDATE, DELETE ON comment, article TO "{app}"')
            admin.execute(f'GRANT USAGE ON SEQUENCE comment_id_seq TO "{app}"')
            for migration in sqlfiles.migrations():  # the upgrade, to the latest version
                if migration.version >= 20:
                    with admin.transaction():
                        assert schema.apply_migration(admin, migration.filename)
            triggers.install(admin, _upgrade_specs())
            with psycopg.connect(app_dsn, autocommit=True) as conn:
                conn.execute(
                    "INSERT INTO comment (article_id, created_at) VALUES (10, %s), (10, %s),"
                    " (20, %s)",
                    (DAY, DAY + dt.timedelta(days=1), DAY),
                )
                conn.execute("DELETE FROM comment WHERE article_id = 20")
                assert Counters(conn).get("comments_per_day", (10, DAY.date())) == 1
            with psycopg.connect(worker_dsn, autocommit=True) as conn:
                pc = Counters(conn)
                # per day: the insert's three keys and the delete's one
                assert pc.drain().deltas == 4
                assert pc.get("comments_per_day", (10, DAY.date()), exact=False) == 1
                assert pc.get("comments_per_day", (20, DAY.date()), exact=False) == 0
                conn.execute("SELECT pgcounters.take_direct_changes(100)")
                assert conn.execute("SELECT pgcounters.drop_expired_buckets(10)").fetchone()
                # the list of ids the triggers fold (version 29): every counter listed
                listed = conn.execute("SELECT pgcounters.refresh_target_ids()").fetchone()
                assert listed == (len(_upgrade_specs()),)
        # what the application wrote: two comments on article 10 (a day apart), one on 20
        # deleted; the direct counter's column and the per-day values the worker stored
        edits = admin.execute("SELECT id, edits FROM article ORDER BY id").fetchall()
        assert edits == [(10, 2), (20, 0), (30, 0)]
        days = [DAY.date(), DAY.date() + dt.timedelta(days=1)]
        assert admin.execute(
            "SELECT c.key, c.value FROM pgcounters.counters AS c"
            " JOIN pgcounters.targets AS t ON t.id = c.target_id"
            " WHERE t.name = 'comments_per_day' AND c.value <> 0 ORDER BY c.key"
        ).fetchall() == [(["10", d.isoformat()], 1) for d in days]
        keys = [(10, days[0]), (10, days[1]), (20, days[0])]
        assert Counters(admin).get_many("comments_per_day", keys) == [1, 1, 0]


@pytest.fixture
def worker_dsn(dsn: str) -> Iterator[tuple[str, str]]:
    with login_role(dsn, "pgc_worker") as role:
        yield role


def test_worker_role_backfills_a_path_counter_and_a_generic_relation_counter(
    dsn: str, conn: Conn, worker_dsn: tuple[str, str]
) -> None:
    """grant_worker gives SELECT on the tables of a path and on a generic relation's
    content type table: the worker's backfill batches read them."""
    _tables(conn)
    conn.execute(
        "CREATE TABLE kinds (id serial PRIMARY KEY, app_label text, model text);"
        "CREATE TABLE note (id serial PRIMARY KEY, kind_id integer, ref bigint);"
        "INSERT INTO kinds (app_label, model) VALUES ('x', 'other'), ('app', 'article');"
        "INSERT INTO note (kind_id, ref) SELECT 1 + g % 2, 10 * (1 + g % 3)"
        " FROM generate_series(1, 20) g"
    )
    conn.execute(
        "INSERT INTO comment (article_id, created_at)"
        " SELECT 10 * (1 + g %% 3), %s FROM generate_series(1, 20) g",
        (DAY,),
    )
    specs = [
        CounterSpec(
            name="author.comments",
            source="comment",
            keys=("author_id",),
            via=(Via("article", link="article_id"),),
            target=ColumnTarget("author", "comments"),
        ),
        generic_relation(
            "article.notes",
            "note",
            NamedTarget(("bigint",)),
            content_type=("app", "article"),
            content_type_column="kind_id",
            object_id_column="ref",
            content_type_table="kinds",
        ),
    ]
    triggers.install(conn, specs, backfill=False)
    role, role_dsn = worker_dsn
    granted = security.grant_worker(conn, role)
    with psycopg.connect(role_dsn, autocommit=True) as worker:
        assert backfill.run(worker, batch_size=2) == {"article.notes": 3, "author.comments": 2}
    # comments g = 1..20 on article 10 * (1 + g % 3): 6 on 10, 7 on 20, 7 on 30; articles 10
    # and 30 are author 1's
    assert conn.execute("SELECT id, comments FROM author ORDER BY id").fetchall() == [
        (1, 13),
        (2, 7),
    ]
    # notes g = 1..20 of kind 1 + g % 2 on 10 * (1 + g % 3): kind 2 (app.article) for the
    # odd g, 3 on article 10 (g = 3, 9, 15), 4 on 20 (1, 7, 13, 19), 3 on 30 (5, 11, 17)
    assert Counters(conn).get_many("article.notes", [10, 20, 30]) == [3, 4, 3]
    assert "GRANT SELECT ON public.article TO " + role in granted
    assert "GRANT SELECT ON public.kinds TO " + role in granted


def test_a_counter_the_worker_may_not_read_leaves_the_other_backfills_going(
    dsn: str, conn: Conn, worker_dsn: tuple[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    """A backfill the worker role may not run (a table it may not read) is skipped, said
    once; the worker goes on with the other counters' backfills."""
    _tables(conn)
    conn.execute(
        "INSERT INTO comment (article_id, created_at)"
        " SELECT 10 * (1 + g %% 3), %s FROM generate_series(1, 20) g",
        (DAY,),
    )
    readable = CounterSpec(
        name="b.per_article",
        source="comment",
        keys=("article_id",),
        target=NamedTarget(("bigint",)),
    )
    triggers.install(conn, [readable], backfill=False)
    role, role_dsn = worker_dsn
    security.grant_worker(conn, role)
    # declared after the grant, over a table the worker was never given
    conn.execute(
        "CREATE TABLE secret (id serial PRIMARY KEY, article_id bigint);"
        "INSERT INTO secret (article_id) SELECT 10 FROM generate_series(1, 5)"
    )
    unreadable = CounterSpec(
        name="a.secret",
        source="secret",
        keys=("article_id",),
        target=NamedTarget(("bigint",)),
    )
    triggers.install(conn, [unreadable], backfill=False)
    assert [b.name for b in backfill.pending(conn)] == ["a.secret", "b.per_article"]
    worker = Worker(role_dsn, WorkerSettings(batch_size=2))
    with (
        psycopg.connect(role_dsn, autocommit=True) as wconn,
        caplog.at_level(logging.WARNING, logger="pgcounters"),
    ):
        with pytest.raises(PermissionDenied):  # the role may not read that one
            backfill.step(wconn, 2)
        for _ in range(10):
            worker._round(wconn)
    assert [b.name for b in backfill.pending(conn)] == ["a.secret"]
    # comments g = 1..20 on article 10 * (1 + g % 3): 6 on 10, 7 on 20, 7 on 30
    assert Counters(conn).get_many(readable.name, [10, 20, 30]) == [6, 7, 7]
    said = [r.getMessage() for r in caplog.records if "a.secret" in r.getMessage()]
    assert len(said) == 1, said
    assert "backfill of a.secret left to others: permission denied for table secret" in said[0]
    # granted, another worker backfills it
    security.grant_worker(conn, role)
    with psycopg.connect(role_dsn, autocommit=True) as wconn:
        assert backfill.run(wconn) == {"a.secret": 1}
    assert Counters(conn).get_many(unreadable.name, [10]) == [5]  # the five secret rows
