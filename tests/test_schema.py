from __future__ import annotations

import threading

import psycopg
import pytest

from pgcounters import (
    Counters,
    SchemaNotInstalled,
    SchemaVersionMismatch,
    install,
    schema,
    sqlfiles,
    upgrade,
)
from pgcounters.connection import Conn

pytestmark = pytest.mark.fast


def test_install_is_idempotent_and_records_the_version(empty_dsn: str) -> None:
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert schema.installed_version(conn) is None
        assert install(conn) == [m.version for m in sqlfiles.migrations()]
        assert install(conn) == []
        assert upgrade(conn) == []
        assert schema.state(conn).current
        rows = conn.execute("SELECT version, name FROM pgcounters.migrations").fetchall()
        assert rows == [(m.version, m.name) for m in sqlfiles.migrations()]
        assert rows[0] == (1, "initial")


def test_concurrent_installs_apply_once(empty_dsn: str) -> None:
    results: list[list[int]] = []

    def run() -> None:
        with psycopg.connect(empty_dsn, autocommit=True) as conn:
            results.append(install(conn))

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results, key=len) == [[], [], [], [m.version for m in sqlfiles.migrations()]]


def test_client_on_a_database_without_the_schema(empty_dsn: str) -> None:
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        pc = Counters(conn)
        with pytest.raises(SchemaNotInstalled, match="pgcounters install"):
            pc.incr("anything")
        with pytest.raises(SchemaNotInstalled):
            pc.create_counter("anything")
        # nothing was created on the way
        row = conn.execute("SELECT to_regnamespace('pgcounters')").fetchone()
        assert row == (None,)


def test_a_newer_schema_than_the_code_is_refused(conn: Conn) -> None:
    conn.execute("INSERT INTO pgcounters.migrations (version, name) VALUES (999, 'future')")
    with pytest.raises(SchemaVersionMismatch, match="newer than this code"):
        Counters(conn).incr("x")
    with pytest.raises(SchemaVersionMismatch):
        upgrade(conn)


def test_an_older_schema_asks_for_upgrade(conn: Conn) -> None:
    # pretend the latest migration was never recorded
    conn.execute("DELETE FROM pgcounters.migrations")
    conn.execute("INSERT INTO pgcounters.migrations (version, name) VALUES (0, 'older')")
    with pytest.raises(SchemaVersionMismatch, match="pgcounters upgrade"):
        schema.check(conn)


def test_migrations_are_numbered_in_order_each_number_once() -> None:
    # a gap is allowed (a number taken by a change that never shipped), a duplicate is not
    versions = [m.version for m in sqlfiles.migrations()]
    assert versions[:7] == list(range(1, 8))
    assert versions == sorted(set(versions))
    assert sqlfiles.latest_version() == versions[-1]
    assert [m.name for m in sqlfiles.migrations() if m.version == 10] == ["clock"]


def test_every_named_query_is_loaded() -> None:
    names = sqlfiles.queries()
    for name in ("enqueue", "exact_named", "drain_batch", "top_named", "direct_column"):
        assert name in names
        assert names[name].strip()
