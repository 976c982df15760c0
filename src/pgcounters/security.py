"""Least-privilege grants for application and worker roles (migration 0006).

An *application* role enqueues deltas, calls quota functions and reads; a
*worker* role also drains, recounts and purges. Roles are global to the
PostgreSQL cluster, so pgcounters never creates them: an administrator creates
them (``CREATE ROLE app LOGIN``) and runs :func:`grant_app` /
:func:`grant_worker` (``pgcounters grant --app app --worker worker``) in each
database. See ``docs/security.md`` for the list of rights.
"""

from __future__ import annotations

from typing import Literal, TypeAlias

from psycopg.rows import tuple_row

from pgcounters import schema, sqlfiles
from pgcounters.connection import Conn
from pgcounters.dberrors import translated
from pgcounters.errors import ConfigurationError

Kind: TypeAlias = Literal["app", "worker", "pause", "revoke"]
_QUERY: dict[Kind, str] = {
    "app": "grant_app",
    "worker": "grant_worker",
    "pause": "grant_pause",
    "revoke": "revoke_role",
}
MAX_ROLE_BYTES = 63


def _check_role(role: object) -> str:
    if not isinstance(role, str) or not role or "\x00" in role:
        raise ConfigurationError(
            f"a role name must be a non-empty string without NUL, got {role!r}"
        )
    if len(role.encode()) > MAX_ROLE_BYTES:
        raise ConfigurationError(
            f"role name {role!r} is longer than PostgreSQL's limit of {MAX_ROLE_BYTES} bytes"
        )
    return role


def _run(conn: Conn, kind: Kind, role: str) -> list[str]:
    _check_role(role)
    schema.check(conn)
    with translated(), conn.transaction(), conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(sqlfiles.query(_QUERY[kind]), {"role": role})
        row = cur.fetchone()
    return list(row[0]) if row and row[0] else []


def grant_app(conn: Conn, role: str) -> list[str]:
    """Grant ``role`` the rights of an application. Returns the GRANT statements run."""
    return _run(conn, "app", role)


def grant_worker(conn: Conn, role: str) -> list[str]:
    """Grant ``role`` the rights of a worker (drain, recount, purge, backfills, and the app's)."""
    return _run(conn, "worker", role)


def grant_pause(conn: Conn, role: str) -> list[str]:
    """Let ``role`` pause counting in its own sessions (``pgcounters.paused``, for bulk
    imports followed by a recount). The schema's owner and superusers may always; any other
    role that sets it gets an error at its first counted write."""
    return _run(conn, "pause", role)


def revoke(conn: Conn, role: str) -> list[str]:
    """Take back the rights on pgcounters' own objects granted to ``role``."""
    return _run(conn, "revoke", role)
