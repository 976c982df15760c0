"""Installing and upgrading the pgcounters schema (the SQL in ``sql/migrations``)."""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg.rows import tuple_row

from pgcounters import plans, sqlfiles
from pgcounters.connection import Conn
from pgcounters.dberrors import translated
from pgcounters.errors import SchemaNotInstalled, SchemaVersionMismatch
from pgcounters.plans import Execute, Plan


@dataclass(frozen=True)
class SchemaState:
    installed: int | None
    expected: int

    @property
    def current(self) -> bool:
        return self.installed == self.expected


def installed_version_plan() -> Plan[int | None]:
    """The installed schema version, None when the schema is not installed."""
    row = yield Execute(sqlfiles.query("schema_exists"), fetch="one")
    if row is None or not row[0]:
        return None
    row = yield Execute(sqlfiles.query("installed_version"), fetch="one")
    return int(row[0]) if row else None


def installed_version(conn: Conn) -> int | None:
    """The installed schema version, None when the schema is not installed."""
    return plans.run(installed_version_plan(), conn)


def state(conn: Conn) -> SchemaState:
    return SchemaState(installed_version(conn), sqlfiles.latest_version())


def check_plan() -> Plan[None]:
    """Raise unless the installed schema is exactly the version this code expects."""
    current = SchemaState((yield from installed_version_plan()), sqlfiles.latest_version())
    if current.installed is None:
        raise SchemaNotInstalled()
    if current.installed < current.expected:
        raise SchemaVersionMismatch(
            f"the pgcounters schema is at version {current.installed}, this code needs "
            f"{current.expected}: run `pgcounters upgrade`"
        )
    if current.installed > current.expected:
        raise SchemaVersionMismatch(
            f"the pgcounters schema is at version {current.installed}, newer than this code "
            f"({current.expected}): upgrade the pgcounters package"
        )


def check(conn: Conn) -> None:
    """Raise unless the installed schema is exactly the version this code expects."""
    plans.run(check_plan(), conn)


def _apply(conn: Conn, *, only_if_fresh: bool) -> list[int]:
    """Apply missing migrations in one transaction under an advisory lock."""
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        raise psycopg.ProgrammingError("install/upgrade must run outside a transaction")
    applied: list[int] = []
    with translated(), conn.transaction(), conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(sqlfiles.query("install_lock"))
        found = installed_version(conn)
        if only_if_fresh and found is not None:
            return applied
        version = -1 if found is None else found
        if version > sqlfiles.latest_version():
            raise SchemaVersionMismatch(
                f"the pgcounters schema is at version {version}, newer than this code "
                f"({sqlfiles.latest_version()}): upgrade the pgcounters package"
            )
        for migration in sqlfiles.migrations():
            if migration.version <= version:
                continue
            cur.execute(migration.sql.encode())
            cur.execute(
                sqlfiles.query("record_migration"),
                {"version": migration.version, "name": migration.name},
            )
            applied.append(migration.version)
    return applied


def install(conn: Conn) -> list[int]:
    """Install the schema if it is absent (idempotent). Returns the versions applied.

    An existing older schema is left alone: that is what :func:`upgrade` is for,
    and :func:`check` reports it.
    """
    return _apply(conn, only_if_fresh=True)


def upgrade(conn: Conn) -> list[int]:
    """Apply every migration newer than the installed version. Returns the versions applied."""
    return _apply(conn, only_if_fresh=False)
