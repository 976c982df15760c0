"""System checks: declarations compile; the schema and the triggers are installed and current.

Declaration checks run with every ``manage.py check``; database checks run when
a database is given (``manage.py check --database default``) and after migrate.
"""

from __future__ import annotations

from typing import Any

from django.core import checks

from pgcounters.errors import PgCountersError


@checks.register()
def check_declarations(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    from pgcounters.contrib.django.declarations import declared_counters

    try:
        declared_counters()
    except PgCountersError as exc:
        return [checks.Error(str(exc), id="pgcounters.E001")]
    return []


@checks.register(checks.Tags.database)
def check_database(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    from pgcounters import schema, triggers
    from pgcounters.contrib.django.db import psycopg_connection
    from pgcounters.contrib.django.declarations import declared_counters

    out: list[checks.CheckMessage] = []
    for alias in databases or []:
        if _unapplied_migrations(alias):
            # `migrate` runs the checks before it migrates: a database not migrated yet
            # is no error, nor worth a warning (Django reports unapplied migrations
            # itself); the schema and trigger checks wait for it
            continue
        try:
            with psycopg_connection(alias) as conn:
                schema.check(conn)
                specs = [spec for _, spec in declared_counters()]
                for drift in triggers.drift(conn, specs):
                    if not drift.ok and drift.state != "undeclared":
                        out.append(
                            checks.Error(
                                f"counter {drift.name}: triggers {drift.state} ({drift.detail})",
                                hint="run `manage.py pgcounters recount`"
                                if drift.state == "stale"
                                else "run `manage.py migrate` (and `makemigrations` if a "
                                "declaration changed, or the table did)",
                                id="pgcounters.E003",
                            )
                        )
        except PgCountersError as exc:
            out.append(
                checks.Error(
                    f"database {alias!r}: {exc}",
                    hint="run `manage.py migrate pgcounters`",
                    id="pgcounters.E002",
                )
            )
    return out


def _unapplied_migrations(alias: str) -> int:
    """How many migrations of the project are not applied to database ``alias``."""
    from django.db import connections
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connections[alias])
    return len(executor.migration_plan(executor.loader.graph.leaf_nodes()))
