"""System checks: declarations compile; the schema and the triggers are installed and current.

Declaration checks run with every ``manage.py check``; database checks run when
a database is given (``manage.py check --database default``) and after migrate.
"""

from __future__ import annotations

import contextvars
import functools
from typing import Any

from django.core import checks

from pgcounters.errors import PgCountersError

# set while `migrate` runs its checks: the triggers it reinstalls and the counters it records
# are no error then (it is the command their hints name)
_migrating: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "pgcounters_migrating", default=False
)


def install_migrate_check() -> None:
    """Wrap ``migrate``'s check so that trigger drift warns instead of stopping it."""
    from django.core.management.commands import migrate

    check = migrate.Command.check
    if getattr(check, "_pgcounters", False):
        return

    @functools.wraps(check)
    def checking(self: Any, *args: Any, **kwargs: Any) -> Any:
        token = _migrating.set(True)
        try:
            return check(self, *args, **kwargs)
        finally:
            _migrating.reset(token)

    checking._pgcounters = True  # type: ignore[attr-defined]
    migrate.Command.check = checking  # type: ignore[method-assign]


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
                # a declaration that does not compile is E001's, not the database's
                specs = [spec for _, spec in declared_counters(skip_broken=True)]
                # during migrate a warning: migrate is what the hint asks for, and an
                # error would stop it before it could repair anything
                kind = checks.Warning if _migrating.get() else checks.Error
                for drift in triggers.drift(conn, specs):
                    if not drift.ok and drift.state != "undeclared":
                        out.append(
                            kind(
                                f"counter {drift.name}: triggers {drift.state} ({drift.detail})",
                                hint="run `manage.py pgcounters recount`"
                                if drift.state == "stale"
                                else "run `manage.py migrate` (and `makemigrations` first if a "
                                "declaration changed, or the table did, or pgcounters was "
                                "upgraded: it may compile triggers anew; triggers a migration "
                                "delivered and that were dropped since come back with "
                                "`manage.py pgtrigger install`, then `migrate` counts the "
                                "rows again)",
                                id="pgcounters.W003" if _migrating.get() else "pgcounters.E003",
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
