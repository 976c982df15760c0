"""Loading the SQL shipped in the package (``pgcounters/sql``)."""

from __future__ import annotations

import functools
import itertools
import re
from dataclasses import dataclass
from importlib import resources

_NAME_RE = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
_MIGRATION_RE = re.compile(r"^(\d{4})_(\w+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def read(*parts: str) -> str:
    """The text of a file under ``pgcounters/sql``."""
    return resources.files("pgcounters").joinpath("sql", *parts).read_text(encoding="utf-8")


@functools.cache
def queries() -> dict[str, str]:
    """The named blocks of ``queries.sql``."""
    return named("queries.sql")


@functools.cache
def named(filename: str) -> dict[str, str]:
    """The ``-- name: x`` blocks of a query file under ``pgcounters/sql``."""
    return blocks(read(filename))


def blocks(text: str) -> dict[str, str]:
    """The ``-- name: x`` blocks of SQL text: each name and the statement below it."""
    names = list(_NAME_RE.finditer(text))
    out: dict[str, str] = {}
    for match, following in zip(names, [*names[1:], None], strict=True):
        end = following.start() if following else len(text)
        out[match.group(1)] = text[match.end() : end].strip().rstrip(";")
    return out


def query(name: str) -> str:
    return queries()[name]


@functools.cache
def migrations() -> tuple[Migration, ...]:
    """All migrations shipped with this version, in order."""
    folder = resources.files("pgcounters").joinpath("sql", "migrations")
    found: list[Migration] = []
    for entry in folder.iterdir():
        match = _MIGRATION_RE.match(entry.name)
        if match:
            found.append(
                Migration(int(match.group(1)), match.group(2), entry.read_text(encoding="utf-8"))
            )
    found.sort(key=lambda m: m.version)
    # numbers only grow (a number may be skipped); two files with one number are a packaging error
    for before, after in itertools.pairwise(found):
        if before.version == after.version:
            raise RuntimeError(f"two migrations are numbered {after.version:04d}")
    if not found or found[0].version != 1:
        raise RuntimeError("migration 0001 is missing from the package")
    return tuple(found)


def latest_version() -> int:
    return migrations()[-1].version
