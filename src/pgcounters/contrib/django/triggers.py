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
from pgcounters.specs import CounterSpec

_OPERATIONS = {
    "insert": pgtrigger.Insert,
    "update": pgtrigger.Update,
    "delete": pgtrigger.Delete,
    "truncate": pgtrigger.Truncate,
}


class CounterTrigger(pgtrigger.Trigger):
    """One statement-level trigger of a counter spec."""

    def __init__(self, compiled: CompiledTrigger) -> None:
        referencing = None
        if compiled.old_table or compiled.new_table:
            referencing = pgtrigger.Referencing(  # type: ignore[no-untyped-call]
                old=OLD_TABLE if compiled.old_table else None,
                new=NEW_TABLE if compiled.new_table else None,
            )
        super().__init__(
            name=compiled.name,
            level=pgtrigger.Statement,
            when=pgtrigger.After,
            operation=_OPERATIONS[compiled.event],
            referencing=referencing,
            declare=list(compiled.declare) or None,
            func=compiled.body,
        )
        self.compiled = compiled


def triggers_for(spec: CounterSpec) -> list[CounterTrigger]:
    return [CounterTrigger(t) for t in compile_spec(spec).triggers]


def register(model: type[models.Model], spec: CounterSpec) -> None:
    """Attach a spec's triggers to the source model (and so to its migrations)."""
    existing: list[Any] = list(getattr(model._meta, "triggers", []))
    names = {t.name for t in existing}
    for trigger in triggers_for(spec):
        if trigger.name not in names:
            trigger.register(model)  # type: ignore[arg-type]
