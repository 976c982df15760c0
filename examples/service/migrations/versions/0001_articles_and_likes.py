"""Articles, their likes, and the counters of likes and views.

Written by ``alembic revision --autogenerate`` from ``newsroom/models.py`` (the tables,
``op.install_pgcounters()`` and ``op.create_counter(...)`` of the declared
``Article.like_count``), then given the event counter of views by hand.

Revision ID: 0001
Revises:
Create Date: 2026-11-24 11:56:14
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# adds op.install_pgcounters(), op.create_counter(), ...: operations registered at run time,
# which a type checker does not see on `op` (hence the ignores below)
import pgcounters.contrib.alembic  # noqa: F401

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Article.like_count as data: what this migration installs, whatever the models say later
LIKE_COUNT = {
    "version": 1,
    "name": "article.like_count",
    "source": {"schema": "public", "table": "article_like"},
    "keys": ["article_id"],
    "where": None,
    "sum": None,
    "mode": "queued",
    "target": {
        "kind": "column",
        "schema": "public",
        "table": "article",
        "column": "like_count",
        "key_column": "id",
        "key_type": "bigint",
    },
}


def upgrade() -> None:
    op.create_table(
        "article",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("title", sa.String(length=200), nullable=False),
        sa.Column("like_count", sa.BigInteger(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_article_like_count"), "article", ["like_count"], unique=False)
    op.create_table(
        "article_like",
        sa.Column("article_id", sa.BigInteger(), nullable=False),
        sa.Column("user_name", sa.String(length=100), nullable=False),
        sa.ForeignKeyConstraint(["article_id"], ["article.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("article_id", "user_name"),
    )
    # the pgcounters schema, in this migration's transaction
    op.install_pgcounters()  # type: ignore[attr-defined]
    # the triggers on article_like that keep article.like_count, and the count of the rows
    # already there
    op.create_counter(LIKE_COUNT)  # type: ignore[attr-defined]
    # views: an event counter keyed by the article id, incremented by the service
    op.execute("SELECT pgcounters.create_counter('article.views', ARRAY['bigint'])")


def downgrade() -> None:
    op.execute("SELECT pgcounters.drop_counter('article.views')")
    op.drop_counter("article.like_count", previous=LIKE_COUNT)  # type: ignore[attr-defined]
    # the schema stays: it may hold the counters of other applications
    op.pgcounters_schema_stays()  # type: ignore[attr-defined]
    op.drop_table("article_like")
    op.drop_index(op.f("ix_article_like_count"), table_name="article")
    op.drop_table("article")
