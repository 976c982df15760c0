"""``makemigrations`` adds a dependency on pgcounters' schema to migrations that add counters.

A migration that installs counter triggers must run after the pgcounters
schema migrations: the triggers write to pgcounters' queue and call its
functions, so a data migration of the same app (or any write after it) would
fail on a database where the schema is not there yet. Django adds such
dependencies itself for foreign keys; for triggers it cannot know. The app
wraps the autodetector of ``makemigrations`` (as django-pgtrigger does for
its own operations) and appends ``("pgcounters", <latest schema migration>)``
to each new migration that adds or changes a counter trigger.
"""

from __future__ import annotations

from typing import Any

from django.core.management.commands import makemigrations, migrate
from django.db.migrations.autodetector import MigrationAutodetector
from django.db.migrations.graph import MigrationGraph

from pgcounters.compiler import MARKER_RE

APP_LABEL = "pgcounters"


def adds_counter_trigger(operation: object) -> bool:
    """True for a django-pgtrigger operation that installs a pgcounters trigger."""
    trigger = getattr(operation, "trigger", None)
    if trigger is None:
        return False
    from pgcounters.contrib.django.pgtrigger_delivery import CounterTrigger

    if isinstance(trigger, CounterTrigger):
        return True
    return MARKER_RE.search(str(getattr(trigger, "sql", ""))) is not None


class CounterDependencies(MigrationAutodetector):
    """An autodetector whose new migrations depend on the schema when they add counters."""

    def changes(
        self,
        graph: MigrationGraph,
        trim_to_apps: set[str] | None = None,
        convert_apps: set[str] | None = None,
        migration_name: str | None = None,
    ) -> dict[str, list[Any]]:
        changes = super().changes(graph, trim_to_apps, convert_apps, migration_name)
        for app_migrations in changes.values():
            for migration in app_migrations:
                _removals_before_renames(migration)
        leaves = graph.leaf_nodes(APP_LABEL)
        if not leaves:
            return changes
        schema = leaves[0]
        for app_label, migrations in changes.items():
            if app_label == APP_LABEL:
                continue
            for migration in migrations:
                needs = any(adds_counter_trigger(op) for op in migration.operations)
                if needs and schema not in migration.dependencies:
                    # an instance attribute, as Django's own autodetector sets it
                    migration.dependencies = [*migration.dependencies, schema]  # type: ignore[misc]
        return changes


def _removals_before_renames(migration: Any) -> None:
    """Put the removal of counter triggers before the first ``RenameModel`` of a migration.

    Django writes a model's rename first and the trigger operations after it; but the
    triggers of a counter name their tables, and a table that one of them counts cannot be
    renamed under them (the DDL guard refuses it, and PostgreSQL would leave them counting
    from the old name). Removed first (under the model's old name), they are added again
    after the rename, compiled for the new one.
    """
    from django.db.migrations.operations import RenameModel
    from pgtrigger.migrations import RemoveTrigger

    operations = list(migration.operations)
    renames = [i for i, op in enumerate(operations) if isinstance(op, RenameModel)]
    if not renames:
        return
    first = renames[0]
    old_names = {
        op.new_name_lower: op.old_name_lower for op in operations if isinstance(op, RenameModel)
    }
    moved: list[Any] = []
    kept: list[Any] = []
    for i, op in enumerate(operations):
        if i > first and isinstance(op, RemoveTrigger) and op.name.startswith("pgc_"):
            moved.append(RemoveTrigger(old_names.get(op.model_name_lower, op.model_name), op.name))
        else:
            kept.append(op)
    if moved:
        migration.operations = [*kept[:first], *moved, *kept[first:]]


def install() -> None:
    """Wrap the autodetector of ``makemigrations`` and ``migrate``.

    Idempotent, and keeps django-pgtrigger's own wrapper (whichever app is ready first).
    """
    current: type[MigrationAutodetector] = makemigrations.Command.autodetector
    if issubclass(current, CounterDependencies):
        return
    wrapped = type("MigrationAutodetector", (CounterDependencies, current), {})
    # Django checks that both commands use the same autodetector (commands.E001)
    for command in (makemigrations, migrate):
        command.Command.autodetector = wrapped
        setattr(command, "MigrationAutodetector", wrapped)  # noqa: B010  (a module global)
