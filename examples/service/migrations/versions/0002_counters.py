"""The counters: likes per article (declared on the model) and views per article.

``op.install_pgcounters()`` and ``op.create_counter(...)`` are what ``alembic revision
--autogenerate`` writes for ``Article.like_count``, declared on the model and not installed;
the event counter of views was added by hand. On a database whose articles already have
likes, ``create_counter`` counts them in this migration's transaction: the column does not
start at 0.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-24 11:58:02
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

# adds op.install_pgcounters(), op.create_counter(), ...: operations registered at run time,
# which a type checker does not see on `op` (hence the ignores below)
import pgcounters.contrib.alembic  # noqa: F401

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
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
