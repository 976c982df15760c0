"""Installing and upgrading the pgcounters schema.

A database without the schema gets ``sql/schema.sql`` (the current definition of
every object, in one file) and every version it contains is recorded as
applied; any migration newer than that file is applied after it. A database
with an older schema is upgraded by the migrations of ``sql/migrations`` above
its recorded version, one after the other. A test proves that both roads build
the same schema.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import tuple_row

from pgcounters import plans, sqlfiles
from pgcounters.connection import Conn
from pgcounters.dberrors import translated
from pgcounters.errors import (
    InvalidArgument,
    SchemaNotInstalled,
    SchemaVersionMismatch,
    UnsupportedServer,
)
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


OLDEST_SERVER = 150000
"""The oldest PostgreSQL pgcounters installs on (``server_version_num``): the oldest the
test suite runs on (Debian's 15; the embedded wheel gives 18)."""


def check_server(version_num: int) -> None:
    """Raise :class:`UnsupportedServer` for a PostgreSQL older than :data:`OLDEST_SERVER`."""
    if version_num < OLDEST_SERVER:
        major = version_num // 10000
        raise UnsupportedServer(
            f"pgcounters needs PostgreSQL {OLDEST_SERVER // 10000} or later; this server is "
            f"PostgreSQL {major}"
        )


def _apply(conn: Conn, *, only_if_fresh: bool) -> list[int]:
    """Install or upgrade in one transaction under an advisory lock."""
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        raise psycopg.ProgrammingError("install/upgrade must run outside a transaction")
    check_server(conn.info.server_version)
    with translated(), conn.transaction(), conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(sqlfiles.query("install_lock"))
        found = installed_version(conn)
        if found is None:
            return _install_fresh(cur)
        if only_if_fresh:
            return []
        if found > sqlfiles.latest_version():
            raise SchemaVersionMismatch(
                f"the pgcounters schema is at version {found}, newer than this code "
                f"({sqlfiles.latest_version()}): upgrade the pgcounters package"
            )
        return _migrate(cur, after=found)


def _install_fresh(cur: psycopg.Cursor[tuple[Any, ...]]) -> list[int]:
    """The whole schema from schema.sql, then any migration newer than that file."""
    current = sqlfiles.schema()
    cur.execute(current.sql.encode())
    folded = [m for m in sqlfiles.migrations() if m.version <= current.version]
    for migration in folded:
        _record(cur, migration)
    return [m.version for m in folded] + _migrate(cur, after=current.version)


def _migrate(cur: psycopg.Cursor[tuple[Any, ...]], *, after: int) -> list[int]:
    """Apply, in order, every migration numbered above ``after``."""
    applied: list[int] = []
    for migration in sqlfiles.migrations():
        if migration.version > after:
            cur.execute(migration.sql.encode())
            _record(cur, migration)
            applied.append(migration.version)
    return applied


def _record(cur: psycopg.Cursor[tuple[Any, ...]], migration: sqlfiles.Migration) -> None:
    cur.execute(
        sqlfiles.query("record_migration"),
        {"version": migration.version, "name": migration.name},
    )


def apply_migration(conn: Conn, filename: str) -> bool:
    """Apply the one migration named by its file (``"0008_drain_quarantine"``) unless
    it is recorded already; False when it was. Runs in the caller's transaction, under
    the install lock: this is how the Django migrations of the app deliver the schema,
    one file each, in order."""
    migration = sqlfiles.migration(filename)
    check_server(conn.info.server_version)
    with translated(), conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(sqlfiles.query("install_lock"))
        cur.execute(sqlfiles.query("schema_exists"))
        row = cur.fetchone()
        if row is not None and row[0]:
            cur.execute(sqlfiles.query("migration_recorded"), {"version": migration.version})
            if cur.fetchone() is not None:
                return False
        cur.execute(migration.sql.encode())
        _record(cur, migration)
    return True


def install(conn: Conn) -> list[int]:
    """Install the schema if it is absent (idempotent). Returns the versions applied.

    An existing older schema is left alone: that is what :func:`upgrade` is for,
    and :func:`check` reports it.
    """
    return _apply(conn, only_if_fresh=True)


def upgrade(conn: Conn) -> list[int]:
    """Apply every migration newer than the installed version (on a database without the
    schema: install it). Returns the versions applied."""
    return _apply(conn, only_if_fresh=False)


_PLACEHOLDER_RE = re.compile(r":(version|name)\b")


def _script_block(name: str, version: int = 0, migration_name: str = "") -> str:
    """One block of ``script.sql``, its ``:version`` and ``:name`` filled in (a number and
    a quoted literal: nothing else is written into the script)."""
    literal = "'" + migration_name.replace("'", "''") + "'"
    values = {"version": str(int(version)), "name": literal}
    text = sqlfiles.named("script.sql")[name]
    return _PLACEHOLDER_RE.sub(lambda m: values[m.group(1)], text).rstrip() + ";\n"


def script(from_version: int | None = None, *, transaction: bool = True) -> str:
    """The schema as a plain SQL script, for psql or any migration tool.

    With no ``from_version``: the install script, ``schema.sql`` and any migration newer
    than it, every version recorded as applied. With ``from_version``: the upgrade script
    from that version, the migrations after it, each recorded. Either is one transaction
    under the advisory lock :func:`install` and :func:`upgrade` take, and refuses (raises
    an error, changing nothing) a database it was not written for: an install script one
    where the schema exists, an upgrade script one at another version. With
    ``transaction=False`` the script has no ``BEGIN`` and no ``COMMIT`` (it takes the lock
    in the transaction it runs in): for a migration tool that runs it in its own.
    """
    latest = sqlfiles.latest_version()
    if from_version is not None and (
        isinstance(from_version, bool)
        or not isinstance(from_version, int)
        or not 1 <= from_version <= latest
    ):
        raise InvalidArgument(
            f"the version to upgrade from must be between 1 and {latest}, got {from_version!r}"
        )
    parts = [
        f"-- pgcounters schema version {latest}: "
        + ("install script" if from_version is None else f"upgrade from version {from_version}")
        + "\n",
        _script_block("script_begin" if transaction else "script_lock"),
    ]
    after = from_version
    if from_version is None:
        current = sqlfiles.schema()
        parts += [_script_block("script_expect_absent"), current.sql.rstrip() + "\n"]
        for migration in sqlfiles.migrations():
            if migration.version <= current.version:
                parts.append(_script_block("script_record", migration.version, migration.name))
        after = current.version
    else:
        parts.append(_script_block("script_expect_version", from_version))
    for migration in sqlfiles.migrations():
        if after is not None and migration.version > after:
            parts += [
                f"\n-- migration {migration.filename}\n",
                migration.sql.rstrip() + "\n",
                _script_block("script_record", migration.version, migration.name),
            ]
    if transaction:
        parts.append(_script_block("script_commit"))
    return "\n".join(parts)
