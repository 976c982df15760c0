"""The connection type every part of pgcounters takes: a psycopg 3 connection.

Rows are read as tuples (psycopg's default row factory); the alias keeps signatures short.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import psycopg

Conn: TypeAlias = psycopg.Connection[Any]
