"""Exact values of counter columns in a queryset: stored + pending, in the same statement."""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.models.expressions import Expression

from pgcounters.contrib.django.declarations import CounterColumn
from pgcounters.errors import InvalidArgument, ReplicaError
from pgcounters.specs import ColumnTarget, CounterSpec
from pgcounters.sqlfiles import named


class Exact(Expression):
    """``Article.objects.annotate(n=Exact("public_comments"))``: the exact counter value.

    The stored column plus the pending deltas of both queues, computed in the
    query's own statement (one snapshot).
    """

    output_field = models.BigIntegerField()

    def __init__(self, field_name: str) -> None:
        super().__init__()
        self.field_name = field_name
        self._counter: CounterColumn | None = None
        self._column: Any = None
        self._key: Any = None

    def resolve_expression(self, query: Any = None, *args: Any, **kwargs: Any) -> Exact:
        copy: Exact = super().resolve_expression(query, *args, **kwargs)
        model = query.model
        field = model._meta.get_field(self.field_name)
        if not isinstance(field, CounterColumn):
            raise InvalidArgument(f"{model.__name__}.{self.field_name} is not a pgcounters counter")
        spec = field.spec()
        if spec.scale is not None:  # an exact sum of decimals reads as its own DecimalField
            copy.output_field = models.DecimalField(  # type: ignore[assignment]
                max_digits=getattr(field, "max_digits", None), decimal_places=spec.scale
            )
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
        name = self._name  # type: ignore[attr-defined]
        # compiled SQL of Django's own expressions; the counter name is a parameter
        scale = self._counter.counter_places if self._counter is not None else None
        # a sum of decimals: deltas in units of 10^-scale, added to a decimal column
        pending = named("django.sql")["exact_pending" if scale is None else "exact_pending_decimal"]
        queues = ["queue"]
        if _on_standby(connection):
            # a hot standby cannot plan a statement naming an unlogged table
            if self._counter is not None and self._counter.counter_mode == "unlogged":
                raise ReplicaError(
                    f"counter {name!r} is unlogged: its pending deltas exist only on the "
                    "primary; annotate Exact() on a queryset of the primary's database"
                )
        else:
            queues.append("queue_unlogged")
        text = f"(coalesce({column_sql}, 0)"
        params_list: list[Any] = list(column_params)
        for queue in queues:
            text += " + " + pending.format(queue=queue, key=key_sql, scale=int(scale or 0))
            params_list += [name, *key_params]
        text += ")"
        params = tuple(params_list)
        # While the counter is backfilled, a key beyond the backfill's cursor is counted
        # from the source table (same statement, same snapshot as the cursor). Both
        # lookups of the backfill are uncorrelated: run once per query.
        spec = self._counter.spec() if self._counter is not None else None
        if spec is None or key_params:  # pragma: no cover - a key column has no parameters
            return text, params
        assert isinstance(spec.target, ColumnTarget)
        truth = truth_of_key(spec, key_sql).replace("%", "%%")
        backfill = named("django.sql")["backfill_lookup"]
        guarded = "".join(
            [
                "(CASE WHEN NOT EXISTS ",
                backfill.format(value="1"),
                " OR ",
                key_sql,
                " <= ",
                backfill.format(value=f"(b.cursor_key[1])::{spec.target.key_type}"),
                " THEN ",
                text,
                " ELSE (",
                truth,
                ") END)",
            ]
        )
        return guarded, (name, name, *params)


def truth_of_key(spec: CounterSpec, key_sql: str) -> str:
    """SQL of the truth of one key of a column counter: its rows counted in the source."""
    from psycopg import sql

    from pgcounters.compiler import truth_query
    from pgcounters.repair import _key_expr

    extra = sql.SQL("{} = {}").format(_key_expr(spec), sql.SQL(key_sql))
    if spec.scale is not None:  # the truth in units, as a decimal
        return (
            sql.SQL(named("django.sql")["truth_of_key_decimal"])
            .format(truth=truth_query(spec, extra), scale=sql.Literal(spec.scale))
            .as_string()
        )
    return (
        sql.SQL(named("django.sql")["truth_of_key"])
        .format(truth=truth_query(spec, extra))
        .as_string()
    )


def _on_standby(connection: Any) -> bool:
    """True when Django's connection is to a hot standby (reported by PostgreSQL 14+)."""
    connection.ensure_connection()
    info = getattr(connection.connection, "info", None)
    status = info.parameter_status("in_hot_standby") if info is not None else None
    return status in ("on", b"on")
