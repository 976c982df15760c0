"""Least privilege (migration 0006): what an application role and a worker role may do."""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import errors as pg
from psycopg import sql

import blog_schema
import truth
from pgcounters import Counters, security, triggers
from pgcounters.cli import run
from pgcounters.connection import Conn
from pgcounters.errors import ConfigurationError, CounterBackfilling, PermissionDenied
from pgcounters.quotas import Quotas
from pgcounters.repair import recount, verify
from pgcounters.status import get_status
from roles import login_role
from support import set_clock, tamper

DAY = dt.datetime(2026, 11, 21, 12, tzinfo=dt.UTC)


@pytest.fixture
def setup(conn: Conn) -> Conn:
    """As the owner: counters of every mode, declared counters on a blog, a quota."""
    pc = Counters(conn)
    pc.create_counter("q", int)
    pc.create_counter("u", int, mode="unlogged")
    pc.create_counter("d", int, mode="direct")
    blog_schema.create(conn)
    conn.execute("ALTER TABLE blog_article ADD COLUMN edits bigint NOT NULL DEFAULT 0")
    pc.create_column_counter("article.title_edits", "blog_article", "edits", mode="direct")
    triggers.install(conn, blog_schema.specs("queued"))
    quotas = Quotas(conn)
    quotas.define_quota("api", 3)
    quotas.set_limit("api", "gold", 5)
    return conn


@pytest.fixture
def app(dsn: str, setup: Conn) -> Iterator[Conn]:
    with login_role(dsn, "pgc_app") as (role, role_dsn):
        # the application owns nothing: its rights on its own tables are the user's to grant
        setup.execute(
            f'GRANT SELECT, INSERT, UPDATE, DELETE ON blog_comment, blog_article TO "{role}"'
        )
        setup.execute(f'GRANT USAGE ON SEQUENCE blog_comment_id_seq TO "{role}"')
        granted = security.grant_app(setup, role)
        assert any("INSERT ON pgcounters.queue" in g for g in granted)
        with psycopg.connect(role_dsn, autocommit=True) as c:
            assert c.execute("SELECT current_user").fetchone() == (role,)
            yield c


@pytest.fixture
def worker(dsn: str, setup: Conn) -> Iterator[Conn]:
    with login_role(dsn, "pgc_worker") as (role, role_dsn):
        security.grant_worker(setup, role)
        with psycopg.connect(role_dsn, autocommit=True) as c:
            yield c


def test_app_role_increments_reads_and_calls_quotas(app: Conn, setup: Conn) -> None:
    pc = Counters(app)
    pc.incr("q", 1, 2)
    pc.incr("u", 1, 3)
    assert pc.incr("d", 1, 4) == 4
    assert pc.incr("d", 1, 1) == 5
    assert pc.incr("article.title_edits", 1, 7) == 7  # direct column counter
    assert pc.incr_many([("q", 1, 1), ("d", 2, 9), ("u", 2, 1)]) == 3
    assert [pc.get("q", 1), pc.get("u", 1), pc.get("d", 1), pc.get("d", 2)] == [3, 3, 5, 9]
    assert pc.get_many("q", [1, 2]) == [3, 0]
    assert pc.get("article.title_edits", 1) == 7
    assert app.execute("SELECT pgcounters.incr('q', '{1}', 10)").fetchone() == (None,)
    assert app.execute("SELECT pgcounters.get('q', '{1}')").fetchone() == (13,)
    assert pc.pending() == (3, 2)
    assert pc.top("d", 1) == [((2,), 9)]

    quotas = Quotas(app)
    assert [quotas.register_call("api", "gold", at=DAY).allowed for _ in range(6)] == [
        True,
        True,
        True,
        True,
        True,
        False,
    ]
    assert quotas.status("api", "gold", at=DAY).used == 5
    # what the app wrote is what the owner reads
    assert Counters(setup).get("q", 1) == 13


def test_app_role_writes_tables_with_declared_counters(
    app: Conn, worker: Conn, setup: Conn
) -> None:
    app.execute(
        "INSERT INTO blog_comment (article_id, creator_id, publish_status, score)"
        " SELECT 1 + g % 3, 1, CASE WHEN g % 2 = 0 THEN 'public' ELSE 'private' END, g"
        " FROM generate_series(1, 40) g"
    )
    app.execute("UPDATE blog_comment SET publish_status = 'public' WHERE id % 5 = 0")
    app.execute("DELETE FROM blog_comment WHERE id % 7 = 0")
    # the app's exact reads include what its triggers queued
    pc = Counters(app)
    public = app.execute(
        "SELECT count(*) FROM blog_comment WHERE article_id = 1 AND publish_status = 'public'"
    ).fetchone()
    assert public is not None
    assert pc.get("blog.article.public_comments", 1) == public[0]
    Counters(worker).drain()
    truth.assert_stored(setup, blog_schema.truths())
    truth.assert_drained(setup, blog_schema.truths())


def test_direct_mode_triggers_run_with_app_rights(dsn: str, conn: Conn) -> None:
    blog_schema.create(conn)
    specs = blog_schema.specs("direct")
    triggers.install(conn, specs)
    with login_role(dsn, "pgc_app") as (role, role_dsn):
        conn.execute(f'GRANT SELECT, INSERT, UPDATE, DELETE ON blog_comment TO "{role}"')
        conn.execute(f'GRANT USAGE ON SEQUENCE blog_comment_id_seq TO "{role}"')
        security.grant_app(conn, role)
        with psycopg.connect(role_dsn, autocommit=True) as app:
            app.execute(
                "INSERT INTO blog_comment (article_id, creator_id, publish_status, score)"
                " SELECT 1 + g % 4, 1 + g % 2, 'public', g FROM generate_series(1, 30) g"
            )
            app.execute("DELETE FROM blog_comment WHERE id % 4 = 0")
            # still no right to write a stored value or a parent row outside the counter column
            with pytest.raises(pg.InsufficientPrivilege):
                app.execute("UPDATE pgcounters.counters SET value = 0")
            with pytest.raises(pg.InsufficientPrivilege):
                app.execute("UPDATE blog_article SET title = 'x'")
    truth.assert_drained(conn, blog_schema.truths())
    assert sum(truth.values(conn, blog_schema.truths()[-1]).values()) == 23  # 30 less 7


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE pgcounters.counters SET value = value + 100",
        "DELETE FROM pgcounters.counters",
        "INSERT INTO pgcounters.counters (target_id, key, value) VALUES (1, '{1}', 1000)",
        "UPDATE pgcounters.queue SET delta = 1000",
        "DELETE FROM pgcounters.queue",
        "DELETE FROM pgcounters.queue_unlogged",
        "UPDATE pgcounters.quota_usage SET used = 0",
        "DELETE FROM pgcounters.quota_usage",
        "INSERT INTO pgcounters.quota_usage VALUES (1, 'x', now(), now(), 1, 0, 0, 0, true)",
        "DELETE FROM pgcounters.quota_limits",
        "UPDATE pgcounters.targets SET mode = 'direct'",
        "TRUNCATE pgcounters.queue",
        "SELECT pgcounters.drain_batch(10, false)",
        "SELECT pgcounters.reset_target(1)",
        "SELECT pgcounters.purge_quotas(now())",
        "SELECT pgcounters.define_quota('other', 5)",
        "SELECT pgcounters.set_limit('api', 'me', 1000000)",
        "SELECT pgcounters.create_counter('mine')",
        "SELECT pgcounters.drop_counter('q')",
        "SELECT pgcounters.grant_worker(current_user)",
        "SELECT setval('pgcounters.wakeup_clock', 1)",
    ],
)
def test_app_role_cannot_change_stored_state(app: Conn, setup: Conn, statement: str) -> None:
    Counters(setup).incr("q", 1, 5)
    Quotas(setup).register_call("api", "gold", at=DAY)
    before = _state(setup)
    with pytest.raises(pg.InsufficientPrivilege):
        app.execute(statement)
    assert _state(setup) == before


def test_app_role_cannot_misuse_the_definer_functions(app: Conn, setup: Conn) -> None:
    before = _state(setup)
    q = Counters(setup).counter("q")
    # add_direct adds to named direct counters only, never to a queued one
    with pytest.raises(psycopg.Error) as caught:
        app.execute("SELECT pgcounters.add_direct(ARRAY[%s], ARRAY['{1}'], ARRAY[100])", (q.id,))
    assert caught.value.sqlstate == "PC003"
    assert _state(setup) == before


def test_app_role_gets_a_clear_error_from_the_client(app: Conn) -> None:
    pc = Counters(app)
    pc.incr("q", 1)
    with pytest.raises(PermissionDenied, match="pgcounters grant"):
        pc.drain()
    with pytest.raises(PermissionDenied):
        recount(app, "blog.comments_total")
    with pytest.raises(PermissionDenied):
        Quotas(app).define_quota("other", 5)
    assert pc.get("q", 1) == 1


def test_worker_role_drains_and_recounts(worker: Conn, setup: Conn) -> None:
    setup.execute(
        "INSERT INTO blog_comment (article_id, creator_id, publish_status, score)"
        " SELECT 1 + g % 3, 1 + g % 2, 'public', g FROM generate_series(1, 25) g"
    )
    pc = Counters(worker)
    pc.incr("q", 1, 4)
    pc.incr("u", 1, 6)
    result = pc.drain()
    assert result.deltas > 0
    assert pc.pending() == (0, 0)
    assert pc.get("q", 1, exact=False) == 4
    assert pc.get("u", 1, exact=False) == 6
    # break stored values (as the owner), the worker recounts them back
    tamper(setup, "UPDATE blog_article SET public_comments = 999")
    setup.execute("UPDATE pgcounters.counters SET value = value + 7")
    assert truth.exact_mismatches(setup, blog_schema.truths()[0])  # broken
    for spec in blog_schema.specs("queued"):
        recount(worker, spec.name)
        assert verify(setup, spec).mismatches == [], spec.name
    truth.assert_stored(setup, blog_schema.truths())
    set_clock(worker, DAY)  # the cut-off is in the past of the clock, whatever the machine's date
    assert Quotas(worker).purge(DAY - dt.timedelta(days=1)).windows == 0


def test_worker_role_runs_backfills_and_app_reads_refuse_meanwhile(
    worker: Conn, app: Conn, setup: Conn
) -> None:
    from pgcounters import backfill, triggers

    setup.execute(
        "INSERT INTO blog_comment (article_id, creator_id, publish_status, score)"
        " SELECT 1 + g % 3, 1 + g % 2, 'public', g FROM generate_series(1, 25) g"
    )
    Counters(setup).drain()
    tamper(setup, "UPDATE blog_article SET public_comments = 0")
    spec = next(s for s in blog_schema.specs("queued") if s.name == "blog.article.public_comments")
    with setup.transaction():
        backfill.request(setup, spec)
    assert [b.name for b in backfill.pending(app)] == [spec.name]
    with pytest.raises(CounterBackfilling):
        Counters(app).get(spec.name, 1)
    assert backfill.run(worker, batch_size=2) == {spec.name: 5}
    assert verify(setup, spec).mismatches == []
    truth = setup.execute(
        "SELECT count(*) FROM blog_comment WHERE article_id = 1 AND publish_status = 'public'"
    ).fetchone()
    assert truth is not None
    assert Counters(app).get(spec.name, 1) == truth[0] > 0
    assert triggers.declared(worker)


def test_every_definer_function_has_a_fixed_search_path(conn: Conn) -> None:
    rows = conn.execute(
        "SELECT p.oid::regprocedure::text, p.proconfig FROM pg_proc p"
        " WHERE p.pronamespace = 'pgcounters'::regnamespace AND p.prosecdef"
    ).fetchall()
    assert {r[0].split("(")[0] for r in rows} >= {
        "pgcounters.add_direct",
        "pgcounters.register_call",
        "pgcounters.record_flush",
        "pgcounters._wake_drainers",
    }
    for name, config in rows:
        assert config == ["search_path=pg_catalog, pgcounters, pg_temp"], name


def test_public_may_execute_no_pgcounters_function(conn: Conn) -> None:
    rows = conn.execute(
        "SELECT p.oid::regprocedure::text FROM pg_proc p"
        " WHERE p.pronamespace = 'pgcounters'::regnamespace"
        "   AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.objid = p.oid AND d.deptype = 'e')"
        "   AND has_function_privilege('public', p.oid, 'EXECUTE')"
    ).fetchall()
    # but two: an exact read of a counter being backfilled raises its error through one
    # (it reads only pgcounters.backfills, which every role may read); every counted
    # table's triggers read their counter's id through the other, as whichever role writes
    # the table (it reads no table: a write must not fail for a right never given)
    assert sorted(rows) == [
        ("pgcounters._backfilling(integer)",),
        ("pgcounters._target_id(text)",),
    ]


def test_a_role_without_grants_sees_nothing(dsn: str, setup: Conn) -> None:
    with (
        login_role(dsn, "pgc_none") as (_, role_dsn),
        psycopg.connect(role_dsn) as c,
        pytest.raises(PermissionDenied),
    ):
        Counters(c).get("q", 1)


def test_definer_functions_ignore_the_callers_search_path(app: Conn, setup: Conn) -> None:
    # a temporary table named like a catalog-free lookup, first in the path: ignored
    app.execute("CREATE TEMP TABLE targets (id integer, name text)")
    app.execute("SET search_path = pg_temp, public")
    assert app.execute("SELECT pgcounters.incr('d', '{1}', 3)").fetchone() == (3,)
    assert Counters(setup).get("d", 1) == 3


def test_grant_refuses_unknown_and_bad_roles(conn: Conn) -> None:
    with pytest.raises(ConfigurationError, match="does not exist"):
        security.grant_app(conn, 'no"such; role')
    with pytest.raises(ConfigurationError):
        security.grant_worker(conn, "x" * 64)
    with pytest.raises(ConfigurationError):
        security.grant_app(conn, "a\x00b")


def test_grant_command(dsn: str, conn: Conn, capsys: Any) -> None:
    with login_role(dsn, "pgc_cli") as (role, role_dsn):
        assert run(["--dsn", dsn, "grant", "--app", role]) == 0
        assert f"GRANT INSERT ON pgcounters.queue, pgcounters.queue_unlogged TO {role}" in (
            capsys.readouterr().out
        )
        Counters(conn).create_counter("c")
        with psycopg.connect(role_dsn, autocommit=True) as c:
            Counters(c).incr("c")
            with pytest.raises(PermissionDenied):
                Counters(c).drain()
        assert run(["--dsn", dsn, "grant", "--worker", role, "-q"]) == 0
        assert capsys.readouterr().out == ""
        with psycopg.connect(role_dsn, autocommit=True) as c:
            assert Counters(c).drain().deltas == 1
        assert run(["--dsn", dsn, "grant", "--revoke", role, "-q"]) == 0
        with psycopg.connect(role_dsn, autocommit=True) as c, pytest.raises(PermissionDenied):
            Counters(c).get("c")
        with pytest.raises(SystemExit) as usage:
            run(["--dsn", dsn, "grant"])
        assert usage.value.code == 2
        assert "name at least one role" in capsys.readouterr().err


def _state(conn: Conn) -> tuple[Any, ...]:
    return tuple(
        conn.execute(statement).fetchall()
        for statement in (
            "SELECT * FROM pgcounters.counters ORDER BY 1, 2",
            "SELECT target_id, key, delta FROM pgcounters.queue ORDER BY id",
            "SELECT target_id, key, delta FROM pgcounters.queue_unlogged ORDER BY id",
            "SELECT quota_id, subject, used, attempts FROM pgcounters.quota_usage ORDER BY 1, 2",
            "SELECT quota_id, subject, calls FROM pgcounters.quota_limits ORDER BY 1, 2",
            "SELECT id, name, mode FROM pgcounters.targets ORDER BY 1",
            "SELECT name, default_limit FROM pgcounters.quotas ORDER BY 1",
        )
    )


def test_status_works_for_the_app_and_the_worker(app: Conn, worker: Conn) -> None:
    Counters(app).incr("q", 1, 3)
    for c in (app, worker):
        status = get_status(c)
        assert status.schema_current
        assert status.depth == 1  # the one queued increment


def test_incr_runs_user_table_triggers_with_the_callers_rights(app: Conn, setup: Conn) -> None:
    """incr is not a definer function: a trigger on the counted table that the SQL incr
    updates runs as the application role, never as the owner of pgcounters."""
    setup.execute(
        "CREATE TABLE seen (who text);"
        "CREATE FUNCTION note_who() RETURNS trigger LANGUAGE plpgsql AS"
        " $$ BEGIN INSERT INTO public.seen VALUES (current_user); RETURN NEW; END $$;"
        "CREATE TRIGGER note_who BEFORE UPDATE ON blog_article"
        " FOR EACH ROW EXECUTE FUNCTION note_who()"
    )
    role = app.execute("SELECT current_user").fetchone()
    setup.execute(f'GRANT INSERT ON seen TO "{role[0] if role else ""}"')
    app.execute("SELECT pgcounters.incr('article.title_edits', '{1}', 1)")
    app.execute("SELECT pgcounters.incr('d', '{5}', 2)")  # direct named: through add_direct
    assert setup.execute("SELECT who FROM seen").fetchall() == [role]
    assert Counters(setup).get("d", 5) == 2
    definer = setup.execute(
        "SELECT prosecdef FROM pg_proc WHERE oid = 'pgcounters.incr(text, text[], bigint)'"
        "::regprocedure"
    ).fetchone()
    assert definer == (False,)


def test_an_application_roles_sql_increment_of_a_counter_column_is_reported(
    app: Conn, setup: Conn
) -> None:
    from pgcounters.notifications import listen_direct, take_direct

    assert listen_direct(setup) == 1  # a reporting worker's registration
    app.execute("SELECT pgcounters.incr('article.title_edits', '{1}', 2)")
    assert take_direct(setup) == {"article.title_edits": {(1,)}}
    assert Counters(setup).get("article.title_edits", 1) == 2


def test_app_role_may_not_pause_counting_unless_granted(dsn: str, app: Conn, setup: Conn) -> None:
    role = app.execute("SELECT current_user").fetchone()
    assert role is not None
    insert = "INSERT INTO blog_comment (article_id, publish_status) VALUES (1, 'public')"
    with (
        triggers.paused(app),
        pytest.raises(pg.InsufficientPrivilege, match="may not pause counting"),
    ):
        app.execute(insert)
    # raw SQL as well as the helper: the setting itself is what is refused
    app.execute("SET pgcounters.paused = 'blog.article.public_comments'")
    with pytest.raises(pg.InsufficientPrivilege):
        app.execute(insert)
    app.execute("RESET pgcounters.paused")
    app.execute(insert)
    # a counter the setting does not name is counted as ever, and nothing was lost
    truth = setup.execute(
        "SELECT count(*) FROM blog_comment WHERE article_id = 1 AND publish_status = 'public'"
    ).fetchone()
    assert truth == (1,)
    assert Counters(setup).get("blog.article.public_comments", 1) == 1

    granted = security.grant_pause(setup, role[0])
    assert len(granted) == 1
    assert granted[0].startswith("INSERT INTO pgcounters.pausers")
    assert role[0] in granted[0]
    with triggers.paused(app, "blog.article.public_comments"):
        app.execute(insert)
    assert Counters(setup).get("blog.article.public_comments", 1) == 1  # paused: not counted
    recount(setup, "blog.article.public_comments")
    assert Counters(setup).get("blog.article.public_comments", 1) == 2

    security.revoke(setup, role[0])
    security.grant_app(setup, role[0])
    with triggers.paused(app), pytest.raises(pg.InsufficientPrivilege):
        app.execute(insert)


def test_app_role_reads_only_the_counter_columns_of_a_parent(dsn: str, setup: Conn) -> None:
    setup.execute("ALTER TABLE blog_user ADD COLUMN password_hash text NOT NULL DEFAULT 'x'")
    with login_role(dsn, "pgc_app") as (role, role_dsn):
        granted = security.grant_app(setup, role)
        assert not any("USAGE ON SCHEMA public" in g for g in granted)
        assert not any(g.startswith("GRANT SELECT ON public.") for g in granted)
        with psycopg.connect(role_dsn, autocommit=True) as app:
            pc = Counters(app)
            setup.execute(
                "INSERT INTO blog_comment (article_id, creator_id, publish_status)"
                " VALUES (1, 2, 'public')"
            )
            assert pc.get("blog.user.public_comments", 2) == 1
            assert pc.get("blog.article.public_comments", 1) == 1
            with pytest.raises(pg.InsufficientPrivilege):
                app.execute("SELECT password_hash FROM blog_user")
        # everything granted is taken back: the role can be dropped without DROP OWNED
        security.revoke(setup, role)
        setup.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
        setup.execute(sql.SQL("CREATE ROLE {}").format(sql.Identifier(role)))  # for cleanup


def test_app_role_cannot_purge_the_flush_records_that_make_flushes_count_once(
    app: Conn, setup: Conn
) -> None:
    """A flush in doubt is looked up by its record: an application role that could delete
    records (a retention of its choosing) could make it count twice."""
    setup.execute(
        "INSERT INTO pgcounters.buffer_flushes (flush_id, buffer, keys, total, applied_at)"
        " VALUES (repeat('a', 32), 'default', 1, 1, now() - interval '2 days'),"
        " (repeat('b', 32), 'default', 1, 1, now())"
    )
    with pytest.raises(pg.UndefinedFunction):  # version 4's form, with a retention, is gone
        app.execute("SELECT pgcounters.record_flush(md5('x'), 'default', 0, 0, '-100 years', '{}')")
    assert app.execute(
        "SELECT pgcounters.record_flush(md5('x'), 'default', 0, 0, '{}')"
    ).fetchone() == (True,)
    kept = setup.execute("SELECT flush_id FROM pgcounters.buffer_flushes ORDER BY 1").fetchall()
    assert kept == [(hashlib.md5(b"x").hexdigest(),), ("a" * 32,), ("b" * 32,)]
    with pytest.raises(pg.InsufficientPrivilege):
        app.execute("UPDATE pgcounters.buffer_settings SET retention = '1 hour'")
    with pytest.raises(pg.InsufficientPrivilege):
        app.execute("DELETE FROM pgcounters.buffer_flushes")
