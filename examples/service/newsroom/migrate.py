"""The service's Alembic migrations, run from Python (``alembic upgrade head`` does the same
from the shell, in this folder)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

HERE = Path(__file__).resolve().parent.parent


def alembic_config(dsn: str) -> Config:
    """The configuration of ``alembic.ini``, on ``dsn``."""
    config = Config(str(HERE / "alembic.ini"))
    config.attributes["dsn"] = dsn
    config.attributes["configure_logging"] = False
    return config


def upgrade(dsn: str, revision: str = "head") -> None:
    """Bring the database to ``revision``: the tables, the pgcounters schema, the counters."""
    command.upgrade(alembic_config(dsn), revision)
