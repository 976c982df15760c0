"""``verify`` with the ORM's own count as the truth, for counters declared on Django models.

``pgcounters verify`` counts the source rows with SQL compiled from the counter's
spec, by the same compiler that writes the triggers' deltas: a condition or a sum
compiled wrongly would be wrong on both sides. This check asks the ORM instead,
as the application itself would count: ``QuerySet.filter(<the declared Q>)
.values(<key>).annotate(Count("pk"))`` (or ``Sum(<field>)``), grouped by the
foreign key of a :class:`CountField` / :class:`SumField` or by the keys of a
:func:`register_counter` counter. It shares no code with the triggers.

The truth and pgcounters' values (the counter column or ``pgcounters.counters``,
plus the deltas still queued) are read in one REPEATABLE READ snapshot, so
writes going on meanwhile do not show as drift. ``manage.py pgcounters verify
--truth orm`` prints the same report as ``verify``.
"""

from __future__ import annotations

import datetime as dt
import zoneinfo
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, cast

from django.db import connections, models, transaction
from django.db.models import Count, Sum
from django.db.models.functions import Trunc

from pgcounters.client import value_of
from pgcounters.contrib.django.declarations import (
    CounterColumn,
    NamedCounter,
    _generic_relation,
    _named,
    key_type_of,
    through_lookups,
)
from pgcounters.errors import InvalidCounterDefinition, InvalidKey, UnknownCounter
from pgcounters.keys import Key, KeyType, decode_key
from pgcounters.repair import Mismatch, VerifyResult
from pgcounters.specs import Bucket
from pgcounters.sqlfiles import named


@dataclass(frozen=True)
class _Declared:
    """One counter declared on models, as the ORM sees it."""

    name: str
    source: type[models.Model]
    keys: tuple[str, ...]  # field names of the source model to group by
    key_types: tuple[KeyType, ...]
    filter: models.Q | None
    sum: str | None
    parent: type[models.Model] | None = None  # a counter column: its model ...
    parent_key: str = ""  # ... the field the foreign key points to ...
    column: str = ""  # ... and the counter field
    scale: int | None = None  # an exact sum of decimals: its values in units of 10^-scale
    relation: str = ""  # a path, a many-to-many or a generic relation: counted from the parent
    bucket: Bucket | None = None  # counted per period of a field (Bucket.column names it)

    def truth(self, using: str) -> dict[Key, Number]:
        """The ORM's own count (or sum) per key of the source rows."""
        if self.relation:
            return self._related_truth(using)
        rows = self.source._default_manager.using(using).all()
        if self.filter is not None:
            rows = rows.filter(self.filter)
        aggregate = Count("pk") if self.sum is None else Sum(self.sum)
        if self.bucket is not None:
            return _per_period(self, rows, aggregate)
        if not self.keys:
            value = rows.aggregate(truth=aggregate)["truth"]
            return {(): _number(value)}
        for key in self.keys:  # a row with a NULL key part counts nowhere
            rows = rows.exclude(**{f"{key}__isnull": True})
        grouped = rows.order_by().values(*self.keys).annotate(truth=aggregate)
        return {tuple(row[k] for k in self.keys): _number(row["truth"]) for row in grouped}

    def _related_truth(self, using: str) -> dict[Key, Number]:
        """``Parent.objects.annotate(Count("articles__comments", filter=Q(...)))``: a path, a
        many-to-many or a generic relation, the filter's lookups taken from the parent
        (``articles__comments__public``)."""
        assert self.parent is not None
        q = None if self.filter is None else _prefixed(self.filter, self.relation)
        ends = through_lookups(self.parent, self.relation)
        if ends is not None and self.filter is not None:
            # a filter on the link rows: their row on this side is the path's last but one
            # step (``article__published``: ``articles__published``), the other side's
            # is the relation's (``tag__active``: ``articles__tags__active``)
            own, other = ends
            up = self.relation.rpartition("__")[0]
            q = _through_prefixed(self.filter, {own: up, other: self.relation})
        aggregate = (
            Count(self.relation, filter=q)
            if self.sum is None
            else Sum(f"{self.relation}__{self.sum}", filter=q)
        )
        rows = (
            self.parent._default_manager.using(using)
            .order_by()
            .annotate(truth=aggregate)
            .values_list(self.parent_key, "truth")
        )
        return {(key,): _number(value) for key, value in rows}


def _prefixed(q: models.Q, relation: str) -> models.Q:
    """``q`` over the related model's fields, as lookups through ``relation``."""
    out = models.Q()
    out.connector, out.negated = q.connector, q.negated
    children: list[Any] = []
    for child in q.children:
        if isinstance(child, models.Q):
            children.append(_prefixed(child, relation))
        else:
            lookup, value = cast(tuple[str, Any], child)
            children.append((f"{relation}__{lookup}", value))
    out.children = children
    return out


def _through_prefixed(q: models.Q, prefixes: dict[str, str]) -> models.Q:
    """``q`` over a through model's fields, its lookups through its foreign keys replaced by
    the relations from the parent (``prefixes``: the foreign key's name -> the relation)."""
    out = models.Q()
    out.connector, out.negated = q.connector, q.negated
    children: list[Any] = []
    for child in q.children:
        if isinstance(child, models.Q):
            children.append(_through_prefixed(child, prefixes))
        else:
            lookup, value = cast(tuple[str, Any], child)
            head, _, rest = lookup.partition("__")
            if head not in prefixes:  # a field of a through model of one's own
                raise InvalidCounterDefinition(
                    f"the ORM cannot count the filter {q!r} from the parent: {head!r} is a "
                    "field of the through model (verify without --truth orm)"
                )
            children.append((f"{prefixes[head]}__{rest}" if rest else prefixes[head], value))
    out.children = children
    return out


Number = int | Decimal


def _per_period(counter: _Declared, rows: Any, aggregate: Any) -> dict[Key, Number]:
    """The truth of a counter per period: days, weeks and months by the ORM's own
    ``Trunc`` in the counter's time zone; hours from each row's time, in Python (the
    ORM's ``TruncHour`` gives the two 02:00 of the night clocks go back one hour)."""
    bucket = counter.bucket
    assert bucket is not None
    assert isinstance(bucket.column, str)
    field = bucket.column
    zone = zoneinfo.ZoneInfo(bucket.time_zone)
    keys = counter.keys
    for part in (*keys, field):  # a row with a NULL key part counts nowhere
        rows = rows.exclude(**{f"{part}__isnull": True})
    out: dict[Key, Number] = {}
    if bucket.period != "hour":
        model_field = counter.source._meta.get_field(field)
        datetimes = isinstance(model_field, models.DateTimeField)
        trunc = (
            Trunc(field, bucket.period, output_field=models.DateField(), tzinfo=zone)
            if datetimes
            else Trunc(field, bucket.period, output_field=models.DateField())
        )
        grouped = (
            rows.order_by()
            .annotate(pgc_period=trunc)
            .values(*keys, "pgc_period")
            .annotate(truth=aggregate)
        )
        for row in grouped:
            out[(*(row[k] for k in keys), row["pgc_period"])] = _number(row["truth"])
        return out
    summed = counter.sum
    for row in rows.order_by().values(*keys, field, *([summed] if summed else [])):
        instant: dt.datetime = row[field]
        if not isinstance(instant, dt.datetime):
            instant = dt.datetime.combine(instant, dt.time())
        if instant.tzinfo is None:  # wall-clock time in the counter's zone
            instant = instant.replace(tzinfo=zone)
        local = instant.astimezone(zone)
        start = instant.astimezone(dt.UTC) - dt.timedelta(
            minutes=local.minute, seconds=local.second, microseconds=local.microsecond
        )
        hour: Key = (*(row[k] for k in keys), start.strftime("%Y-%m-%dT%H:%M:%SZ"))
        value = 1 if summed is None else _number(row[summed])
        out[hour] = out.get(hour, 0) + value
    return {k: v for k, v in out.items() if v or summed is None}


def _number(value: Any) -> Number:
    """An ORM aggregate or a column value: a Decimal stays exact, anything else is an int."""
    return value if isinstance(value, Decimal) else int(value or 0)


def _column_counters() -> Iterable[_Declared]:
    from django.apps import apps

    for model in apps.get_models():
        for field in model._meta.get_fields():
            if not isinstance(field, CounterColumn):
                continue
            if "__" in (field.relation or "") or isinstance(
                model._meta.get_field(field.relation or ""),
                models.ManyToManyField | models.ManyToManyRel,
            ):
                spec = field.spec()
                yield _Declared(
                    name=spec.name,
                    source=field.counted_model(),
                    keys=(),
                    key_types=spec.key_types,
                    filter=field.counter_filter,
                    sum=field.counter_sum,
                    parent=model,
                    parent_key=next(
                        f.attname
                        for f in model._meta.concrete_fields
                        if f.column == spec.target.key_column  # type: ignore[union-attr]
                    ),
                    column=field.attname,
                    scale=spec.scale,
                    relation=field.relation or "",
                )
                continue
            rel = model._meta.get_field(field.relation or "")
            if _generic_relation(rel) is not None:
                spec = field.spec()
                source = rel.related_model
                assert isinstance(source, type)
                pk = model._meta.pk
                assert pk is not None
                yield _Declared(
                    name=spec.name,
                    source=source,
                    keys=(),
                    key_types=(key_type_of(pk),),
                    filter=field.counter_filter,
                    sum=field.counter_sum,
                    parent=model,
                    parent_key=pk.attname,
                    column=field.attname,
                    scale=spec.scale,
                    relation=field.relation or "",
                )
                continue
            assert isinstance(rel, models.ManyToOneRel)
            source = rel.related_model
            assert isinstance(source, type)
            fk = rel.remote_field
            assert isinstance(fk, models.ForeignKey)
            spec = field.spec()
            yield _Declared(
                name=spec.name,
                source=source,
                keys=(fk.attname,),
                key_types=(key_type_of(fk),),
                filter=field.counter_filter,
                sum=field.counter_sum,
                parent=model,
                parent_key=fk.target_field.attname,
                column=field.attname,
                scale=spec.scale,
            )


def _named_counter(counter: NamedCounter) -> _Declared:
    fields = [counter.model._meta.get_field(k) for k in counter.keys]
    spec = counter.spec()
    return _Declared(
        name=counter.name,
        source=counter.model,
        keys=tuple(getattr(f, "attname", f.name) for f in fields),
        key_types=spec.key_types,
        filter=counter.filter,
        sum=counter.sum,
        scale=spec.scale,
        bucket=counter.bucket,
    )


def declared() -> dict[str, _Declared]:
    """Every counter declared on models, by name."""
    out = {d.name: d for d in _column_counters()}
    out.update((c.name, _named_counter(c)) for c in _named.values())
    return out


def _decoded(parts: Sequence[str | None], key_types: tuple[KeyType, ...]) -> Key | None:
    if len(parts) != len(key_types) or any(p is None for p in parts):
        return None
    try:
        return decode_key([p for p in parts if p is not None], key_types)
    except (ValueError, InvalidKey):
        return None


def _held(cursor: Any, name: str) -> list[tuple[list[str | None], int]]:
    """Pending deltas per key (and, for a named counter, stored values) from pgcounters."""
    cursor.execute(named("django.sql")["target_id"], [name])
    row = cursor.fetchone()
    if row is None:  # the triggers never fired: nothing stored, nothing pending
        return []
    cursor.execute(named("django.sql")["held"], {"t": row[0]})
    return [(list(key), int(value)) for key, value in cursor.fetchall()]


def _first_kept(counter: _Declared, cursor: Any) -> str | None:
    """The first period a counter per period keeps, as its key part's text; None when it
    keeps every period."""
    bucket = counter.bucket
    if bucket is None or bucket.keep is None:
        return None
    cursor.execute(
        named("django.sql")["first_period_kept"],
        {"period": bucket.period, "zone": bucket.time_zone, "keep": bucket.keep},
    )
    row = cursor.fetchone()
    return None if row is None or row[0] is None else str(row[0])


def _period_text(part: object) -> str:
    """A period's key part as the text the database keys it by (a date's ISO form)."""
    return part.isoformat() if isinstance(part, dt.date) else str(part)


def _compare(counter: _Declared, using: str, cursor: Any) -> VerifyResult:
    truth = counter.truth(using)
    held = _held(cursor, counter.name)
    actual: dict[Key, Number] = {}
    undecodable: dict[tuple[str | None, ...], Number] = {}
    keys: list[Key] = []
    for parts, units in held:
        value: Number = units if counter.scale is None else value_of(counter.scale, units)
        key = _decoded(parts, counter.key_types)
        if key is None:
            undecodable[tuple(parts)] = value
        else:
            actual[key] = actual.get(key, 0) + value
    if counter.parent is not None:
        stored = counter.parent._default_manager.using(using).values_list(
            counter.parent_key, counter.column
        )
        for key_value, value in stored:
            key = (key_value,)
            keys.append(key)
            actual[key] = actual.get(key, 0) + _number(value)
    else:
        keys = list(set(truth) | set(actual))
    first = _first_kept(counter, cursor)
    if first is not None:  # periods no longer kept: the worker deletes their values
        keys = [key for key in keys if _period_text(key[-1]) >= first]
    mismatches = [
        Mismatch(key, truth.get(key, 0), actual.get(key, 0))
        for key in keys
        if truth.get(key, 0) != actual.get(key, 0)
    ]
    mismatches += [Mismatch(key, 0, v) for key, v in undecodable.items() if v]
    mismatches.sort(key=lambda m: repr(m.key))
    return VerifyResult(counter.name, len(keys), mismatches)


def _snapshot(using: str) -> AbstractContextManager[Any]:
    """One REPEATABLE READ read-only transaction (the caller's own, if already in one)."""
    connection = connections[using]
    if connection.in_atomic_block:
        return nullcontext()
    return transaction.atomic(using=using)


def verify_orm(names: Sequence[str] = (), *, using: str = "default") -> list[VerifyResult]:
    """Compare every counter declared on models (or those named) with the ORM's own count.

    Raises :class:`~pgcounters.errors.UnknownCounter` for a name no model declares.
    """
    counters = declared()
    unknown = [n for n in names if n not in counters]
    if unknown:
        raise UnknownCounter(
            f"no counter declared on a Django model is named {', '.join(unknown)}"
            " (--truth orm checks counters declared with CountField, SumField, register_counter)"
        )
    chosen = [counters[n] for n in dict.fromkeys(names)] if names else list(counters.values())
    connection = connections[using]
    fresh = not connection.in_atomic_block
    with _snapshot(using), connection.cursor() as cursor:
        if fresh:
            cursor.execute(named("django.sql")["snapshot"])
        return [_compare(counter, using, cursor) for counter in chosen]
