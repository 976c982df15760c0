"""Alembic's environment of the newsroom service: async SQLAlchemy on psycopg 3.

Importing ``pgcounters.contrib.alembic`` adds the pgcounters operations to ``op``
(``op.install_pgcounters()``, ``op.create_counter(...)``) and lets autogenerate compare
the counters declared on the models with the database, as it does the tables.
"""

from __future__ import annotations

import asyncio
from logging.config import fileConfig

from alembic import context
from sqlalchemy import Connection

import pgcounters.contrib.alembic  # noqa: F401
from newsroom.db import configured_dsn, engine_for
from newsroom.models import Base

config = context.config
if config.config_file_name is not None and config.attributes.get("configure_logging", True):
    fileConfig(config.config_file_name)

target_metadata = Base.metadata


def dsn() -> str:
    """The database: ``config.attributes["dsn"]`` when a program gives one, else the
    environment's."""
    given = config.attributes.get("dsn")
    return given if isinstance(given, str) else configured_dsn()


def run_migrations_offline() -> None:
    """``alembic upgrade head --sql``: the SQL of the migrations, for review."""
    context.configure(
        dialect_name="postgresql", target_metadata=target_metadata, literal_binds=True
    )
    with context.begin_transaction():
        context.run_migrations()


def do_run_migrations(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata)
    with context.begin_transaction():
        context.run_migrations()


async def run_async_migrations() -> None:
    engine = engine_for(dsn())
    try:
        async with engine.connect() as connection:
            await connection.run_sync(do_run_migrations)
    finally:
        await engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    asyncio.run(run_async_migrations())
