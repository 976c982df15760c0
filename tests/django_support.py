"""Helpers of the Django tests on the blog example."""

from __future__ import annotations

from pgcounters import Counters
from pgcounters.contrib.django import declared_counters
from pgcounters.contrib.django.db import psycopg_connection
from pgcounters.recount import verify


def drain() -> None:
    with psycopg_connection() as conn:
        Counters(conn).drain()


def assert_exact() -> None:
    """Every declared counter equals the S1 truth."""
    with psycopg_connection() as conn:
        for _, spec in declared_counters():
            assert verify(conn, spec).mismatches == [], spec.name
