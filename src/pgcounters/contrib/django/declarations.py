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

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.db import connections, models
from django.db.models.sql import Query

from pgcounters.client import Mode
from pgcounters.errors import InvalidCounterDefinition
from pgcounters.keys import Key, KeyType
from pgcounters.specs import ColumnTarget, CounterSpec, Fragment, NamedTarget, Table

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


def _summed_column(model: type[models.Model], name: str) -> str:
    """The column of an integer field to sum (counters hold bigint values: a decimal or
    float sum would be rounded at every statement)."""
    column = _column(model, name)
    field = model._meta.get_field(name)
    if not isinstance(field, models.IntegerField) or isinstance(field, models.BooleanField):
        raise InvalidCounterDefinition(
            f"{model.__name__}.{name} is a {type(field).__name__}: a counter sums integer "
            "fields only (counters hold bigint values, so a decimal or float sum would be "
            "rounded at every write; store cents, not dollars)"
        )
    return column


def _table(model: type[models.Model]) -> Table:
    return Table(model._meta.db_table)


class CountField(models.BigIntegerField):  # type: ignore[type-arg]
    """A counter column: the number of related rows (through ``relation``) matching ``filter``.

    ``relation`` is the name of the reverse relation on this model (the
    ``related_name`` of the foreign key on the counted model). The column is a
    real ``bigint`` column, usable in ``filter``, ``order_by`` and the admin;
    it is indexed by default so that top-N queries use an index.
    """

    counter_sum: str | None = None

    def __init__(
        self,
        relation: str | None = None,
        filter: models.Q | None = None,
        *,
        mode: Mode = "queued",
        **kwargs: Any,
    ) -> None:
        self.relation = relation
        self.counter_filter = filter
        self.counter_mode: Mode = mode
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
        # the declaration lives in the triggers; the column is a plain bigint for migrations
        return name, "django.db.models.BigIntegerField", args, kwargs

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
        summed = None if self.counter_sum is None else _summed_column(source, self.counter_sum)
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
        )


class SumField(CountField):
    """A counter column holding the sum of ``field`` over related rows matching ``filter``."""

    def __init__(
        self,
        relation: str | None = None,
        field: str | None = None,
        filter: models.Q | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(relation, filter, **kwargs)
        self.counter_sum = field


@dataclass(frozen=True)
class NamedCounter:
    """A named counter over a model, declared with :func:`register_counter`."""

    name: str
    model: type[models.Model]
    keys: tuple[str, ...] = ()
    filter: models.Q | None = None
    sum: str | None = None
    mode: Mode = "queued"

    def spec(self) -> CounterSpec:
        fields = [self.model._meta.get_field(k) for k in self.keys]
        return CounterSpec(
            name=self.name,
            source=_table(self.model),
            keys=tuple(_column(self.model, k) for k in self.keys),
            target=NamedTarget(tuple(key_type_of(f) for f in fields)),  # type: ignore[arg-type]
            where=None if self.filter is None else q_to_fragment(self.model, self.filter),
            sum=None if self.sum is None else _summed_column(self.model, self.sum),
            mode=self.mode,
        )

    # reads and increments on Django's connection (pgcounters.contrib.django.counters)

    def get(self, key: object = None, *, exact: bool = True, using: str = "default") -> int:
        """The value for ``key`` (a model instance, a value, a tuple; nothing when global)."""
        from pgcounters.contrib.django import counters

        return counters.get(self.name, key, exact=exact, using=using)

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

    # the same from async code (awaited; on Django's connection, as its async ORM methods)

    async def aget(self, key: object = None, *, exact: bool = True, using: str = "default") -> int:
        """:meth:`get`, awaited."""
        from pgcounters.contrib.django import counters

        return await counters.aget(self.name, key, exact=exact, using=using)

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
) -> NamedCounter:
    """Declare a named counter over ``model`` (global when ``keys`` is empty)."""
    counter = NamedCounter(name, model, tuple(keys), filter, sum, mode)
    _named[name] = counter
    return counter


def declared_counters() -> list[tuple[type[models.Model], CounterSpec]]:
    """Every declared counter as (source model, spec). Needs the app registry."""
    from django.apps import apps

    out: list[tuple[type[models.Model], CounterSpec]] = []
    for model in apps.get_models():
        for field in model._meta.get_fields():
            if isinstance(field, CountField):
                spec = field.spec()
                rel = model._meta.get_field(field.relation or "")
                source = rel.related_model
                assert isinstance(source, type)
                out.append((source, spec))
    for counter in _named.values():
        out.append((counter.model, counter.spec()))
    return out
