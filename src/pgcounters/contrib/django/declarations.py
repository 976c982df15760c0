"""Counter declarations on Django models, and the specs derived from them.

Two ways to declare, both turned into core :class:`~pgcounters.specs.CounterSpec`
objects when the app registry is ready:

* a counter column on the parent model::

      class Article(models.Model):
          public_comments = CountField("comments", filter=Q(publish_status="public"))
          score_total = SumField("comments", "score")

* a counter through a path of relations (``"articles__comments"``: the comments of
  the author's articles), or through a many-to-many relation (``"tags"``)::

      class Author(models.Model):
          public_comments = CountField(
              "articles__comments", filter=Q(public=True, article__published=True)
          )

      class Tag(models.Model):
          published_articles = CountField("articles", filter=Q(published=True))

* a named counter in the generic table (global, or keyed by columns)::

      register_counter("blog.users.total", User)
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.db import connections, models
from django.db.models.sql import Query

from pgcounters.client import Mode
from pgcounters.errors import InvalidCounterDefinition, PgCountersError
from pgcounters.keys import Key, KeyType
from pgcounters.specs import (
    Bucket,
    ColumnTarget,
    CounterSpec,
    Fragment,
    NamedTarget,
    Table,
    Via,
    generic_relation,
)
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

    def counted_model(self) -> type[models.Model]:
        """The model whose rows the counter counts (a many-to-many's through model)."""
        path = _relation_path(self)
        if path is not None:
            return path.counted
        rel = self.model._meta.get_field(self.relation or "")
        source = rel.related_model
        assert isinstance(source, type)
        return source

    def spec(self) -> CounterSpec:
        """The core spec of this counter column."""
        model = self.model
        if not self.relation:
            raise InvalidCounterDefinition(f"{model.__name__}.{self.name}: name a relation")
        path = _relation_path(self)
        if path is not None:
            return path.spec
        try:
            rel = model._meta.get_field(self.relation)
        except Exception:
            raise InvalidCounterDefinition(
                f"{model.__name__}.{self.name}: {model.__name__} has no relation {self.relation!r}"
            ) from None
        generic = _generic_relation(rel)
        if generic is not None:
            return self._generic_spec(generic)
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

    def _generic_spec(self, rel: Any) -> CounterSpec:
        """The spec of a counter column over a ``GenericRelation``: the rows of the related
        model whose content type is this model's and whose object id is a row's key."""
        model = self.model
        source = rel.related_model
        assert isinstance(source, type)
        assert issubclass(source, models.Model)
        object_id = source._meta.get_field(rel.object_id_field_name)
        content_type = source._meta.get_field(rel.content_type_field_name)
        assert isinstance(object_id, models.Field)
        assert isinstance(content_type, models.ForeignKey)
        ct_model = content_type.related_model
        assert isinstance(ct_model, type)
        assert issubclass(ct_model, models.Model)
        concrete = model._meta.concrete_model
        opts = concrete._meta if rel.for_concrete_model and concrete is not None else model._meta
        pk = model._meta.pk
        assert pk is not None
        key_type = key_type_of(pk)
        summed, scale = (
            (None, None)
            if self.counter_sum is None
            else _summed_column(source, self.counter_sum, self.counter_places)
        )
        column = self.column
        if not (column and pk.column and object_id.column and content_type.column):
            raise InvalidCounterDefinition(f"{model.__name__}.{self.name} has no column")
        return generic_relation(
            f"{model._meta.app_label}.{model._meta.model_name}.{self.name}",
            _table(source),
            ColumnTarget(_table(model), column, pk.column, key_type),
            content_type=(opts.app_label, opts.model_name or ""),
            content_type_column=content_type.column,
            object_id_column=object_id.column,
            object_id_is_text=key_type_of(object_id) == "text" and key_type != "text",
            content_type_table=_table(ct_model),
            where=None
            if self.counter_filter is None
            else q_to_fragment(source, self.counter_filter),
            sum=summed,
            mode=self.counter_mode,
            scale=scale,
        )


def _generic_relation(field: object) -> Any:
    """``field`` if it is a ``GenericRelation`` (django.contrib.contenttypes), else None."""
    from django.apps import apps

    if not apps.is_installed("django.contrib.contenttypes"):
        return None
    from django.contrib.contenttypes.fields import GenericRelation

    return field if isinstance(field, GenericRelation) else None


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


@dataclass(frozen=True)
class _Path:
    """A counter column through a path of relations or a many-to-many relation."""

    spec: CounterSpec
    counted: type[models.Model]  # the model whose rows are counted (a through model)


def _relation_path(field: CounterColumn) -> _Path | None:
    """The spec of a counter column whose relation is a path (``"articles__comments"``) or
    a many-to-many relation; None for one foreign key."""
    model, relation = field.model, field.relation or ""
    what = f"{model.__name__}.{field.name}"
    if "__" not in relation:
        try:
            rel = model._meta.get_field(relation)
        except Exception:
            return None  # spec() says what is wrong
        if isinstance(rel, models.ManyToManyField | models.ManyToManyRel):
            return _many_to_many(field, rel)
        return None
    rels: list[models.ManyToOneRel] = []
    current: type[models.Model] = model
    parts = relation.split("__")
    through_fk: models.ForeignKey[Any, Any] | None = None
    for index, part in enumerate(parts):
        try:
            rel = current._meta.get_field(part)
        except Exception:
            raise InvalidCounterDefinition(
                f"{what}: {current.__name__} has no relation {part!r} (in {relation!r})"
            ) from None
        if isinstance(rel, models.ManyToManyField | models.ManyToManyRel):
            if index < len(parts) - 1:
                raise InvalidCounterDefinition(
                    f"{what}: {part!r} in {relation!r} is a many-to-many relation, which may "
                    "only end a path: through it a row reaches several rows above it, and a "
                    "path counts each row through one row per table"
                )
            through_fk, current = _through_step(field, rel, relation)
            break
        if not isinstance(rel, models.ManyToOneRel):
            raise InvalidCounterDefinition(
                f"{what}: {part!r} in {relation!r} is not the reverse side of a ForeignKey "
                "or a many-to-many relation (a path goes down foreign keys: parent, child, "
                "grandchild, and may end with a many-to-many relation)"
            )
        rels.append(rel)
        related = rel.related_model
        assert isinstance(related, type)
        current = related
    fks = [rel.remote_field for rel in rels]
    if through_fk is not None:  # the link rows, up to the model on this side
        fks.append(through_fk)
    counted = current
    # from the counted table up: each step is the table its foreign key points to
    via = [
        Via(_table(fk.related_model), link=_col(fk.column), key=_col(fk.target_field.column))
        for fk in reversed(fks[1:])
    ]
    first = fks[0]
    links = {
        _table(fk.related_model).name: (
            _col(fk.column),
            _col(fk.target_field.column),
            _table(fk.model).name,
        )
        for fk in fks[1:]
    }
    where = None
    if field.counter_filter is not None:
        where = _path_fragment(counted, field.counter_filter, links, what)
    summed, scale = (
        (None, None)
        if field.counter_sum is None
        else _summed_column(counted, field.counter_sum, field.counter_places)
    )
    if not (field.column and first.column):  # pragma: no cover - concrete fields
        raise InvalidCounterDefinition(f"{what} has no column")
    spec = CounterSpec(
        name=f"{model._meta.app_label}.{model._meta.model_name}.{field.name}",
        source=_table(counted),
        keys=(first.column,),
        via=via,
        target=ColumnTarget(
            _table(model), field.column, first.target_field.column, key_type_of(first)
        ),
        where=where,
        sum=summed,
        mode=field.counter_mode,
        scale=scale,
    )
    return _Path(spec, counted)


def _link(
    rel: models.ManyToManyField[Any, Any] | models.ManyToManyRel, what: str
) -> tuple[type[models.Model], str, str]:
    """A many-to-many relation seen from the side it was reached from: its through model
    and the names of the through model's foreign keys to this side and to the other side.
    A relation of a model with itself is refused (``what`` names the counter)."""
    forward = rel if isinstance(rel, models.ManyToManyField) else rel.field
    assert isinstance(forward, models.ManyToManyField)
    through = forward.remote_field.through
    assert isinstance(through, type)
    names = (forward.m2m_field_name(), forward.m2m_reverse_field_name())
    mine, theirs = names if isinstance(rel, models.ManyToManyField) else names[::-1]
    if forward.remote_field.model in (forward.model, "self"):
        raise InvalidCounterDefinition(
            f"{what}: a many-to-many relation of a model with itself cannot be counted "
            "(both sides are the same table)"
        )
    return through, mine, theirs


def _through_step(
    field: CounterColumn,
    rel: models.ManyToManyField[Any, Any] | models.ManyToManyRel,
    relation: str,
) -> tuple[models.ForeignKey[Any, Any], type[models.Model]]:
    """The many-to-many relation that ends a path (``"articles__tags"``): the through
    model's foreign key to this side of it, and the through model, whose rows (the links)
    are counted. A sum is refused: the through model has nothing to sum, and the other
    side's fields are not on the path (nor its rows' changes counted)."""
    what = f"{field.model.__name__}.{field.name}"
    through, mine, _ = _link(rel, what)
    if field.counter_sum is not None:
        raise InvalidCounterDefinition(
            f"{what}: a path that ends with a many-to-many relation ({relation!r}) counts its "
            "links; it sums nothing (the other side's rows are not on the path)"
        )
    own_fk = through._meta.get_field(mine)
    assert isinstance(own_fk, models.ForeignKey)
    return own_fk, through


def through_lookups(model: type[models.Model], relation: str) -> tuple[str, str] | None:
    """For a path that ends with a many-to-many relation (``"articles__tags"``), the names
    of its through model's foreign keys to this side and to the other side (``"article"``,
    ``"tag"``), which its filter's lookups start with; None for any other relation."""
    parts = relation.split("__")
    if len(parts) < 2:
        return None
    current: type[models.Model] = model
    for part in parts:
        rel = current._meta.get_field(part)
        if isinstance(rel, models.ManyToManyField | models.ManyToManyRel):
            _, mine, theirs = _link(rel, f"{model.__name__} {relation!r}")
            return mine, theirs
        related = rel.related_model
        assert isinstance(related, type)
        current = related
    return None


def _many_to_many(
    field: CounterColumn, rel: models.ManyToManyField[Any, Any] | models.ManyToManyRel
) -> _Path:
    """The rows of the through table per row of ``field.model``; with a filter (or a sum),
    through the other side's table, the filter being on the other side's fields."""
    model = field.model
    what = f"{model.__name__}.{field.name}"
    # the through table's foreign keys to this model and to the other side
    through, mine, theirs = _link(rel, what)
    own_fk = through._meta.get_field(mine)
    other_fk = through._meta.get_field(theirs)
    assert isinstance(own_fk, models.ForeignKey)
    assert isinstance(other_fk, models.ForeignKey)
    other = other_fk.related_model
    assert isinstance(other, type)
    from django.db import connections as dbs

    quote = dbs["default"].ops.quote_name
    where = None
    if field.counter_filter is not None:
        where = q_to_fragment(other, field.counter_filter)
    summed: Fragment | None = None
    scale: int | None = None
    if field.counter_sum is not None:
        column, scale = _summed_column(other, field.counter_sum, field.counter_places)
        summed = Fragment(f"{quote(_table(other).name)}.{quote(column)}")
    through_table = _table(through)
    if not (field.column and own_fk.column and other_fk.column):  # pragma: no cover
        raise InvalidCounterDefinition(f"{what} has no column")
    keys: tuple[str | Fragment, ...] = (own_fk.column,)
    via: tuple[Via, ...] = ()
    if where is not None or summed is not None:
        keys = (Fragment(f"{quote(through_table.name)}.{quote(own_fk.column)}"),)
        via = (Via(_table(other), link=other_fk.column, key=_col(other_fk.target_field.column)),)
    spec = CounterSpec(
        name=f"{model._meta.app_label}.{model._meta.model_name}.{field.name}",
        source=through_table,
        keys=keys,
        via=via,
        target=ColumnTarget(
            _table(model), field.column, _col(own_fk.target_field.column), key_type_of(own_fk)
        ),
        where=where,
        sum=summed,
        mode=field.counter_mode,
        scale=scale,
    )
    return _Path(spec, through)


def _col(column: str | None) -> str:
    if not isinstance(column, str):  # pragma: no cover - concrete fields have columns
        raise InvalidCounterDefinition("a field of the path has no column")
    return column


def _path_fragment(
    model: type[models.Model],
    q: models.Q,
    links: dict[str, tuple[str, str, str]],
    what: str,
) -> Fragment:
    """Compile a Q over the counted model whose lookups may go up the path
    (``article__published``) into an SQL fragment over the path's tables."""
    query = Query(model)
    try:
        query.add_q(q)
        compiler = query.get_compiler(connection=connections["default"])
        text, params = query.where.as_sql(compiler, compiler.connection)
    except Exception as exc:
        raise InvalidCounterDefinition(
            f"{what}: the filter {q!r} on {model.__name__} cannot be compiled: {exc}"
        ) from None
    base = model._meta.db_table
    for alias, join in query.alias_map.items():
        if alias == base:
            continue
        # a table of the path, reached by the path's own foreign key
        link = links.get(alias)
        cols = getattr(join, "join_cols", ())
        if (
            getattr(join, "table_name", None) != alias
            or link is None
            or getattr(join, "parent_alias", None) != link[2]
            or tuple(cols) != ((link[0], link[1]),)
        ):
            raise InvalidCounterDefinition(
                f"{what}: the filter {q!r} may use the fields of {model.__name__} and of the "
                "rows above it on the path (through the path's foreign keys), nothing else"
            )
    return Fragment(text, tuple(params))


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
        from django.core.exceptions import FieldDoesNotExist

        try:
            fields = [self.model._meta.get_field(k) for k in self.keys]
        except FieldDoesNotExist as exc:
            raise InvalidCounterDefinition(f"counter {self.name}: key {exc}") from None
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
# names that register_counter was given twice, for two different counters
_named_twice: set[str] = set()


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
    previous = _named.get(name)
    if previous is not None and previous != counter:
        _named_twice.add(name)
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


def declared_counters(*, skip_broken: bool = False) -> list[tuple[type[models.Model], CounterSpec]]:
    """Every declared counter as (source model, spec). Needs the app registry.

    A declaration that does not compile, or a name declared twice, raises
    :class:`InvalidCounterDefinition`; with ``skip_broken`` it is left out instead (the
    app registers the others' triggers, and the system check reports it)."""
    from django.apps import apps

    def column(field: CounterColumn) -> Callable[[], tuple[type[models.Model], CounterSpec]]:
        def make() -> tuple[type[models.Model], CounterSpec]:
            spec = field.spec()  # first: it says what is wrong with a relation not there
            return field.counted_model(), spec

        return make

    def named(counter: NamedCounter) -> Callable[[], tuple[type[models.Model], CounterSpec]]:
        return lambda: (counter.model, counter.spec())

    made: list[Callable[[], tuple[type[models.Model], CounterSpec]]] = []
    for model in apps.get_models():
        for field in model._meta.get_fields():
            if isinstance(field, CounterColumn):
                made.append(column(field))
    made += [named(counter) for counter in _named.values()]
    out: list[tuple[type[models.Model], CounterSpec]] = []
    seen: set[str] = set()
    for make in made:
        try:
            model, spec = make()
            if spec.name in seen or spec.name in _named_twice:
                raise InvalidCounterDefinition(
                    f"counter {spec.name} is declared twice: give each declaration a name "
                    "of its own (both would keep one counter)"
                )
        except PgCountersError:
            if skip_broken:
                continue
            raise
        seen.add(spec.name)
        out.append((model, spec))
    return out
