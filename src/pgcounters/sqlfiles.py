"""Loading the SQL shipped in the package (``pgcounters/sql``)."""

from __future__ import annotations

import functools
import itertools
import re
from dataclasses import dataclass
from importlib import resources

from pgcounters.errors import SchemaError

_NAME_RE = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
_MIGRATION_RE = re.compile(r"^(\d{4})_(\w+)\.sql$")
_SCHEMA_VERSION_RE = re.compile(r"^-- version: (\d+)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def filename(self) -> str:
        """The file's name without ``.sql``, e.g. ``0008_drain_quarantine``."""
        return f"{self.version:04d}_{self.name}"


@dataclass(frozen=True)
class Schema:
    """``schema.sql``: the schema as the migrations up to ``version`` leave it."""

    version: int
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
    """The ``-- name: x`` blocks of a query file under ``pgcounters/sql``: each block's SQL,
    without the comment lines that open it (its description)."""
    return blocks(read(filename))


@functools.cache
def descriptions(filename: str) -> dict[str, str]:
    """The description of each ``-- name: x`` block: the comment lines that open it."""
    return {name: description for name, (description, _) in _blocks(read(filename)).items()}


def blocks(text: str) -> dict[str, str]:
    """The ``-- name: x`` blocks of SQL text: each name and the statement below it."""
    return {name: sql for name, (_, sql) in _blocks(text).items()}


def _blocks(text: str) -> dict[str, tuple[str, str]]:
    names = list(_NAME_RE.finditer(text))
    out: dict[str, tuple[str, str]] = {}
    for match, following in zip(names, [*names[1:], None], strict=True):
        end = following.start() if following else len(text)
        lines = text[match.end() : end].strip().splitlines()
        opening = 0
        while opening < len(lines) and lines[opening].startswith("--"):
            opening += 1
        description = " ".join(line.removeprefix("--").strip() for line in lines[:opening])
        out[match.group(1)] = (description, "\n".join(lines[opening:]).strip().rstrip(";"))
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


def migration(filename: str) -> Migration:
    """The migration of one file, named without ``.sql`` (``"0008_drain_quarantine"``)."""
    for found in migrations():
        if found.filename == filename:
            return found
    raise SchemaError(f"no migration {filename}.sql in the package")


def migration_numbered(version: int) -> Migration:
    """The migration of one number."""
    for found in migrations():
        if found.version == version:
            return found
    raise SchemaError(f"no migration numbered {version:04d} in the package")


@functools.cache
def schema() -> Schema:
    """``schema.sql`` and the migration version it stands for (its ``-- version: N`` line)."""
    text = read("schema.sql")
    match = _SCHEMA_VERSION_RE.search(text)
    if match is None:
        raise RuntimeError("schema.sql does not say which version it is")
    return Schema(int(match.group(1)), text)
