"""Counter specs: what to count, from which table, into which target.

A spec is plain data. :mod:`pgcounters.compiler` turns it into trigger SQL
without a database; :mod:`pgcounters.triggers` installs it; the Django app only
derives specs from model declarations.

Example: public comments per article, kept in ``blog_article.public_comments``::

    CounterSpec(
        name="blog.article.public_comments",
        source="blog_comment",
        keys=("article_id",),
        target=ColumnTarget("blog_article", "public_comments"),
        where=Fragment("publish_status = %s", ("public",)),
    )

Conditions, summed values and key expressions that are not plain columns are
:class:`Fragment` objects: SQL written by the developer (like a migration)
with ``%s`` placeholders, whose values are rendered as literals by psycopg.
Values never come from string formatting.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias, cast, get_args

from psycopg import sql as pgsql

from pgcounters.client import MODES, Mode
from pgcounters.errors import InvalidCounterDefinition
from pgcounters.keys import KEY_TYPES, MAX_KEY_PARTS, KeyType, check_name

MAX_SCALE = 18  # decimal places of an exact sum: 10^18 units still fit a bigint
MAX_IDENTIFIER = 63  # bytes: PostgreSQL's NAMEDATALEN - 1

_PLACEHOLDER = re.compile(r"%s|%%")


def check_identifier(value: object, what: str) -> str:
    """Return ``value`` if it can be a PostgreSQL identifier, else raise."""
    if not isinstance(value, str) or not value:
        raise InvalidCounterDefinition(f"{what} must be a non-empty string, got {value!r}")
    if "\x00" in value:
        raise InvalidCounterDefinition(f"{what} {value!r} contains a NUL character")
    if len(value.encode()) > MAX_IDENTIFIER:
        raise InvalidCounterDefinition(
            f"{what} {value!r} is longer than PostgreSQL's limit of {MAX_IDENTIFIER} bytes"
        )
    return value


@dataclass(frozen=True)
class Fragment:
    """A piece of SQL with ``%s`` placeholders for values (``%%`` for a literal ``%``)."""

    sql: str
    params: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.sql, str) or not self.sql.strip():
            raise InvalidCounterDefinition("an SQL fragment must be a non-empty string")
        object.__setattr__(self, "params", tuple(self.params))
        for value in self.params:
            if value is not None and not isinstance(value, str | int | float | bool):
                raise InvalidCounterDefinition(
                    f"SQL fragment values are str, int, float, bool or None (stored as JSON); "
                    f"got {type(value).__name__}: cast a string in SQL instead"
                )
        wanted = sum(1 for m in _PLACEHOLDER.finditer(self.sql) if m.group() == "%s")
        if wanted != len(self.params):
            raise InvalidCounterDefinition(
                f"SQL fragment {self.sql!r} has {wanted} placeholders but {len(self.params)} values"
            )

    def composed(self) -> pgsql.Composable:
        """The fragment with its values as SQL literals quoted by psycopg."""
        parts: list[pgsql.Composable] = []
        values = iter(self.params)
        last = 0
        for match in _PLACEHOLDER.finditer(self.sql):
            parts.append(pgsql.SQL(self.sql[last : match.start()]))
            if match.group() == "%s":
                parts.append(pgsql.Literal(next(values)))
            else:
                parts.append(pgsql.SQL("%"))
            last = match.end()
        parts.append(pgsql.SQL(self.sql[last:]))
        return pgsql.Composed(parts)

    def to_json(self) -> dict[str, Any]:
        return {"sql": self.sql, "params": list(self.params)}


@dataclass(frozen=True)
class Table:
    """A table, schema-qualified (``public`` when not given)."""

    name: str
    schema: str = "public"

    def __post_init__(self) -> None:
        check_identifier(self.name, "table name")
        check_identifier(self.schema, "schema name")

    @classmethod
    def of(cls, value: Table | str) -> Table:
        """A Table from a Table or a ``"table"`` / ``"schema.table"`` string."""
        if isinstance(value, Table):
            return value
        if not isinstance(value, str):
            raise InvalidCounterDefinition(f"expected a table name, got {value!r}")
        schema, dot, name = value.rpartition(".")
        return cls(name, schema) if dot else cls(name)

    def identifier(self) -> pgsql.Identifier:
        return pgsql.Identifier(self.schema, self.name)

    def __str__(self) -> str:
        return f"{self.schema}.{self.name}"


@dataclass(frozen=True, init=False)
class ColumnTarget:
    """A counter column on a parent table, e.g. ``blog_article.public_comments``."""

    table: Table
    column: str
    key_column: str
    key_type: KeyType

    def __init__(
        self,
        table: Table | str,
        column: str,
        key_column: str = "id",
        key_type: KeyType = "bigint",
    ) -> None:
        object.__setattr__(self, "table", Table.of(table))
        object.__setattr__(self, "column", column)
        object.__setattr__(self, "key_column", key_column)
        object.__setattr__(self, "key_type", key_type)
        check_identifier(self.column, "counter column")
        check_identifier(self.key_column, "key column")
        if self.key_type not in KEY_TYPES:
            raise InvalidCounterDefinition(
                f"key type must be one of {', '.join(KEY_TYPES)}, got {self.key_type!r}"
            )

    @property
    def key_types(self) -> tuple[KeyType, ...]:
        return (self.key_type,)


@dataclass(frozen=True)
class NamedTarget:
    """A named counter in the generic counters table; ``()`` keys for a global one."""

    key_types: tuple[KeyType, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "key_types", tuple(self.key_types))
        for key_type in self.key_types:
            if key_type not in KEY_TYPES:
                raise InvalidCounterDefinition(
                    f"key type must be one of {', '.join(KEY_TYPES)}, got {key_type!r}"
                )


Target: TypeAlias = ColumnTarget | NamedTarget
KeyExpr: TypeAlias = str | Fragment
Period: TypeAlias = Literal["hour", "day", "week", "month"]
PERIODS: tuple[Period, ...] = get_args(Period)


def _zone_exists(name: str) -> bool:
    import zoneinfo

    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return False
    return True


@dataclass(frozen=True)
class Bucket:
    """Count per period of a timestamp: the period becomes the last part of the key.

    * ``column``: the column (or a :class:`Fragment`) of the source row whose time
      says the period: a ``timestamptz`` (its time in ``time_zone``), a ``timestamp``
      (read as wall-clock time in ``time_zone``) or a ``date``.
    * ``period``: ``hour``, ``day``, ``week`` (starting on Monday) or ``month``, as
      the calendar of ``time_zone`` has them (a day when clocks change has 23 or
      25 hours), whatever the writing session's ``TimeZone``.
    * ``time_zone``: an IANA time zone name (``"Europe/Paris"``).
    * ``keep``: how many periods are kept, the current one included (None: all).
      Older values read as 0 and the worker deletes them.

    The key part is the local date a day, week or month starts on (key type
    ``date``), or the UTC instant an hour starts at, ``'2026-03-29T01:00:00Z'``
    (key type ``text``).
    """

    column: KeyExpr
    period: Period = "day"
    time_zone: str = "UTC"
    keep: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.column, str):
            check_identifier(self.column, "bucket column")
        elif not isinstance(self.column, Fragment):
            raise InvalidCounterDefinition(
                f"a bucket's column is a column name or a Fragment: {self.column!r}"
            )
        if self.period not in PERIODS:
            raise InvalidCounterDefinition(
                f"period must be one of {', '.join(PERIODS)}, got {self.period!r}"
            )
        if not isinstance(self.time_zone, str) or not _zone_exists(self.time_zone):
            raise InvalidCounterDefinition(
                f"time_zone must be an IANA time zone name (e.g. 'Europe/Paris'), "
                f"got {self.time_zone!r}"
            )
        if self.keep is not None and (
            isinstance(self.keep, bool) or not isinstance(self.keep, int) or self.keep < 1
        ):
            raise InvalidCounterDefinition(
                f"keep is a positive number of periods (or None: all), got {self.keep!r}"
            )

    @property
    def key_type(self) -> KeyType:
        """The type of the key part: ``text`` for an hour, ``date`` for longer periods."""
        return "text" if self.period == "hour" else "date"

    def expression(self, table: str | None = None) -> Fragment:
        """The key part as SQL, keyed the same in every session; ``table`` qualifies a
        column name (a counter through a path joins tables that may share it)."""
        if isinstance(self.column, Fragment):
            column, params = f"({self.column.sql})", self.column.params
        else:
            quoted = '"' + self.column.replace('"', '""') + '"'
            if table is not None:
                quoted = '"' + table.replace('"', '""') + '".' + quoted
            column, params = quoted.replace("%", "%%"), ()
        if self.period == "hour":
            return Fragment(f"pgcounters.bucket_hour({column}, %s)", (*params, self.time_zone))
        return Fragment(
            f"pgcounters.bucket_date({column}, %s, %s)", (*params, self.period, self.time_zone)
        )

    def to_json(self) -> dict[str, Any]:
        column = self.column.to_json() if isinstance(self.column, Fragment) else self.column
        return {
            "column": column,
            "period": self.period,
            "time_zone": self.time_zone,
            "keep": self.keep,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Bucket:
        column = data["column"]
        if isinstance(column, dict):
            column = Fragment(column["sql"], tuple(column.get("params", ())))
        return cls(column, data["period"], data["time_zone"], data.get("keep"))


MAX_VIA = 3  # tables a path may go through beyond the counted one


@dataclass(frozen=True, init=False)
class Via:
    """One step of a path from the counted table up to the counter's key.

    The row of the table before it in the path (the counted table for the first step)
    holds ``link``, a column whose value is this table's ``key`` (a foreign key); a row
    of the counted table counts only if every step finds its row and each found row
    satisfies its ``where`` (None: any row). In SQL, each table of a path is named by
    its own table name (``"blog_article"."published"``).

    Public comments per author, through the articles::

        CounterSpec(
            name="blog.author.public_comments",
            source="blog_comment",
            keys=("author_id",),  # a column of the last table of the path
            via=(Via("blog_article", link="article_id"),),
            target=ColumnTarget("blog_author", "public_comments"),
            where=Fragment("publish_status = %s", ("public",)),
        )
    """

    table: Table
    link: str
    key: str
    where: Fragment | None

    def __init__(
        self,
        table: Table | str,
        link: str,
        key: str = "id",
        where: Fragment | None = None,
    ) -> None:
        object.__setattr__(self, "table", Table.of(table))
        object.__setattr__(self, "link", check_identifier(link, "link column"))
        object.__setattr__(self, "key", check_identifier(key, "key column"))
        if where is not None and not isinstance(where, Fragment):
            raise InvalidCounterDefinition(f"where is a Fragment or None: {where!r}")
        object.__setattr__(self, "where", where)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": self.table.schema,
            "table": self.table.name,
            "link": self.link,
            "key": self.key,
            "where": None if self.where is None else self.where.to_json(),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Via:
        where = data.get("where")
        return cls(
            Table(data["table"], data["schema"]),
            data["link"],
            data.get("key", "id"),
            None if where is None else Fragment(where["sql"], tuple(where.get("params", ()))),
        )


@dataclass(frozen=True, init=False)
class CounterSpec:
    """Count (or sum) rows of ``source`` that satisfy ``where``, per key, into ``target``.

    * ``keys``: columns (or expressions) of the source row that identify the
      counter key: one for a column target (the parent's id, e.g. a foreign
      key), one per key part for a named target, none for a global counter.
      A row whose key has a NULL part counts nowhere. With ``via``, a key named
      by a column is a column of the last table of the path; a Fragment may name
      a column of any table of the path (qualified by its table name).
    * ``where``: the condition a row must satisfy to count (None: every row).
    * ``sum``: a column or expression to add up instead of counting rows.
      NULL values add nothing. It must be of an integer type, unless ``scale``
      is given.
    * ``scale``: for an exact sum of decimals, the number of decimal places
      of the summed ``numeric(p, s)`` column (``s``, 0 to 18). The counter
      keeps its value as a whole number of ``10^-s`` units and reads as a
      :class:`~decimal.Decimal`; a counter column must be ``numeric`` with the
      same scale. A summed value with more decimal places is refused.
    * ``via``: a path of :class:`Via` steps from the counted table up to the table
      holding the key (rows of a grandchild per ancestor, or a many-to-many's other
      side with a condition on it); ``()``: the key is on the counted row itself.
    * ``mode``: ``queued`` (deltas go to the durable queue; default),
      ``unlogged`` (the unlogged queue) or ``direct`` (applied in the writing
      transaction: read-your-writes, but it locks the counter rows).
    * ``bucket``: count per period of a timestamp (a :class:`Bucket`; a named
      target only). The period is appended to ``keys`` (its expression) and to
      the target's key types (``date``, or ``text`` for an hour).
    * ``reads``: other tables a Fragment of ``keys``, ``where`` or ``sum`` reads (a
      subquery's table, such as a generic relation's content type table). Nothing
      is compiled from them: ``grant_worker`` gives the worker SELECT on them, so its
      recounts and backfills may run the counting statement.
    """

    name: str
    source: Table
    target: Target
    keys: tuple[KeyExpr, ...]
    where: Fragment | None
    sum: KeyExpr | None
    mode: Mode
    scale: int | None
    via: tuple[Via, ...]
    bucket: Bucket | None
    reads: tuple[Table, ...]
    _fingerprint: str = field(repr=False, compare=False)

    def __init__(
        self,
        name: str,
        source: Table | str,
        target: Target,
        keys: KeyExpr | Sequence[KeyExpr] = (),
        where: Fragment | None = None,
        sum: KeyExpr | None = None,
        mode: Mode = "queued",
        scale: int | None = None,
        via: Sequence[Via] = (),
        bucket: Bucket | None = None,
        reads: Sequence[Table | str] = (),
    ) -> None:
        for attr, value in (
            ("name", name),
            ("source", source),
            ("target", target),
            ("keys", keys),
            ("where", where),
            ("sum", sum),
            ("mode", mode),
            ("scale", scale),
            ("via", via),
            ("bucket", bucket),
            ("reads", reads),
        ):
            object.__setattr__(self, attr, value)
        self._add_bucket()
        self._validate()

    def _add_bucket(self) -> None:
        """A counter per period keys by its period last: its expression and key type."""
        if self.bucket is None:
            return
        if not isinstance(self.bucket, Bucket):
            raise InvalidCounterDefinition(f"bucket is a Bucket or None: {self.bucket!r}")
        if not isinstance(self.target, NamedTarget):
            raise InvalidCounterDefinition(
                f"counter {self.name}: a counter per period is a named counter "
                "(NamedTarget): a column holds one value per row"
            )
        keys = (self.keys,) if isinstance(self.keys, str | Fragment) else tuple(self.keys)
        # through a path, the column is the counted table's, which the path's SQL names
        # by its own table name
        table = Table.of(self.source).name if self.via else None
        object.__setattr__(self, "keys", (*keys, self.bucket.expression(table)))
        object.__setattr__(
            self, "target", NamedTarget((*self.target.key_types, self.bucket.key_type))
        )

    def _validate(self) -> None:
        try:
            check_name(self.name)
        except Exception as exc:
            raise InvalidCounterDefinition(str(exc)) from None
        object.__setattr__(self, "source", Table.of(self.source))
        keys = (self.keys,) if isinstance(self.keys, str | Fragment) else tuple(self.keys)
        object.__setattr__(self, "keys", keys)
        for key in keys:
            if isinstance(key, str):
                check_identifier(key, "key column")
            elif not isinstance(key, Fragment):
                raise InvalidCounterDefinition(f"a key is a column name or a Fragment: {key!r}")
        if isinstance(self.sum, str):
            check_identifier(self.sum, "summed column")
        elif self.sum is not None and not isinstance(self.sum, Fragment):
            raise InvalidCounterDefinition(f"sum is a column name or a Fragment: {self.sum!r}")
        if self.scale is not None:
            if isinstance(self.scale, bool) or not isinstance(self.scale, int):
                raise InvalidCounterDefinition(
                    f"counter {self.name}: scale is a number of decimal places, got {self.scale!r}"
                )
            if not 0 <= self.scale <= MAX_SCALE:
                raise InvalidCounterDefinition(
                    f"counter {self.name}: scale is 0 to {MAX_SCALE} decimal places "
                    f"(values are kept in units of 10^-scale within the bigint range), "
                    f"got {self.scale}"
                )
            if self.sum is None:
                raise InvalidCounterDefinition(
                    f"counter {self.name}: a scale is for a sum of decimals; it counts rows"
                )
        if self.where is not None and not isinstance(self.where, Fragment):
            raise InvalidCounterDefinition(f"where is a Fragment or None: {self.where!r}")
        if self.mode not in MODES:
            raise InvalidCounterDefinition(
                f"mode must be one of {', '.join(MODES)}, got {self.mode!r}"
            )
        if isinstance(self.target, ColumnTarget):
            if len(keys) != 1:
                raise InvalidCounterDefinition(
                    f"counter {self.name}: a column target needs exactly one key "
                    f"(the column holding the parent's {self.target.key_column}), got {len(keys)}"
                )
        elif isinstance(self.target, NamedTarget):
            if len(keys) != len(self.target.key_types):
                raise InvalidCounterDefinition(
                    f"counter {self.name}: {len(keys)} key expressions for "
                    f"{len(self.target.key_types)} key types"
                )
            if len(keys) > MAX_KEY_PARTS:
                raise InvalidCounterDefinition(f"a key has at most {MAX_KEY_PARTS} parts")
        else:
            raise InvalidCounterDefinition(f"unknown target {self.target!r}")
        self._validate_via()
        self._validate_reads()
        object.__setattr__(self, "_fingerprint", _digest(self.to_json()))

    def _validate_reads(self) -> None:
        if isinstance(self.reads, Table | str) or not isinstance(self.reads, Sequence):
            raise InvalidCounterDefinition(
                f"counter {self.name}: reads is a sequence of tables, got {self.reads!r}"
            )
        tables: list[Table] = []
        for table in self.reads:
            if not isinstance(table, Table | str):
                raise InvalidCounterDefinition(
                    f"counter {self.name}: reads is a sequence of tables, got {table!r}"
                )
            tables.append(Table.of(table))
        object.__setattr__(self, "reads", tuple(tables))

    def _validate_via(self) -> None:
        if isinstance(self.via, Via) or not isinstance(self.via, Sequence):
            raise InvalidCounterDefinition(
                f"counter {self.name}: via is a sequence of Via steps, got {self.via!r}"
            )
        via = tuple(self.via)
        object.__setattr__(self, "via", via)
        if not via:
            return
        for step in via:
            if not isinstance(step, Via):
                raise InvalidCounterDefinition(
                    f"counter {self.name}: via is a sequence of Via steps, got {step!r}"
                )
        if len(via) > MAX_VIA:
            raise InvalidCounterDefinition(
                f"counter {self.name}: a path goes through at most {MAX_VIA} tables, got {len(via)}"
            )
        names = [self.source.name, *(step.table.name for step in via)]
        if len(set(names)) != len(names):
            raise InvalidCounterDefinition(
                f"counter {self.name}: each table of a path appears once (its name is its "
                f"alias in SQL), got {' -> '.join(names)}"
            )

    @property
    def key_types(self) -> tuple[KeyType, ...]:
        return self.target.key_types

    @property
    def fingerprint(self) -> str:
        """A short hash of the definition: it changes when anything that is compiled changes."""
        return self._fingerprint

    def to_json(self) -> dict[str, Any]:
        """The definition as JSON-compatible data (stored in ``pgcounters.specs``)."""

        def expr(value: KeyExpr | None) -> Any:
            return value.to_json() if isinstance(value, Fragment) else value

        target: dict[str, Any]
        if isinstance(self.target, ColumnTarget):
            target = {
                "kind": "column",
                "schema": self.target.table.schema,
                "table": self.target.table.name,
                "column": self.target.column,
                "key_column": self.target.key_column,
                "key_type": self.target.key_type,
            }
        else:
            target = {"kind": "named", "key_types": list(self.target.key_types)}
        out = {
            "version": 1,
            "name": self.name,
            "source": {"schema": self.source.schema, "table": self.source.name},
            "keys": [expr(k) for k in self.keys],
            "where": expr(self.where),
            "sum": expr(self.sum),
            "mode": self.mode,
            "target": target,
        }
        if self.scale is not None:  # absent for integer sums: their fingerprints stay
            out["scale"] = self.scale
        if self.via:  # absent without a path: the fingerprints of other counters stay
            out["via"] = [step.to_json() for step in self.via]
        if self.bucket is not None:  # absent without one: fingerprints stay
            out["bucket"] = self.bucket.to_json()
        if self.reads:  # absent without one: fingerprints stay
            out["reads"] = [{"schema": t.schema, "table": t.name} for t in self.reads]
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CounterSpec:
        """The inverse of :meth:`to_json`."""

        def expr(value: Any) -> KeyExpr | None:
            if isinstance(value, dict):
                return Fragment(value["sql"], tuple(value.get("params", ())))
            return cast(str | None, value)

        try:
            t = data["target"]
            target: Target
            if t["kind"] == "column":
                target = ColumnTarget(
                    Table(t["table"], t["schema"]), t["column"], t["key_column"], t["key_type"]
                )
            else:
                target = NamedTarget(tuple(t["key_types"]))
            where = expr(data.get("where"))
            if isinstance(where, str):
                raise InvalidCounterDefinition("where must be a Fragment")
            keys = tuple(cast(KeyExpr, expr(k)) for k in data["keys"])
            bucket = None
            if data.get("bucket") is not None:
                # recorded with the period's key part added: the spec adds it again
                bucket = Bucket.from_json(data["bucket"])
                keys = keys[:-1]
                assert isinstance(target, NamedTarget)
                target = NamedTarget(target.key_types[:-1])
            return cls(
                name=data["name"],
                source=Table(data["source"]["table"], data["source"]["schema"]),
                target=target,
                keys=keys,
                where=where,
                sum=expr(data.get("sum")),
                mode=data.get("mode", "queued"),
                scale=data.get("scale"),
                via=tuple(Via.from_json(step) for step in data.get("via", ())),
                bucket=bucket,
                reads=tuple(Table(t["table"], t["schema"]) for t in data.get("reads", ())),
            )
        except (KeyError, TypeError) as exc:
            raise InvalidCounterDefinition(f"not a counter spec: {exc}") from None


def _digest(data: dict[str, Any]) -> str:
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# -- generic relations -------------------------------------------------------

CONTENT_TYPE_TABLE = Table("django_content_type")
"""Where Django keeps its content types (``app_label``, ``model`` -> ``id``)."""

# what turns a text object id into the parent's key: its canonical text only
_OBJECT_ID_KEYS: dict[str, str] = {
    "bigint": "pgcounters.object_id_bigint({})",
    "uuid": "pgcounters.object_id_uuid({})",
    "text": "{}",
}


def generic_relation(
    name: str,
    source: Table | str,
    target: Target,
    *,
    content_type: tuple[str, str],
    content_type_column: str = "content_type_id",
    object_id_column: str = "object_id",
    object_id_is_text: bool = False,
    content_type_table: Table | str = CONTENT_TYPE_TABLE,
    where: Fragment | None = None,
    sum: KeyExpr | None = None,
    mode: Mode = "queued",
    scale: int | None = None,
) -> CounterSpec:
    """A spec counting (or summing) the rows of ``source`` attached through a generic
    relation (a content type and an object id, Django's ``GenericForeignKey``) to the
    objects of one model, per object.

    ``content_type`` is the model's ``(app_label, model)``: a row counts when its
    ``content_type_column`` holds the id of that content type, looked up by name in
    ``content_type_table`` by the statement that counts (ids differ between databases;
    none is compiled in). The key is the row's ``object_id_column``; a text object id
    (``object_id_is_text``) keys a ``bigint`` or ``uuid`` target as the ORM's join casts
    it (``'7'``, ``' 7'`` and ``'007'`` are 7); a text that does not cast counts nowhere
    and never stops a write.

    ``target`` is a :class:`ColumnTarget` on the model's table (its key column the
    primary key), or a :class:`NamedTarget` with one key type.
    """
    source_table = Table.of(source)
    types = target.key_types
    if len(types) != 1:
        raise InvalidCounterDefinition(
            f"counter {name}: a generic relation's counter is keyed by the object id alone "
            f"(one key type), got {len(types)}"
        )
    if (
        not isinstance(content_type, tuple)
        or len(content_type) != 2
        or not all(isinstance(p, str) and p for p in content_type)
    ):
        raise InvalidCounterDefinition(
            f"counter {name}: content_type is (app_label, model), got {content_type!r}"
        )
    for value, what in (
        (content_type_column, "content type column"),
        (object_id_column, "object id column"),
    ):
        check_identifier(value, what)
    ct = Table.of(content_type_table)
    column = _fragment_text(pgsql.Identifier(source_table.name, content_type_column))
    # the content type's id, looked up by name by each statement (an InitPlan: once)
    lookup = Fragment(
        pgsql.SQL("{} = (SELECT ct.id FROM {} AS ct WHERE ct.app_label = %s AND ct.model = %s)")
        .format(pgsql.SQL(column), pgsql.SQL(_fragment_text(ct.identifier())))
        .as_string(),
        content_type,
    )
    if where is not None:
        lookup = Fragment(f"({lookup.sql}) AND ({where.sql})", lookup.params + where.params)
    object_id = _fragment_text(pgsql.Identifier(source_table.name, object_id_column))
    key: KeyExpr = object_id_column
    if object_id_is_text:
        if types[0] not in _OBJECT_ID_KEYS:
            raise InvalidCounterDefinition(
                f"counter {name}: a text object id keys a bigint, uuid or text counter, "
                f"not {types[0]}"
            )
        key = Fragment(_OBJECT_ID_KEYS[types[0]].format(object_id))
    return CounterSpec(
        name=name,
        source=source_table,
        target=target,
        keys=(key,),
        where=lookup,
        sum=sum,
        mode=mode,
        scale=scale,
        reads=(ct,),  # the worker's recounts and backfills read it (grant_worker)
    )


def _fragment_text(identifier: pgsql.Identifier) -> str:
    """A quoted identifier as fragment text (a ``%`` in it doubled: not a placeholder)."""
    return identifier.as_string().replace("%", "%%")
