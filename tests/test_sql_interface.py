"""pgcounters from SQL alone: the schema as a plain script applied with psql, and the
SQL functions top, get_many and the drain_all procedure, with their grants."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from catalog import differences, snapshot
from pgcounters import Counters, schema, sqlfiles
from pgcounters.cli import run
from pgcounters.connection import Conn
from pgcounters.embedded import binaries_dir
from roles import login_role


def _psql() -> str:
    embedded = binaries_dir() / "psql"
    if embedded.exists():
        return str(embedded)
    found = shutil.which("psql")
    if found is None:
        pytest.skip("no psql: neither the embedded server's nor one on PATH")
    return found


def _apply_with_psql(dsn: str, script: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "pgcounters.sql"
    path.write_text(script, encoding="utf-8")
    return subprocess.run(
        [_psql(), "--no-psqlrc", "-v", "ON_ERROR_STOP=1", "-q", "-d", dsn, "-f", str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _printed(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert run(["schema", "--sql", *argv]) == 0
    captured = capsys.readouterr()
    # the verb opens no database: no embedded-server notice
    assert captured.err == ""
    return captured.out


def _at_version(dsn: str, version: int) -> None:
    """The schema as the migrations up to ``version`` leave it."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for migration in sqlfiles.migrations():
            if migration.version <= version:
                with conn.transaction():
                    assert schema.apply_migration(conn, migration.filename)


def _works(conn: Conn) -> None:
    pc = Counters(conn)
    pc.create_counter("sql_views", int)
    pc.incr("sql_views", 7, 3)
    assert pc.get("sql_views", 7) == 3
    assert pc.drain().deltas == 1
    assert pc.get("sql_views", 7, exact=False) == 3


def test_install_script_applied_with_psql_builds_the_latest_schema(
    empty_dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = _printed(capsys)
    assert script.count("BEGIN;") == 1
    assert "pg_advisory_xact_lock(hashtext('pgcounters.install'))" in script
    done = _apply_with_psql(empty_dsn, script, tmp_path)
    assert done.returncode == 0, done.stderr
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        state = schema.state(conn)
        assert state.installed == sqlfiles.latest_version()
        assert state.current
        recorded = [r[0] for r in conn.execute("SELECT version FROM pgcounters.migrations")]
        assert sorted(recorded) == [m.version for m in sqlfiles.migrations()]
        _works(conn)


def test_install_script_refuses_an_installed_schema(
    dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    done = _apply_with_psql(dsn, _printed(capsys), tmp_path)
    assert done.returncode != 0
    assert "already installed" in done.stderr
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert schema.state(conn).current


def test_upgrade_script_from_an_older_version_builds_what_upgrade_builds(
    empty_dsn: str, another_empty_dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    start = 12
    _at_version(empty_dsn, start)
    _at_version(another_empty_dsn, start)
    done = _apply_with_psql(empty_dsn, _printed(capsys, "--from", str(start)), tmp_path)
    assert done.returncode == 0, done.stderr
    with psycopg.connect(another_empty_dsn, autocommit=True) as conn:
        assert schema.upgrade(conn)
        upgraded = snapshot(conn)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert schema.state(conn).current
        scripted = snapshot(conn)
        report = differences(scripted, upgraded, ("upgrade script", "pgcounters upgrade"))
        assert not report, report
        _works(conn)


def test_upgrade_script_applied_with_psycopg(empty_dsn: str) -> None:
    start = sqlfiles.migrations()[-2].version  # the version before the latest (gaps allowed)
    _at_version(empty_dsn, start)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(schema.script(start).encode())
        assert schema.state(conn).current
        _works(conn)


def test_upgrade_script_refuses_another_version(dsn: str, tmp_path: Path) -> None:
    older = sqlfiles.migrations()[-3].version
    done = _apply_with_psql(dsn, schema.script(older), tmp_path)
    assert done.returncode != 0
    assert f"this script upgrades version {older}" in done.stderr
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert schema.state(conn).current
        # nothing was recorded twice
        assert conn.execute(
            "SELECT count(*) = count(DISTINCT version) FROM pgcounters.migrations"
        ).fetchone() == (True,)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["schema"], "give --sql"),
        (["schema", "--sql", "--from", "9999"], "--from must be a version of this package"),
        (["schema", "--sql", "--from", "0"], "--from must be a positive integer"),
    ],
)
def test_schema_verb_bad_usage_exits_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        run(argv)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert len(err.strip().splitlines()) == 1


def test_top_has_the_order_of_the_python_client(conn: Conn) -> None:
    pc = Counters(conn)
    pc.create_counter("ranked", int)
    # values across several rank bands, with ties and negatives
    values = {1: 5, 2: 40, 3: 40, 4: 17, 5: -3, 6: 1000, 7: 16, 8: 15, 9: 2**40, 10: -100}
    for key, value in values.items():
        pc.incr("ranked", key, value)
    pc.drain()
    for n in (0, 1, 3, 10, 50):
        rows = conn.execute("SELECT key, value FROM pgcounters.top('ranked', %s)", (n,)).fetchall()
        assert [((int(k[0]),), int(v)) for k, v in rows] == pc.top("ranked", n)
    assert len(conn.execute("SELECT * FROM pgcounters.top('ranked')").fetchall()) == 10
    with pytest.raises(psycopg.Error) as negative:
        conn.execute("SELECT * FROM pgcounters.top('ranked', -1)")
    assert negative.value.sqlstate == "PCT01"
    with pytest.raises(psycopg.Error) as unknown:
        conn.execute("SELECT * FROM pgcounters.top('no_such_counter', 3)")
    assert unknown.value.sqlstate == "PC003"


def test_top_of_a_counter_column(conn: Conn) -> None:
    conn.execute("CREATE TABLE posts (id bigint PRIMARY KEY, likes bigint)")
    conn.execute("INSERT INTO posts VALUES (1, 4), (2, 9), (3, NULL), (4, 9)")
    pc = Counters(conn)
    pc.create_column_counter("post_likes", "posts", "likes")
    rows = conn.execute("SELECT key, value FROM pgcounters.top('post_likes', 4)").fetchall()
    assert [((int(k[0]),), int(v)) for k, v in rows] == pc.top("post_likes", 4)
    assert [k[0] for k, _ in rows] == ["2", "4", "1", "3"]


def test_get_many_reads_exact_values_in_the_order_given(conn: Conn) -> None:
    pc = Counters(conn)
    pc.create_counter("many", int)
    pc.create_counter("pairs", (int, "text"))
    pc.incr("many", 1, 10)
    pc.drain()
    pc.incr("many", 1, 5)  # pending: an exact read adds it
    pc.incr("many", 3, 2)
    pc.incr("pairs", (1, "a"), 4)
    one_part = conn.execute("SELECT * FROM pgcounters.get_many('many', '{3,+1,9}')").fetchall()
    assert [(k, int(v)) for k, v in one_part] == [(["3"], 2), (["1"], 15), (["9"], 0)]
    assert [int(v) for _, v in one_part] == pc.get_many("many", [3, 1, 9])
    nested = conn.execute(
        "SELECT * FROM pgcounters.get_many('pairs', '{{1,a},{2,a},{01,a}}')"
    ).fetchall()
    assert [(k, int(v)) for k, v in nested] == [(["1", "a"], 4), (["2", "a"], 0), (["1", "a"], 4)]
    assert conn.execute("SELECT * FROM pgcounters.get_many('many', '{}')").fetchall() == []
    pc.create_counter("everything")
    with pytest.raises(psycopg.Error) as global_counter:
        conn.execute("SELECT * FROM pgcounters.get_many('everything', '{a}')")
    assert "is global" in str(global_counter.value)
    for bad in ("{1,a}", "{{1},{2}}"):
        with pytest.raises(psycopg.Error) as refused:
            conn.execute("SELECT * FROM pgcounters.get_many('pairs', %s::text[])", (bad,))
        assert refused.value.sqlstate == "PC004"


def test_drain_all_drains_both_queues_one_transaction_per_batch(conn: Conn) -> None:
    pc = Counters(conn)
    pc.create_counter("logged", int)
    pc.create_counter("fast", int, mode="unlogged")
    for key in (1, 2, 3):
        pc.incr("logged", key, key)
        pc.incr("fast", key, 10 * key)
    # fixed batches: the largest batch of a queue holding more is the batch size
    conn.execute("SET pgcounters.max_batch_size = 1")
    row = conn.execute("CALL pgcounters.drain_all(batch_size => 1)").fetchone()
    assert row == (6, 0, 0)
    assert conn.execute(
        "SELECT (SELECT count(*) FROM pgcounters.queue) + "
        "(SELECT count(*) FROM pgcounters.queue_unlogged)"
    ).fetchone() == (0,)
    assert pc.get_many("logged", [1, 2, 3], exact=False) == [1, 2, 3]
    assert pc.get_many("fast", [1, 2, 3], exact=False) == [10, 20, 30]
    # one delta per batch, each batch committed on its own: six transactions wrote the rows
    assert conn.execute(
        "SELECT count(DISTINCT xmin::text) FROM pgcounters.counters"
    ).fetchone() == (6,)
    assert conn.execute("CALL pgcounters.drain_all()").fetchone() == (0, 0, 0)


def test_drain_all_takes_a_queue_holding_more_than_a_batch_in_one(conn: Conn) -> None:
    pc = Counters(conn)
    pc.create_counter("logged", int)
    pc.create_counter("fast", int, mode="unlogged")
    for key in (1, 2, 3, 4):
        pc.incr("logged", key, key)
        pc.incr("fast", key, 10 * key)
        pc.incr("fast", key, 10 * key)
    # unset: each queue in one batch
    assert conn.execute("CALL pgcounters.drain_all(batch_size => 1)").fetchone() == (12, 0, 0)
    assert conn.execute(
        "SELECT count(DISTINCT xmin::text) FROM pgcounters.counters"
    ).fetchone() == (2,)
    assert pc.get_many("fast", [1, 2, 3, 4], exact=False) == [20, 40, 60, 80]
    # batches of at most 3 (4 + 8 deltas: 3 + 1 and 3 + 3 + 2)
    conn.execute("TRUNCATE pgcounters.counters")
    for key in (1, 2, 3, 4):
        pc.incr("logged", key, key)
        pc.incr("fast", key, 10 * key)
        pc.incr("fast", key, 10 * key)
    conn.execute("SET pgcounters.max_batch_size = 3")
    assert conn.execute("CALL pgcounters.drain_all(batch_size => 1)").fetchone() == (12, 0, 0)
    assert conn.execute(
        "SELECT count(DISTINCT xmin::text) FROM pgcounters.counters"
    ).fetchone() == (5,)
    assert pc.get_many("logged", [1, 2, 3, 4], exact=False) == [1, 2, 3, 4]
    assert pc.get_many("fast", [1, 2, 3, 4], exact=False) == [20, 40, 60, 80]
    pc.incr("logged", 1)
    for bad in ("0", "many", "2147483648", "-5"):
        conn.execute("SELECT set_config('pgcounters.max_batch_size', %s, false)", (bad,))
        with pytest.raises(psycopg.Error) as refused:
            conn.execute("CALL pgcounters.drain_all()")
        assert refused.value.sqlstate == "PC005"
        assert "pgcounters.max_batch_size must be a positive integer" in str(refused.value)
    assert conn.execute("SELECT count(*) FROM pgcounters.queue").fetchone() == (1,)


def test_drain_all_refuses_a_transaction_block(conn: Conn, dsn: str, tmp_path: Path) -> None:
    pc = Counters(conn)
    pc.create_counter("blocked", int)
    pc.incr("blocked", 1, 1)
    with pytest.raises(psycopg.Error) as refused, conn.transaction():
        conn.execute("CALL pgcounters.drain_all()")
    # PostgreSQL refuses the procedure's first COMMIT, before it did anything
    assert refused.value.sqlstate == "2D000"
    assert "invalid transaction termination" in str(refused.value)
    done = _apply_with_psql(dsn, "BEGIN;\nCALL pgcounters.drain_all();\nCOMMIT;\n", tmp_path)
    assert done.returncode != 0
    assert "invalid transaction termination" in done.stderr
    with pytest.raises(psycopg.Error) as zero:
        conn.execute("CALL pgcounters.drain_all(batch_size => 0)")
    assert zero.value.sqlstate == "PC005"
    # nothing was drained
    assert conn.execute("SELECT count(*) FROM pgcounters.queue").fetchone() == (1,)


def test_drain_all_never_waits_on_an_application_row(conn: Conn, dsn: str) -> None:
    conn.execute("CREATE TABLE articles (id bigint PRIMARY KEY, views bigint NOT NULL DEFAULT 0)")
    conn.execute("INSERT INTO articles (id) VALUES (1), (2)")
    pc = Counters(conn)
    pc.create_column_counter("article_views", "articles", "views")
    pc.incr("article_views", 1, 3)
    pc.incr("article_views", 2, 5)
    with psycopg.connect(dsn) as app:
        app.execute("SELECT 1 FROM articles WHERE id = 1 FOR UPDATE")
        # a wait on the application's lock would fail here instead of hanging
        conn.execute("SET lock_timeout = '10s'")
        # one delta applied, one left busy, none set aside
        assert conn.execute("CALL pgcounters.drain_all()").fetchone() == (1, 1, 0)
        app.rollback()
    assert conn.execute("SELECT id, views FROM articles ORDER BY id").fetchall() == [(1, 0), (2, 5)]
    assert conn.execute("CALL pgcounters.drain_all()").fetchone() == (1, 0, 0)
    assert conn.execute("SELECT views FROM articles WHERE id = 1").fetchone() == (3,)


def test_grants_app_reads_worker_drains(conn: Conn, dsn: str) -> None:
    pc = Counters(conn)
    pc.create_counter("granted", int)
    pc.incr("granted", 1, 2)
    with (
        login_role(dsn, "sqlapp") as (app_role, app_dsn),
        login_role(dsn, "sqlworker") as (worker_role, worker_dsn),
    ):
        conn.execute("SELECT pgcounters.grant_app(%s)", (app_role,))
        conn.execute("SELECT pgcounters.grant_worker(%s)", (worker_role,))
        with psycopg.connect(app_dsn, autocommit=True) as app:
            assert app.execute("SELECT * FROM pgcounters.get_many('granted', '{1}')").fetchall()
            assert app.execute("SELECT * FROM pgcounters.top('granted', 1)").fetchall() == []
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                app.execute("CALL pgcounters.drain_all()")
        with psycopg.connect(worker_dsn, autocommit=True) as worker:
            assert worker.execute("CALL pgcounters.drain_all()").fetchone() == (1, 0, 0)
            assert worker.execute("SELECT * FROM pgcounters.top('granted', 1)").fetchall()
        # revoke_role takes back the procedure too
        conn.execute("SELECT pgcounters.revoke_role(%s)", (worker_role,))
        allowed = conn.execute(
            "SELECT has_function_privilege(%s, "
            "'pgcounters.drain_all(integer, bigint, bigint, bigint)', 'EXECUTE')",
            (worker_role,),
        ).fetchone()
        assert allowed == (False,)
    # nobody else may run them
    with login_role(dsn, "sqlnobody") as (nobody, _):
        for routine in (
            "pgcounters.top(text, bigint)",
            "pgcounters.get_many(text, text[])",
            "pgcounters.drain_all(integer, bigint, bigint, bigint)",
        ):
            assert conn.execute(
                "SELECT has_function_privilege(%s, %s, 'EXECUTE')", (nobody, routine)
            ).fetchone() == (False,)


def test_the_schema_lists_only_its_own_functions(conn: Conn) -> None:
    """``\\df pgcounters.*`` is not swamped by btree_gist's functions: the extension
    lives in a schema of its own, and the exclusion constraint of the quotas still uses it."""
    count, from_extensions = conn.execute(
        "SELECT count(*), count(*) FILTER (WHERE EXISTS ("
        "  SELECT 1 FROM pg_depend AS d WHERE d.classid = 'pg_proc'::regclass"
        "   AND d.objid = p.oid AND d.deptype = 'e'))"
        "  FROM pg_proc AS p WHERE p.pronamespace = 'pgcounters'::regnamespace"
    ).fetchone() or (None, None)
    assert from_extensions == 0
    assert count is not None
    assert 50 < count < 150
    assert conn.execute(
        "SELECT extnamespace::regnamespace::text FROM pg_extension WHERE extname = 'btree_gist'"
    ).fetchone() == ("pgcounters_btree_gist",)
    conn.execute("SELECT pgcounters.define_quota('calls', 10, 'day')")
    conn.execute("SELECT pgcounters.set_limit('calls', 'alice', 5)")
    with pytest.raises(psycopg.Error) as overlap:
        conn.execute("SELECT pgcounters.set_limit('calls', 'alice', 6)")
    assert overlap.value.sqlstate in {"PCQ05", "23P01"}


def test_upgrade_moves_btree_gist_out_of_the_schema(empty_dsn: str) -> None:
    _at_version(empty_dsn, 15)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        before = conn.execute(
            "SELECT count(*) FROM pg_proc WHERE pronamespace = 'pgcounters'::regnamespace"
        ).fetchone()
        assert before is not None
        assert before[0] > 200
        conn.execute("SELECT pgcounters.define_quota('calls', 10, 'day')")
        conn.execute("SELECT pgcounters.set_limit('calls', 'bob', 5)")
        schema.upgrade(conn)
        after = conn.execute(
            "SELECT count(*) FROM pg_proc WHERE pronamespace = 'pgcounters'::regnamespace"
        ).fetchone()
        assert after is not None
        assert after[0] < 150
        with pytest.raises(psycopg.Error):
            conn.execute("SELECT pgcounters.set_limit('calls', 'bob', 6)")
        assert conn.execute(
            sql.SQL("SELECT count(*) FROM pgcounters.quota_limits WHERE subject = {}").format(
                sql.Literal("bob")
            )
        ).fetchone() == (1,)


def test_upgrade_leaves_btree_gist_in_use_by_the_database_owner_alone(empty_dsn: str) -> None:
    """An owner who is not a superuser cannot move the extension's objects: version 16
    creates it again in its own schema (test_schema_sql compares that road), unless the
    database's own objects use it: then it stays, and both the user's constraint and the
    quotas' keep working."""
    database = conninfo_to_dict(empty_dsn)["dbname"]
    with login_role(empty_dsn, "owner") as (role, as_role):
        with psycopg.connect(empty_dsn, autocommit=True) as admin:
            admin.execute(
                sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(
                    sql.Identifier(str(database)), sql.Identifier(role)
                )
            )
            admin.execute(
                sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(sql.Identifier(role))
            )
        try:
            _at_version(as_role, 15)
            with psycopg.connect(as_role, autocommit=True) as conn:
                # the owner's own table uses btree_gist's operator classes
                conn.execute(
                    "CREATE TABLE public.bookings (room integer, during tstzrange,"
                    " EXCLUDE USING gist (room WITH =, during WITH &&))"
                )
                notices: list[str] = []
                conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
                assert schema.upgrade(conn)[:1] == [16]  # then the versions after it
                assert any("btree_gist stays" in n for n in notices), notices
                conn.execute("INSERT INTO public.bookings VALUES (1, '[2026-01-01,2026-01-02)')")
                with pytest.raises(psycopg.errors.ExclusionViolation):
                    conn.execute(
                        "INSERT INTO public.bookings VALUES (1, '[2026-01-01,2026-01-03)')"
                    )
                conn.execute("SELECT pgcounters.define_quota('calls', 10, 'day')")
                conn.execute("SELECT pgcounters.set_limit('calls', 'eve', 5)")
                with pytest.raises(psycopg.Error):
                    conn.execute("SELECT pgcounters.set_limit('calls', 'eve', 6)")
                conn.execute("DROP TABLE public.bookings")
        finally:
            with psycopg.connect(empty_dsn, autocommit=True) as admin:
                admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
