"""Estimated counts from planner statistics, where exactness is not needed.

``count(*)`` of a big table reads all of it. The planner keeps an estimate:
``reltuples`` of the table scaled to its current size (what the planner
itself does), or the row estimate of any query's plan.
"""

from __future__ import annotations

import json
from typing import Any

from psycopg import sql
from psycopg.rows import tuple_row

from pgcounters import sqlfiles
from pgcounters.connection import Conn
from pgcounters.dberrors import translated
from pgcounters.errors import InvalidArgument
from pgcounters.specs import Table


def estimate_table(conn: Conn, table: Table | str) -> int:
    """Estimated rows of a table: ``reltuples / relpages`` times its current pages.

    Before the first ANALYZE / VACUUM (``reltuples = -1``) the estimate is 0.
    """
    t = Table.of(table)
    with translated(), conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(sqlfiles.query("estimate_table"), (t.schema, t.name))
        row = cur.fetchone()
    if row is None:
        raise InvalidArgument(f"no table {t}")
    return max(0, round(float(row[0])))


def estimate_query(conn: Conn, query: str | sql.Composable, params: Any = None) -> int:
    """The planner's estimate of the rows a query returns (``EXPLAIN``, nothing is run)."""
    with translated(), conn.cursor(row_factory=tuple_row) as cur:
        stmt = sql.SQL(sqlfiles.query("explain_json")).format(
            statement=query if isinstance(query, sql.Composable) else sql.SQL(query)
        )
        cur.execute(stmt, params)
        row = cur.fetchone()
    assert row is not None
    plan = row[0] if not isinstance(row[0], str) else json.loads(row[0])
    return int(plan[0]["Plan"]["Plan Rows"])
