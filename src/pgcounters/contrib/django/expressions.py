"""Exact values of counter columns in a queryset: stored + pending, in the same statement."""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.models.expressions import Expression

from pgcounters.contrib.django.declarations import CountField


class Exact(Expression):
    """``Article.objects.annotate(n=Exact("public_comments"))``: the exact counter value.

    The stored column plus the pending deltas of both queues, computed in the
    query's own statement (one snapshot, DESIGN rule 3).
    """

    output_field = models.BigIntegerField()

    def __init__(self, field_name: str) -> None:
        super().__init__()
        self.field_name = field_name
        self._counter: CountField | None = None
        self._column: Any = None
        self._key: Any = None

    def resolve_expression(self, query: Any = None, *args: Any, **kwargs: Any) -> Exact:
        copy: Exact = super().resolve_expression(query, *args, **kwargs)
        model = query.model
        field = model._meta.get_field(self.field_name)
        if not isinstance(field, CountField):
            raise TypeError(f"{model.__name__}.{self.field_name} is not a pgcounters counter")
        spec = field.spec()
        copy._counter = field
        copy._name = spec.name  # type: ignore[attr-defined]
        copy._column = models.F(self.field_name).resolve_expression(query, *args, **kwargs)
        key_field = spec.target.key_column  # type: ignore[union-attr]
        key_name = next(f.name for f in model._meta.concrete_fields if f.column == key_field)
        copy._key = models.F(key_name).resolve_expression(query, *args, **kwargs)
        return copy

    def as_sql(self, compiler: Any, connection: Any) -> tuple[str, tuple[Any, ...]]:
        column_sql, column_params = compiler.compile(self._column)
        key_sql, key_params = compiler.compile(self._key)
        # compiled SQL of Django's own expressions; the counter name is a parameter
        template = (
            "(coalesce({column}, 0)"
            " + coalesce((SELECT sum(q.delta) FROM pgcounters.queue AS q WHERE q.target_id ="
            " (SELECT t.id FROM pgcounters.targets AS t WHERE t.name = %s)"
            " AND q.key = ARRAY[({key})::text]::text), 0)"
            " + coalesce((SELECT sum(q.delta) FROM pgcounters.queue_unlogged AS q"
            " WHERE q.target_id = (SELECT t.id FROM pgcounters.targets AS t WHERE t.name = %s)"
            " AND q.key = ARRAY[({key})::text]::text), 0))"
        )
        text = template.format(column=column_sql, key=key_sql)
        name = self._name  # type: ignore[attr-defined]
        return text, (*column_params, name, *key_params, name, *key_params)
