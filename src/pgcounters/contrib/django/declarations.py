"""Counter declarations on Django models, and the specs derived from them.

Two ways to declare, both turned into core :class:`~pgcounters.specs.CounterSpec`
objects when the app registry is ready:

* a counter column on the parent model::

      class Article(models.Model):
          public_comments = CountField("comments", filter=Q(publish_status="public"))
          score_total = SumField("comments", "score")

* a named counter in the generic table (global, or keyed by columns)::

      register_counter("blog.users.total", User)
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.db import connections, models
from django.db.models.sql import Query

from pgcounters.client import Mode
from pgcounters.errors import InvalidCounterDefinition
from pgcounters.keys import Key, KeyType
from pgcounters.specs import Bucket, ColumnTarget, CounterSpec, Fragment, NamedTarget, Table
from pgcounters.triggers import ReplicaWrites

_KEY_TYPES: dict[str, KeyType] = {
    "AutoField": "bigint",
    "BigAutoField": "bigint",
    "SmallAutoField": "bigint",
    "IntegerField": "bigint",
    "BigIntegerField": "bigint",
    "SmallIntegerField": "bigint",
    "PositiveIntegerField": "bigint",
    "PositiveBigIntegerField": "bigint",
    "PositiveSmallIntegerField": "bigint",
    "UUIDField": "uuid",
    "CharField": "text",
    "TextField": "text",
    "SlugField": "text",
    "DateField": "date",
}


def key_type_of(field: models.Field[Any, Any]) -> KeyType:
    """The pgcounters key type of a model field (a foreign key: of the field it points to)."""
    target = field.target_field if isinstance(field, models.ForeignKey) else field
    kind = target.get_internal_type()
    if kind not in _KEY_TYPES:
        raise InvalidCounterDefinition(
            f"{field.model.__name__}.{field.name}: a {kind} cannot key a counter "
            f"(supported: {', '.join(sorted(_KEY_TYPES))})"
        )
    return _KEY_TYPES[kind]


def q_to_fragment(model: type[models.Model], q: models.Q) -> Fragment:
    """Compile a Q over the model's own columns into an SQL fragment (values as parameters)."""
    query = Query(model)
    try:
        where = query.build_where(q)
        compiler = query.get_compiler(connection=connections["default"])
        text, params = where.as_sql(compiler, compiler.connection)
    except Exception as exc:
        raise InvalidCounterDefinition(
            f"the filter {q!r} on {model.__name__} cannot be compiled: {exc}"
        ) from None
    if len(query.alias_map) > 1:
        raise InvalidCounterDefinition(
            f"the filter {q!r} on {model.__name__} may only use the model's own fields, "
            "not related models"
        )
    return Fragment(text, tuple(params))


def _column(model: type[models.Model], name: str) -> str:
    try:
        field = model._meta.get_field(name)
    except Exception:
        raise InvalidCounterDefinition(f"{model.__name__} has no field {name!r}") from None
    column = getattr(field, "column", None)
    if not isinstance(column, str):
        raise InvalidCounterDefinition(f"{model.__name__}.{name} is not a column")
    return column


def _summed_column(
    model: type[models.Model], name: str, decimal_places: int | None = None
) -> tuple[str, int | None]:
    """The column of the field to sum and the scale of its exact sum: an integer field
    (scale None), or a DecimalField with ``decimal_places`` decimal places (an exact sum
    of decimals). A float sum is refused: its values are not exact, nor is their sum."""
    column = _column(model, name)
    field = model._meta.get_field(name)
    what = f"{model.__name__}.{name}"
    if isinstance(field, models.DecimalField):
        if decimal_places is None:
            raise InvalidCounterDefinition(
                f"{what} is a DecimalField with {field.decimal_places} decimal places: sum it "
                f"exactly with SumField(..., decimal_places={field.decimal_places}, "
                "max_digits=N) or register_counter(..., sum=..., which keeps its scale)"
            )
        if field.decimal_places != decimal_places:
            raise InvalidCounterDefinition(
                f"{what} has {field.decimal_places} decimal places, its sum {decimal_places}: "
                "give the sum the decimal places of the summed field"
            )
        return column, decimal_places
    if isinstance(field, models.FloatField):
        raise InvalidCounterDefinition(
            f"{what} is a FloatField: floating-point values are not exact, nor is their sum; "
            "sum a DecimalField (exactly, with decimal_places) or an integer field"
        )
    if not isinstance(field, models.IntegerField) or isinstance(field, models.BooleanField):
        raise InvalidCounterDefinition(
            f"{what} is a {type(field).__name__}: a counter sums integer fields, or "
            "DecimalFields exactly"
        )
    if decimal_places is not None:
        raise InvalidCounterDefinition(
            f"{what} is an integer field: its sum is an integer (no decimal_places)"
        )
    return column, None


def _table(model: type[models.Model]) -> Table:
    return Table(model._meta.db_table)


class CounterColumn(models.Field):  # type: ignore[type-arg]
    """What every counter column field has: a relation, a filter, a mode, a spec; the
    database column itself comes from the Django field class it is mixed with."""

    counter_sum: str | None = None
    counter_places: int | None = None  # decimal places of an exact sum of decimals
    plain_path = "django.db.models.Field"

    def __init__(
        self,
        relation: str | None = None,
        filter: models.Q | None = None,
        *,
        mode: Mode = "queued",
        replica_writes: ReplicaWrites = "flag",
        **kwargs: Any,
    ) -> None:
        self.relation = relation
        self.counter_filter = filter
        self.counter_mode: Mode = mode
        self.counter_replica_writes = _replica_writes(replica_writes)
        kwargs.setdefault("default", 0)
        kwargs.setdefault("editable", False)
        kwargs.setdefault("db_index", True)
        super().__init__(**kwargs)

    def pre_save(self, model_instance: models.Model, add: bool) -> Any:
        """What ``save()`` writes: never the instance's value.

        A new row starts at 0 (its counted rows add to it); an UPDATE writes
        ``column = column``, so a stale instance cannot put an old value back
        (the database keeps the value it has, whatever the instance holds).
        """
        if add:
            setattr(model_instance, self.attname, 0)
            return 0
        return models.F(self.attname)

    def deconstruct(self) -> Any:
        name, _path, args, kwargs = super().deconstruct()
        # the declaration lives in the triggers; the column is a plain field for migrations
        return name, self.plain_path, args, kwargs

    def spec(self) -> CounterSpec:
        """The core spec of this counter column."""
        model = self.model
        if not self.relation:
            raise InvalidCounterDefinition(f"{model.__name__}.{self.name}: name a relation")
        try:
            rel = model._meta.get_field(self.relation)
        except Exception:
            raise InvalidCounterDefinition(
                f"{model.__name__}.{self.name}: {model.__name__} has no relation {self.relation!r}"
            ) from None
        if not isinstance(rel, models.ManyToOneRel):
            raise InvalidCounterDefinition(
                f"{model.__name__}.{self.name}: {self.relation!r} is not the reverse side "
                "of a ForeignKey"
            )
        source = rel.related_model
        assert isinstance(source, type)
        fk = rel.remote_field
        where = None if self.counter_filter is None else q_to_fragment(source, self.counter_filter)
        summed, scale = (
            (None, None)
            if self.counter_sum is None
            else _summed_column(source, self.counter_sum, self.counter_places)
        )
        column, fk_column, key_column = self.column, fk.column, fk.target_field.column
        if not (column and fk_column and key_column):  # pragma: no cover - concrete fields
            raise InvalidCounterDefinition(f"{model.__name__}.{self.name} has no column")
        return CounterSpec(
            name=f"{model._meta.app_label}.{model._meta.model_name}.{self.name}",
            source=_table(source),
            keys=(fk_column,),
            target=ColumnTarget(_table(model), column, key_column, key_type_of(fk)),
            where=where,
            sum=summed,
            mode=self.counter_mode,
            scale=scale,
        )


class CountField(CounterColumn, models.BigIntegerField):  # type: ignore[type-arg]
    """A counter column: the number of related rows (through ``relation``) matching ``filter``.

    ``relation`` is the name of the reverse relation on this model (the
    ``related_name`` of the foreign key on the counted model). The column is a
    real ``bigint`` column, usable in ``filter``, ``order_by`` and the admin;
    it is indexed by default so that top-N queries use an index.
    """

    plain_path = "django.db.models.BigIntegerField"


class SumField(CountField):
    """A counter column holding the sum of ``field`` over related rows matching ``filter``.

    The sum of an integer field is a ``bigint`` column. The sum of a DecimalField is
    exact when declared with its ``decimal_places`` (and the ``max_digits`` of the total):
    ``SumField("lines", "amount", decimal_places=2, max_digits=14)`` is then a
    :class:`DecimalSumField`, a ``numeric(14, 2)`` column.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls is SumField and kwargs.get("decimal_places") is not None:
            return DecimalSumField(*args, **kwargs)
        return super().__new__(cls)

    def __init__(
        self,
        relation: str | None = None,
        field: str | None = None,
        filter: models.Q | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(relation, filter, **kwargs)
        self.counter_sum = field


class DecimalSumField(CounterColumn, models.DecimalField):  # type: ignore[type-arg]
    """The exact sum of a DecimalField over related rows: a ``numeric(max_digits,
    decimal_places)`` column whose ``decimal_places`` are those of the summed field.
    Values are :class:`~decimal.Decimal`; ten rows of 0.4 sum to 4.00."""

    plain_path = "django.db.models.DecimalField"

    def __init__(
        self,
        relation: str | None = None,
        field: str | None = None,
        filter: models.Q | None = None,
        *,
        decimal_places: int,
        max_digits: int,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            relation, filter, decimal_places=decimal_places, max_digits=max_digits, **kwargs
        )
        self.counter_sum = field
        self.counter_places = decimal_places


def _replica_writes(value: object) -> ReplicaWrites:
    """``"flag"`` (rows written with ``session_replication_role = replica`` mark the
    counter stale until a recount) or ``"count"`` (its triggers count them too)."""
    if value not in ("flag", "count"):
        raise InvalidCounterDefinition(f"replica_writes is 'flag' or 'count', not {value!r}")
    return value


@dataclass(frozen=True)
class NamedCounter:
    """A named counter over a model, declared with :func:`register_counter`."""

    name: str
    model: type[models.Model]
    keys: tuple[str, ...] = ()
    filter: models.Q | None = None
    sum: str | None = None
    mode: Mode = "queued"
    replica_writes: ReplicaWrites = "flag"
    bucket: Bucket | None = None
    """Counted per period of a date or time field (``Bucket.column`` names the field)."""

    def spec(self) -> CounterSpec:
        fields = [self.model._meta.get_field(k) for k in self.keys]
        bucket = self.bucket
        if bucket is not None and isinstance(bucket.column, str):
            bucket = dataclasses.replace(bucket, column=_column(self.model, bucket.column))
        summed: str | None = None
        scale: int | None = None
        if self.sum is not None:
            # a DecimalField is summed exactly, with its own decimal places
            summed_field = self.model._meta.get_field(self.sum)
            places = getattr(summed_field, "decimal_places", None)
            summed, scale = _summed_column(
                self.model,
                self.sum,
                places if isinstance(summed_field, models.DecimalField) else None,
            )
        return CounterSpec(
            name=self.name,
            source=_table(self.model),
            keys=tuple(_column(self.model, k) for k in self.keys),
            target=NamedTarget(tuple(key_type_of(f) for f in fields)),  # type: ignore[arg-type]
            where=None if self.filter is None else q_to_fragment(self.model, self.filter),
            sum=summed,
            mode=self.mode,
            scale=scale,
            bucket=bucket,
        )

    # reads and increments on Django's connection (pgcounters.contrib.django.counters)

    def get(self, key: object = None, *, exact: bool = True, using: str = "default") -> int:
        """The value for ``key`` (a model instance, a value, a tuple; nothing when global)."""
        from pgcounters.contrib.django import counters

        return counters.get(self.name, key, exact=exact, using=using)

    def get_decimal(
        self, key: object = None, *, exact: bool = True, using: str = "default"
    ) -> Decimal:
        """The value for ``key`` as a Decimal (a sum of a DecimalField is read so)."""
        from pgcounters.contrib.django import counters

        return counters.client(using).get_decimal(self.name, counters.key_of(key), exact=exact)

    def get_many(
        self, keys: Iterable[object], *, exact: bool = True, using: str = "default"
    ) -> list[int]:
        """The values for many keys, in the order given, in one statement."""
        from pgcounters.contrib.django import counters

        return counters.get_many(self.name, keys, exact=exact, using=using)

    def top(self, n: int = 10, *, using: str = "default") -> list[tuple[Key, int]]:
        """The ``n`` keys with the highest stored values, highest first."""
        from pgcounters.contrib.django import counters

        return counters.top(self.name, n, using=using)

    def incr(self, key: object = None, delta: int = 1, *, using: str = "default") -> int | None:
        """Add ``delta`` by hand, in the current transaction (rows are counted by themselves)."""
        from pgcounters.contrib.django import counters

        return counters.incr(self.name, key, delta, using=using)

    # a counter per period: reads over a range of periods (see pgcounters.Counters)

    def get_range(
        self, key: object, start: dt.date, end: dt.date, *, using: str = "default"
    ) -> int:
        """The exact value for ``key`` (without the period) over the periods that start in
        ``[start, end)`` (aware datetimes, or dates of the counter's time zone)."""
        from pgcounters.contrib.django import counters

        return counters.client(using).get_range(self.name, counters.key_of(key), start, end)

    def get_series(
        self, key: object, start: dt.date, end: dt.date, *, using: str = "default"
    ) -> list[tuple[dt.date, int]]:
        """One exact value per period that starts in ``[start, end)``, zero-filled."""
        from pgcounters.contrib.django import counters

        return counters.client(using).get_series(self.name, counters.key_of(key), start, end)

    def top_range(
        self, start: dt.date, end: dt.date, n: int = 10, *, using: str = "default"
    ) -> list[tuple[Key, int]]:
        """The ``n`` keys with the highest exact values over the periods of a range."""
        from pgcounters.contrib.django import counters

        return counters.client(using).top_range(self.name, start, end, n)

    async def aget_range(
        self, key: object, start: dt.date, end: dt.date, *, using: str = "default"
    ) -> int:
        """:meth:`get_range`, awaited."""
        from asgiref.sync import sync_to_async

        return await sync_to_async(self.get_range, thread_sensitive=True)(
            key, start, end, using=using
        )

    async def aget_series(
        self, key: object, start: dt.date, end: dt.date, *, using: str = "default"
    ) -> list[tuple[dt.date, int]]:
        """:meth:`get_series`, awaited."""
        from asgiref.sync import sync_to_async

        return await sync_to_async(self.get_series, thread_sensitive=True)(
            key, start, end, using=using
        )

    async def atop_range(
        self, start: dt.date, end: dt.date, n: int = 10, *, using: str = "default"
    ) -> list[tuple[Key, int]]:
        """:meth:`top_range`, awaited."""
        from asgiref.sync import sync_to_async

        return await sync_to_async(self.top_range, thread_sensitive=True)(
            start, end, n, using=using
        )

    # the same from async code (awaited; on Django's connection, as its async ORM methods)

    async def aget(self, key: object = None, *, exact: bool = True, using: str = "default") -> int:
        """:meth:`get`, awaited."""
        from pgcounters.contrib.django import counters

        return await counters.aget(self.name, key, exact=exact, using=using)

    async def aget_decimal(
        self, key: object = None, *, exact: bool = True, using: str = "default"
    ) -> Decimal:
        """:meth:`get_decimal`, awaited."""
        from asgiref.sync import sync_to_async

        return await sync_to_async(self.get_decimal, thread_sensitive=True)(
            key, exact=exact, using=using
        )

    async def aget_many(
        self, keys: Iterable[object], *, exact: bool = True, using: str = "default"
    ) -> list[int]:
        """:meth:`get_many`, awaited."""
        from pgcounters.contrib.django import counters

        return await counters.aget_many(self.name, keys, exact=exact, using=using)

    async def atop(self, n: int = 10, *, using: str = "default") -> list[tuple[Key, int]]:
        """:meth:`top`, awaited."""
        from pgcounters.contrib.django import counters

        return await counters.atop(self.name, n, using=using)

    async def aincr(
        self, key: object = None, delta: int = 1, *, using: str = "default"
    ) -> int | None:
        """:meth:`incr`, awaited."""
        from pgcounters.contrib.django import counters

        return await counters.aincr(self.name, key, delta, using=using)


_named: dict[str, NamedCounter] = {}


def register_counter(
    name: str,
    model: type[models.Model],
    *,
    keys: tuple[str, ...] = (),
    filter: models.Q | None = None,
    sum: str | None = None,
    mode: Mode = "queued",
    replica_writes: ReplicaWrites = "flag",
    bucket: Bucket | None = None,
) -> NamedCounter:
    """Declare a named counter over ``model`` (global when ``keys`` is empty).

    ``bucket``: count per period of a date or time field of ``model``, e.g.
    ``Bucket("created_at", "day", time_zone="Europe/Paris")``: the period is the last
    part of the key (read over a range with ``counters.get_range``, ``get_series``,
    ``top_range``).

    ``replica_writes``: what the counter does with rows written with
    ``session_replication_role = replica`` (see :func:`pgcounters.triggers.set_replica_writes`);
    ``migrate`` applies it.
    """
    if bucket is not None and not isinstance(bucket, Bucket):
        raise InvalidCounterDefinition(f"bucket is a pgcounters.Bucket, got {bucket!r}")
    counter = NamedCounter(
        name, model, tuple(keys), filter, sum, mode, _replica_writes(replica_writes), bucket
    )
    _named[name] = counter
    return counter


def replica_writes() -> dict[str, ReplicaWrites]:
    """The ``replica_writes`` choice of every declared counter, by name (``migrate`` applies
    them). Needs the app registry."""
    from django.apps import apps

    out: dict[str, ReplicaWrites] = {}
    for model in apps.get_models():
        for field in model._meta.get_fields():
            if isinstance(field, CounterColumn):
                out[field.spec().name] = field.counter_replica_writes
    for counter in _named.values():
        out[counter.name] = counter.replica_writes
    return out


def declared_counters() -> list[tuple[type[models.Model], CounterSpec]]:
    """Every declared counter as (source model, spec). Needs the app registry."""
    from django.apps import apps

    out: list[tuple[type[models.Model], CounterSpec]] = []
    for model in apps.get_models():
        for field in model._meta.get_fields():
            if isinstance(field, CounterColumn):
                spec = field.spec()
                rel = model._meta.get_field(field.relation or "")
                source = rel.related_model
                assert isinstance(source, type)
                out.append((source, spec))
    for counter in _named.values():
        out.append((counter.model, counter.spec()))
    return out
