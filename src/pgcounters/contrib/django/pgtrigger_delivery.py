"""Delivering compiled counter triggers through django-pgtrigger.

pgtrigger gives the migration integration (``makemigrations`` adds and
removes triggers when a declaration changes), installation status and
``pgtrigger ls``; pgcounters gives the trigger bodies, compiled by the core
compiler from the same spec a plain-SQL user would install.
"""

from __future__ import annotations

from typing import Any

import pgtrigger
from django.db import models

from pgcounters.compiler import NEW_TABLE, OLD_TABLE, CompiledTrigger, compile_spec
from pgcounters.specs import CounterSpec, Table

_OPERATIONS = {
    "insert": pgtrigger.Insert,
    "update": pgtrigger.Update,
    "delete": pgtrigger.Delete,
    "truncate": pgtrigger.Truncate,
}


class CounterTrigger(pgtrigger.Trigger):
    """One trigger of a counter spec: a statement-level counting one, or a row guard."""

    def __init__(self, compiled: CompiledTrigger) -> None:
        referencing = None
        if compiled.old_table or compiled.new_table:
            referencing = pgtrigger.Referencing(  # type: ignore[no-untyped-call]
                old=OLD_TABLE if compiled.old_table else None,
                new=NEW_TABLE if compiled.new_table else None,
            )
        operation: Any
        if compiled.event == "guard_update":
            assert compiled.column is not None
            operation = pgtrigger.UpdateOf(compiled.column)  # type: ignore[no-untyped-call]
        elif compiled.event == "guard_insert":
            operation = pgtrigger.Insert
        else:
            operation = _OPERATIONS[compiled.base_event]
        super().__init__(
            name=compiled.name,
            level=pgtrigger.Row if compiled.is_row else pgtrigger.Statement,
            when=pgtrigger.Before if compiled.is_row else pgtrigger.After,
            operation=operation,
            referencing=referencing,
            condition=pgtrigger.Condition(compiled.condition) if compiled.condition else None,
            declare=list(compiled.declare) or None,
            func=compiled.body,
        )
        self.compiled = compiled


def triggers_for(spec: CounterSpec) -> list[CounterTrigger]:
    return [CounterTrigger(t) for t in compile_spec(spec).triggers]


def _model_of(table: Table) -> type[models.Model] | None:
    from django.apps import apps

    for model in apps.get_models():
        if model._meta.db_table == table.name and not model._meta.proxy:
            return model
    return None


def register(model: type[models.Model], spec: CounterSpec) -> None:
    """Attach a spec's triggers to their models (and so to their migrations).

    The counting triggers go on the source model; the guards of a counter
    column on the model that has the column.
    """
    for trigger in triggers_for(spec):
        owner = model
        if trigger.compiled.table is not None:
            found = _model_of(trigger.compiled.table)
            if found is None:  # pragma: no cover - a CountField's model is installed
                continue
            owner = found
        existing: list[Any] = list(getattr(owner._meta, "triggers", []))
        if trigger.name not in {t.name for t in existing}:
            trigger.register(owner)  # type: ignore[arg-type]
