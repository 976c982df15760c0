"""Database roles for the least-privilege tests: unique names, dropped afterwards."""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo


@contextmanager
def login_role(dsn: str, prefix: str) -> Iterator[tuple[str, str]]:
    """A new LOGIN role with a password: yields (role name, DSN connecting as it to ``dsn``'s
    database). On exit its rights in that database are dropped, then the role."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    password = secrets.token_hex(16)
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                sql.Identifier(name), sql.Literal(password)
            )
        )
    params: dict[str, Any] = conninfo_to_dict(dsn)
    params.update(user=name, password=password)
    try:
        yield name, make_conninfo(**params)
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                (name,),
            )
            admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))
