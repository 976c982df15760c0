"""Where the database is: a DSN from the environment, or the embedded server."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

from pgcounters.connection import Conn
from pgcounters.errors import ConnectionFailed

DSN_VARIABLES = ("PGCOUNTERS_DSN", "DATABASE_URL")
DATA_DIR_VARIABLE = "PGCOUNTERS_DATA_DIR"
DEFAULT_DATA_DIR = "pgcounters-data"


def dsn_from_env() -> str | None:
    """``PGCOUNTERS_DSN``, else ``DATABASE_URL``, else None."""
    for name in DSN_VARIABLES:
        value = os.environ.get(name, "").strip()
        if value:
            return value
    return None


def data_dir(explicit: str | None = None) -> Path:
    """The embedded data directory: explicit, ``PGCOUNTERS_DATA_DIR``, or ./pgcounters-data."""
    return Path(explicit or os.environ.get(DATA_DIR_VARIABLE) or DEFAULT_DATA_DIR).absolute()


def redact(dsn: str) -> str:
    """``dsn`` with any password hidden, for messages."""
    dsn = re.sub(r"(password\s*=\s*)('[^']*'|\S+)", r"\1***", dsn)
    return re.sub(r"(://[^:/@]+:)[^@]*@", r"\1***@", dsn)


def connect(dsn: str, *, autocommit: bool = True, **kwargs: Any) -> Conn:
    """Open a connection; a failure becomes :class:`ConnectionFailed` naming the (redacted) DSN."""
    try:
        return psycopg.connect(dsn, autocommit=autocommit, **kwargs)
    except (psycopg.OperationalError, psycopg.ProgrammingError) as exc:
        raise connection_failed(dsn, exc) from exc


def connection_failed(dsn: str, exc: psycopg.Error) -> ConnectionFailed:
    """The error for a connection attempt to ``dsn`` that failed (the DSN redacted)."""
    # libpq's message spans lines (the failure, then a hint): one line, each part kept
    reason = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    if isinstance(exc, psycopg.ProgrammingError):
        return ConnectionFailed(f"invalid DSN {redact(dsn)!r}: {reason}")
    reason = reason.removeprefix("connection failed: ") or type(exc).__name__
    return ConnectionFailed(f"could not connect to PostgreSQL at {redact(dsn)!r}: {reason}")


@contextmanager
def database(
    dsn: str | None = None, data: str | None = None, *, quiet: bool = False
) -> Iterator[str]:
    """Yield a DSN: the one given or configured, else an embedded server's, stopped on exit.

    Starting the embedded server is said in one line on stderr, with where its data
    lives, unless ``quiet``.
    """
    dsn = dsn or dsn_from_env()
    if dsn:
        yield dsn
        return
    from pgcounters.embedded import EmbeddedPostgres, running

    folder = data_dir(data)
    if not quiet:
        # a notice, on stderr: stdout stays the command's output (e.g. one JSON object)
        what = (
            "using the embedded PostgreSQL server already running (left running)"
            if EmbeddedPostgres(folder).is_running()
            else "starting the embedded PostgreSQL server"
        )
        print(
            f"pgcounters: no --dsn, PGCOUNTERS_DSN or DATABASE_URL: {what}, its data in {folder}",
            file=sys.stderr,
            flush=True,
        )
    with running(folder) as server:
        yield server.dsn()
