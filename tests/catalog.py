"""What PostgreSQL's catalogs say the pgcounters schema is, object by object.

``snapshot(conn)`` maps a name for each object ("function pgcounters.get(text,
text[])", "table pgcounters.queue", "rows pgcounters.buffer_settings", ...) to
the text of its definition as the catalog gives it back: columns with types,
defaults and nullability; constraints and indexes as ``pg_get_constraintdef``
and ``pg_get_indexdef`` print them; functions as ``pg_get_functiondef`` prints
them (owner's rights, settings, volatility) with their effective grants;
triggers, event triggers, sequences, types, comments, and the rows of every
table. ``differences(a, b)`` says, per object, what one has and the other lacks.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any

from psycopg import sql
from psycopg.rows import tuple_row

from pgcounters.connection import Conn

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def _queries() -> dict[str, str]:
    """The named blocks of catalog.sql (beside this file)."""
    text = (Path(__file__).parent / "catalog.sql").read_text(encoding="utf-8")
    marks = list(_NAME.finditer(text))
    ends = [m.start() for m in marks[1:]] + [len(text)]
    return {
        m.group(1): text[m.end() : e].strip().rstrip(";") for m, e in zip(marks, ends, strict=True)
    }


def snapshot(conn: Conn) -> dict[str, str]:
    """Every object of the pgcounters schema: its name -> its definition."""
    out: dict[str, str] = {}
    with conn.cursor(row_factory=tuple_row) as cur:
        queries = _queries()
        cur.execute(queries.pop("privileges_function"))
        tables = queries.pop("tables")
        for query in queries.values():
            for name, definition in cur.execute(query).fetchall():
                assert name not in out, f"two objects named {name}"
                out[name] = definition or ""
        for table, relname, columns in cur.execute(tables).fetchall():
            selected = sql.SQL(", ").join(sql.Identifier(c) for c in columns)
            rows = cur.execute(
                sql.SQL(
                    "SELECT row_to_json(r)::text FROM (SELECT {} FROM pgcounters.{}) AS r"
                    " ORDER BY 1"
                ).format(selected, sql.Identifier(relname))
            ).fetchall()
            out[f"rows {table}"] = "\n".join(r[0] for r in rows)
    return out


def differences(left: dict[str, Any], right: dict[str, Any], names: tuple[str, str]) -> str:
    """What differs between two snapshots, object by object ('' when nothing does)."""
    a, b = names
    report: list[str] = []
    for name in sorted(left.keys() | right.keys()):
        if name not in right:
            report.append(f"- {name}: only in {a}\n{_indent(left[name])}")
        elif name not in left:
            report.append(f"- {name}: only in {b}\n{_indent(right[name])}")
        elif left[name] != right[name]:
            diff = difflib.unified_diff(
                left[name].splitlines(), right[name].splitlines(), a, b, lineterm="", n=2
            )
            report.append(f"- {name}: differs\n{_indent(chr(10).join(diff))}")
    return "\n".join(report)


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())
