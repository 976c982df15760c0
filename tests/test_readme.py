"""The README's quickstart, run line by line against a real database.

The code block is read from README.md itself, so the README cannot drift from the library
without this test failing: every line must run, and every value a comment promises (`-> 3`,
`[((42,), 3), ((7,), 1)]`) must be the value the line returns.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import psycopg

README = Path(__file__).resolve().parents[1] / "README.md"


def _quickstart_lines() -> list[str]:
    text = README.read_text(encoding="utf-8")
    section = text.split("## Quickstart", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block is not None, "README.md has no python block under ## Quickstart"
    return [line for line in block.group(1).splitlines() if line.strip()]


def _promised(comment: str) -> tuple[bool, object]:
    """The value a comment promises: after `->`, or a whole Python literal; else none."""
    candidate = comment.rsplit("->", 1)[1] if "->" in comment else comment
    try:
        return True, ast.literal_eval(candidate.strip())
    except (ValueError, SyntaxError):
        return False, None


def test_readme_quickstart_runs_and_returns_what_its_comments_say(dsn: str) -> None:
    lines = _quickstart_lines()
    connects = [i for i, line in enumerate(lines) if 'psycopg.connect("dbname=app"' in line]
    assert len(connects) == 1, "the quickstart should open one connection to dbname=app"
    namespace: dict[str, Any] = {}
    checked = 0
    for line in lines:
        code, _, comment = line.partition("#")
        code = code.replace('"dbname=app"', repr(dsn))
        statement = ast.parse(code.strip()).body[0]
        has_value, expected = _promised(comment)
        if isinstance(statement, ast.Expr) and has_value:
            value = eval(compile(ast.Expression(statement.value), "README.md", "eval"), namespace)
            assert value == expected, f"{line.strip()!r} returned {value!r}"
            checked += 1
        else:
            exec(compile(ast.Module([statement], []), "README.md", "exec"), namespace)
    assert checked == 2, "the quickstart promises the exact value and the top list"
    conn = namespace["conn"]
    assert isinstance(conn, psycopg.Connection)
    # the drain applied everything: nothing pending, stored values equal the exact ones
    assert namespace["counters"].pending() == (0, 0)
    assert namespace["counters"].get("article.views", 42, exact=False) == 3
    conn.close()
