"""The SQL of the demo and the benchmarks (``pgcounters/demos/sql``), kept apart from the
library's own (``pgcounters/sql``)."""

from __future__ import annotations

import functools
from importlib import resources

from pgcounters import sqlfiles


def read(filename: str) -> str:
    """The text of a file under ``pgcounters/demos/sql``."""
    folder = resources.files("pgcounters.demos").joinpath("sql")
    return folder.joinpath(filename).read_text(encoding="utf-8")


@functools.cache
def named(filename: str) -> dict[str, str]:
    """The ``-- name: x`` blocks of a query file under ``pgcounters/demos/sql``."""
    return sqlfiles.blocks(read(filename))
