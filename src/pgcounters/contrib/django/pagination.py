"""An admin paginator that does not ``count(*)`` very large tables."""

from __future__ import annotations

from functools import cached_property
from typing import Any

from django.core.paginator import Paginator
from django.db import connections

from pgcounters.estimates import estimate_query


def estimated_count(queryset: Any, *, using: str | None = None) -> int:
    """The planner's estimate of ``queryset.count()`` (nothing is counted)."""
    alias = using or queryset.db
    text, params = queryset.query.sql_with_params()
    from pgcounters.contrib.django.db import psycopg_connection

    connections[alias].ensure_connection()
    with psycopg_connection(alias) as conn:
        return estimate_query(conn, text, params)


class EstimatedCountPaginator(Paginator):  # type: ignore[type-arg]
    """Counts exactly below ``threshold`` rows, and uses the planner's estimate above it.

    In a ModelAdmin: ``paginator = EstimatedCountPaginator`` and
    ``show_full_result_count = False``.
    """

    threshold = 100_000

    @cached_property
    def count(self) -> int:
        queryset = self.object_list
        if hasattr(queryset, "query"):
            estimate = estimated_count(queryset)
            if estimate > self.threshold:
                return estimate
        return len(queryset) if not hasattr(queryset, "count") else int(queryset.count())
