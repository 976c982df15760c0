"""pgcounters for SQLAlchemy 2: counters declared on declarative models.

* :func:`counted`: a counter column on a model, kept by triggers on the related table;
* :func:`exact`: its exact value in a ``select()`` (stored + pending deltas);
* :func:`counter_spec` / :func:`counter_specs`: the core spec of a counted column, and
  those of every counter of a metadata;
* :func:`declare_counter`: any other spec (a named counter) declared beside them;
* :func:`install_schema` and :func:`install_counters`: install the schema and the
  counters in a connection's transaction, with the backfill of the rows already there
  (``await conn.run_sync(install_counters, Base.metadata)`` on an async engine).

Alembic users install them with the operations of :mod:`pgcounters.contrib.alembic`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import Connection, MetaData

from pgcounters.contrib.sqlalchemy import ddl
from pgcounters.contrib.sqlalchemy.declarations import (
    Exact,
    counted,
    counter_spec,
    counter_specs,
    declare_counter,
    exact,
)
from pgcounters.errors import SchemaNotInstalled, SchemaVersionMismatch
from pgcounters.sqlfiles import latest_version

__all__ = [
    "Exact",
    "counted",
    "counter_spec",
    "counter_specs",
    "declare_counter",
    "exact",
    "install_counters",
    "install_schema",
]


def install_schema(connection: Connection) -> int | None:
    """Install the pgcounters schema, or upgrade it, in the connection's transaction (begun
    if it is not; the caller commits). Returns the version found before (None: absent)."""
    runner = ddl.ConnectionRunner(connection)
    found = ddl.installed_version(runner)
    script = ddl.schema_script(found)
    if script is not None:
        runner.execute(script)
    return found


def install_counters(
    connection: Connection, metadata: MetaData | Iterable[MetaData], *, backfill: bool = True
) -> list[str]:
    """Install (or bring up to date) every counter declared on ``metadata``, in the
    connection's transaction (begun if it is not; the caller commits): all or none.

    A counter installed for the first time or with another definition counts the rows
    already in its table (``backfill``) before the transaction ends. Returns the names of
    the counters that were installed or changed.
    """
    specs = counter_specs(metadata)
    runner = ddl.ConnectionRunner(connection)
    _check_schema(runner)
    recorded = ddl.recorded(runner)
    triggers = ddl.triggers_of(runner)
    changed: list[str] = []
    for spec in specs:
        state = ddl.state(spec, recorded.get(spec.name), triggers.get(spec.name, []))
        if state == "installed":
            continue
        ddl.validate(runner, spec)
        previous = recorded.get(spec.name)
        if previous is not None and previous.fingerprint != spec.fingerprint:
            for statement in ddl.drop_statements(spec.name, previous):
                runner.execute(statement)
        for statement in ddl.create_statements(spec, backfill=backfill):
            runner.execute(statement)
        changed.append(spec.name)
    return changed


def _check_schema(runner: ddl.Runner) -> None:
    found: Any = ddl.installed_version(runner)
    if found is None:
        raise SchemaNotInstalled()
    if found != latest_version():
        raise SchemaVersionMismatch(
            f"the pgcounters schema is at version {found}, this code needs {latest_version()}"
            ": install_schema() upgrades it"
        )
