"""Articles and their likes: the tables.

Written by ``alembic revision --autogenerate`` from ``newsroom/models.py``. Their counters
come in the next revision, which counts the likes already written by then.

Revision ID: 0001
Revises:
Create Date: 2026-11-24 11:56:14
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


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


def downgrade() -> None:
    op.drop_table("article_like")
    op.drop_index(op.f("ix_article_like_count"), table_name="article")
    op.drop_table("article")
