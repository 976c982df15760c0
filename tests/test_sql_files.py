"""The SQL the package runs lives in its ``sql/`` files, in named, described blocks."""

from __future__ import annotations

import ast
import re
from importlib import resources
from pathlib import Path

import pgcounters
from pgcounters import sqlfiles

PACKAGE = Path(pgcounters.__file__).parent

# modules whose SQL is built, not written: the trigger compiler; and the parts that are not
# the library (the CLI, the demos and the benchmarks)
BUILT_OR_NOT_LIBRARY = re.compile(
    r"^(compiler\.py|cli(/|\.py)|demos?/|bench/|demo\w*\.py|workloads\.py)"
)

STATEMENT = re.compile(
    r"^\s*\(?\s*(SELECT|INSERT|UPDATE|DELETE|WITH|CREATE|DROP|ALTER|TRUNCATE|SET|RESET|LISTEN|"
    r"UNLISTEN|NOTIFY|GRANT|REVOKE|EXPLAIN|COPY|LOCK|VACUUM|ANALYZE)\b"
)


def _named_files() -> list[str]:
    folder = resources.files("pgcounters").joinpath("sql")
    return sorted(
        entry.name
        for entry in folder.iterdir()
        if entry.name.endswith(".sql")
        and not entry.name.startswith(("bench_", "demo_", "seed_"))  # not the library's
        and "-- name:" in entry.read_text(encoding="utf-8")
    )


def test_every_named_block_has_a_description_and_sql() -> None:
    files = _named_files()
    assert {"queries.sql", "operations.sql", "recount.sql", "django.sql"} <= set(files)
    for filename in files:
        for name, description in sqlfiles.descriptions(filename).items():
            assert description, f"{filename}: block {name} has no description"
            assert sqlfiles.named(filename)[name], f"{filename}: block {name} has no SQL"


def test_no_statement_is_written_in_the_library_python() -> None:
    found: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if BUILT_OR_NOT_LIBRARY.match(relative):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in docstrings
                and STATEMENT.match(node.value)
            ):
                found.append(f"{relative}:{node.lineno}: {node.value[:60]!r}")
    assert not found, "SQL written in Python (move it to a named block):\n" + "\n".join(found)
