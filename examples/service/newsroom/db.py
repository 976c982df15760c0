"""Where the database is, for the service and its migrations."""

from __future__ import annotations

import psycopg
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from pgcounters import dsn_from_env
from pgcounters.errors import ConfigurationError

# the event counter of article views (created by the migrations, keyed by the article id)
VIEWS = "article.views"
# the quota of the public API: calls per API key per day
API_QUOTA = "api.calls"


def configured_dsn() -> str:
    """``PGCOUNTERS_DSN``, else ``DATABASE_URL`` (a libpq DSN or a postgresql:// URL)."""
    dsn = dsn_from_env()
    if dsn is None:
        raise ConfigurationError(
            "no database: set PGCOUNTERS_DSN (or DATABASE_URL), or start the service with "
            "`python -m newsroom`, which starts an embedded PostgreSQL"
        )
    return dsn


def engine_for(dsn: str) -> AsyncEngine:
    """An async SQLAlchemy engine on psycopg 3, connecting with the DSN as it is."""

    async def connect() -> psycopg.AsyncConnection[tuple[object, ...]]:
        return await psycopg.AsyncConnection.connect(dsn)

    return create_async_engine("postgresql+psycopg://", async_creator=connect)
