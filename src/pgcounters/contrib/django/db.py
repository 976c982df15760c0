"""The psycopg 3 connection and DSN behind a Django database alias."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from django.db import connections
from psycopg.conninfo import make_conninfo

from pgcounters.connection import Conn
from pgcounters.contrib.django.errors import SettingsError


def dsn(using: str = "default") -> str:
    """A libpq connection string for the Django database ``using``."""
    params = dict(connections[using].get_connection_params())
    keep = {k: v for k, v in params.items() if k in _LIBPQ and v not in (None, "")}
    if "database" in params and "dbname" not in keep:
        keep["dbname"] = params["database"]
    return make_conninfo(**{k: str(v) for k, v in keep.items()})


_LIBPQ = {"dbname", "user", "password", "host", "port", "sslmode", "options", "application_name"}


def raw_connection(using: str = "default") -> Conn:
    """Django's own connection ``using`` when it is a psycopg 3 one, else an error."""
    wrapper = connections[using]
    wrapper.ensure_connection()
    raw = wrapper.connection
    if not isinstance(raw, psycopg.Connection):
        raise SettingsError(
            "pgcounters needs Django's PostgreSQL backend on psycopg 3 "
            "(pip install 'psycopg[binary]')"
        )
    return raw


@contextmanager
def psycopg_connection(using: str = "default") -> Iterator[Conn]:
    """Django's own connection when it is a psycopg 3 one (same transaction), else an error."""
    yield raw_connection(using)
