"""schema.sql (what a fresh install runs) builds the schema the migrations build.

Two real databases: one gets ``sql/schema.sql``, the other every file of
``sql/migrations`` in order (as an upgrade from the first version, and as the
Django migrations deliver them). Their catalogs are compared object by object;
a failure names each object that differs and shows the difference, which is
what to copy into schema.sql after adding a migration.
"""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from catalog import differences, snapshot
from pgcounters import schema, sqlfiles
from pgcounters.errors import SchemaError
from roles import login_role


def _from_schema_sql(dsn: str) -> dict[str, str]:
    current = sqlfiles.schema()
    with psycopg.connect(dsn, autocommit=True) as conn:
        with conn.transaction():
            conn.execute(current.sql.encode())
            for migration in sqlfiles.migrations():
                if migration.version <= current.version:
                    conn.execute(
                        sqlfiles.query("record_migration"),
                        {"version": migration.version, "name": migration.name},
                    )
        return snapshot(conn)


def _from_migrations(dsn: str) -> dict[str, str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for migration in sqlfiles.migrations():
            with conn.transaction():
                assert schema.apply_migration(conn, migration.filename)
        return snapshot(conn)


def test_schema_sql_builds_what_the_migrations_build(
    empty_dsn: str, another_empty_dsn: str
) -> None:
    built = _from_schema_sql(empty_dsn)
    migrated = _from_migrations(another_empty_dsn)
    report = differences(built, migrated, ("schema.sql", "migrations"))
    assert not report, (
        "schema.sql and the migrations applied in order build different schemas "
        "(make schema.sql say what the migrations leave):\n" + report
    )
    # the comparison saw the schema's objects, not an empty catalog
    for name in (
        "table pgcounters.queue",
        "function pgcounters.get(text,text[])",
        "event trigger pgcounters_guard_ddl",
        "rows pgcounters.buffer_settings",
    ):
        assert name in migrated, name


def test_schema_sql_stands_for_the_latest_migration() -> None:
    latest = sqlfiles.migrations()[-1]
    assert sqlfiles.schema().version == latest.version, (
        f"schema.sql is at version {sqlfiles.schema().version}, the migrations go up to "
        f"{latest.filename}: fold the newer migrations into schema.sql and change its "
        f"'-- version:' line (test_schema_sql_builds_what_the_migrations_build shows what differs)"
    )


def test_the_comparison_sees_a_difference(empty_dsn: str, another_empty_dsn: str) -> None:
    """A changed function body, grant, column default or seeded row is reported by name."""
    built = _from_schema_sql(empty_dsn)
    with psycopg.connect(another_empty_dsn, autocommit=True) as conn:
        with conn.transaction():
            conn.execute(sqlfiles.schema().sql.encode())
        conn.execute(
            "CREATE OR REPLACE FUNCTION pgcounters.is_paused(p_name text) RETURNS boolean"
            " LANGUAGE sql STABLE AS $$ SELECT false $$"
        )
        conn.execute("GRANT EXECUTE ON FUNCTION pgcounters.drain_queue(integer, boolean) TO PUBLIC")
        conn.execute("ALTER TABLE pgcounters.specs ALTER COLUMN replica_writes SET DEFAULT 'count'")
        conn.execute("UPDATE pgcounters.buffer_settings SET retention = '8 days'")
        changed = snapshot(conn)
    report = differences(built, changed, ("schema.sql", "changed"))
    for name in (
        "function pgcounters.is_paused(text): differs",
        "function pgcounters.drain_queue(integer,boolean): differs",
        "table pgcounters.specs: differs",
        "rows pgcounters.buffer_settings: differs",
        "rows pgcounters.migrations: differs",
    ):
        assert f"- {name}" in report, report
    assert "+PUBLIC EXECUTE to" in report


def test_one_migration_at_a_time_skips_what_an_install_recorded(empty_dsn: str) -> None:
    """The Django path after ``pgcounters install``: every file is recorded, none runs again."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert schema.install(conn) == [m.version for m in sqlfiles.migrations()]
        for migration in sqlfiles.migrations():
            with conn.transaction():
                assert not schema.apply_migration(conn, migration.filename)
        assert schema.state(conn).current


def test_one_migration_at_a_time_then_upgrade(empty_dsn: str) -> None:
    """Half the files one by one (as Django would), then ``upgrade`` applies the rest."""
    migrations = sqlfiles.migrations()
    half = len(migrations) // 2
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        for migration in migrations[:half]:
            with conn.transaction():
                assert schema.apply_migration(conn, migration.filename)
        assert schema.installed_version(conn) == migrations[half - 1].version
        assert schema.install(conn) == []  # an older schema is left to upgrade
        assert schema.upgrade(conn) == [m.version for m in migrations[half:]]
        assert schema.state(conn).current


def test_an_unknown_migration_file_is_refused(empty_dsn: str) -> None:
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        with pytest.raises(SchemaError, match=r"no migration 0099_nothing\.sql"):
            schema.apply_migration(conn, "0099_nothing")
        assert schema.installed_version(conn) is None


def test_both_roads_agree_for_an_owner_that_is_not_a_superuser(
    empty_dsn: str, another_empty_dsn: str
) -> None:
    """Installed by an ordinary role (no event trigger can be created then), schema.sql and
    the migrations still build one schema: owned by that role, without the DDL guards."""
    other_db = conninfo_to_dict(another_empty_dsn)["dbname"]
    with login_role(empty_dsn, "owner") as (role, as_role):
        as_role_other = make_conninfo(as_role, dbname=other_db)
        for dsn in (empty_dsn, another_empty_dsn):
            with psycopg.connect(dsn, autocommit=True) as admin:
                database = conninfo_to_dict(dsn)["dbname"]
                admin.execute(
                    sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(
                        sql.Identifier(str(database)), sql.Identifier(role)
                    )
                )
        try:
            built = _from_schema_sql(as_role)
            migrated = _from_migrations(as_role_other)
        finally:
            with psycopg.connect(another_empty_dsn, autocommit=True) as admin:
                admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
    report = differences(built, migrated, ("schema.sql", "migrations"))
    assert not report, report
    assert "event trigger pgcounters_guard_ddl" not in built
    assert f"owner {role}" in built["schema pgcounters"]
