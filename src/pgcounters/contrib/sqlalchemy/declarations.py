"""Counters declared on SQLAlchemy 2 declarative models, and the specs derived from them.

A counted column is an ordinary column of the parent table (a ``bigint``, or a
``numeric(p, s)`` for an exact sum of decimals) whose value the database keeps:
pgcounters' triggers on the related table count every INSERT, UPDATE, DELETE and
TRUNCATE, whatever wrote it (the ORM, a bulk ``insert()``/``update()``/``delete()``,
raw SQL, another program)::

    class Article(Base):
        __tablename__ = "articles"
        id: Mapped[int] = mapped_column(primary_key=True)
        comments: Mapped[list[Comment]] = relationship()
        comment_count: Mapped[int] = counted("comments")
        public_comments: Mapped[int] = counted(
            "comments", filter=lambda c: c.status == "public"
        )
"""

from __future__ import annotations

import datetime
import re
import uuid
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    Engine,
    Float,
    Integer,
    MetaData,
    Numeric,
    Table,
    event,
)
from sqlalchemy.dialects.postgresql.base import PGDialect
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import (
    MappedColumn,
    Mapper,
    configure_mappers,
    mapped_column,
)
from sqlalchemy.orm.interfaces import ONETOMANY
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.util import ClauseAdapter
from sqlalchemy.types import TypeEngine

from pgcounters.client import MODES, Mode
from pgcounters.contrib.sqlalchemy import ddl
from pgcounters.errors import InvalidArgument, InvalidCounterDefinition, ReplicaError
from pgcounters.keys import KeyType
from pgcounters.specs import ColumnTarget, CounterSpec, Fragment
from pgcounters.specs import Table as SpecTable

INFO_KEY = "pgcounters"
"""The key of a counted column's declaration in its ``Column.info``."""
METADATA_KEY = "pgcounters.counters"
"""The key of the counters declared with :func:`declare_counter` in ``MetaData.info``."""

Filter: TypeAlias = Callable[[Any], ColumnElement[bool]] | ColumnElement[bool] | Fragment


@dataclass(eq=False)
class Declaration:
    """What :func:`counted` was given; the spec is derived once the mappers are configured."""

    relationship: str
    sum: str | None
    filter: Filter | None
    mode: Mode
    name: str | None
    decimal_places: int | None
    mapper: Mapper[Any] | None = field(default=None, repr=False)


def counted(
    relationship: str,
    *,
    sum: str | None = None,
    filter: Filter | None = None,
    mode: Mode = "queued",
    name: str | None = None,
    decimal_places: int | None = None,
    max_digits: int = 20,
    **column_options: Any,
) -> MappedColumn[Any]:
    """A counter column: the number of related rows (through ``relationship``, a one-to-many
    relationship of the model) that satisfy ``filter``, or the sum of their ``sum`` attribute.

    * ``filter``: a condition on the related model, as a function of its class
      (``lambda c: c.status == "public"``), an expression over its table's columns, or a
      :class:`~pgcounters.specs.Fragment` of SQL.
    * ``sum``: an integer attribute of the related model; or a ``Numeric`` one, summed
      exactly with ``decimal_places`` (its scale; the column is ``numeric(max_digits,
      decimal_places)``).
    * ``mode``: ``queued`` (default), ``unlogged`` or ``direct`` (applied in the writing
      transaction: read-your-writes, but it locks the counter rows).
    * ``name``: the counter's name (default ``<table>.<column>``).

    The column is ``NOT NULL DEFAULT 0``; the database sets a new row's value to 0 and
    refuses any other change than pgcounters' own. Read it exactly with :func:`exact`.
    """
    if not isinstance(relationship, str) or not relationship:
        raise InvalidCounterDefinition("counted() names a relationship of the model")
    if mode not in MODES:
        raise InvalidCounterDefinition(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if sum is None and decimal_places is not None:
        raise InvalidCounterDefinition("decimal_places is for a sum of decimals; this counts rows")
    declaration = Declaration(relationship, sum, filter, mode, name, decimal_places)
    type_: TypeEngine[Any] = (
        BigInteger() if decimal_places is None else Numeric(max_digits, decimal_places)
    )
    info = dict(column_options.pop("info", {}) or {})
    info[INFO_KEY] = declaration
    column_options.setdefault("nullable", False)
    column_options.setdefault("default", 0)
    column_options.setdefault("server_default", "0")
    return mapped_column(type_, info=info, **column_options)


_MAPPERS: weakref.WeakSet[Mapper[Any]] = weakref.WeakSet()


@event.listens_for(Mapper, "after_mapper_constructed")
def _remember_mapper(mapper: Mapper[Any], class_: type[Any]) -> None:
    """Every mapper, to find the one of a counted column's table (its relationships)."""
    _MAPPERS.add(mapper)


def _mapper_of(column: Column[Any]) -> Mapper[Any] | None:
    """The mapper of the class whose table holds ``column`` (of a single-table inheritance
    tree, its base), once the mappers are configured."""
    configure_mappers()
    for mapper in list(_MAPPERS):
        inherited = mapper.inherits is not None and mapper.inherits.local_table is column.table
        if (
            mapper.local_table is column.table
            and not inherited
            and mapper.columns.contains_column(column)
        ):
            return mapper
    return None


def declaration_of(column: Column[Any]) -> Declaration | None:
    found = column.info.get(INFO_KEY)
    return found if isinstance(found, Declaration) else None


def _table(table: Table) -> SpecTable:
    return SpecTable(table.name, table.schema or "public")


def _key_type(column: Column[Any], what: str) -> KeyType:
    try:
        python = column.type.python_type
    except NotImplementedError:
        python = object
    if issubclass(python, bool):
        python = object
    if issubclass(python, int):
        return "bigint"
    if issubclass(python, uuid.UUID):
        return "uuid"
    if issubclass(python, str):
        return "text"
    if issubclass(python, datetime.date) and not issubclass(python, datetime.datetime):
        return "date"
    raise InvalidCounterDefinition(
        f"{what}: the key column {column.name} is of type {column.type}; a counter column's "
        "parent is keyed by an integer, a UUID, a string or a date"
    )


def fragment(condition: ColumnElement[bool], table: Table) -> Fragment:
    """Compile a condition over one table's columns into an SQL fragment (values as
    parameters), its columns named as the triggers see the table's rows."""
    tables = {c.table for c in _columns(condition)}
    if tables - {table}:
        names = ", ".join(sorted(str(t) for t in tables - {table}))
        raise InvalidCounterDefinition(
            f"the filter on {table.name} may only use its own columns, not those of {names}"
        )
    adapted = ClauseAdapter(table.alias(table.name)).traverse(condition)
    dialect = PGDialect(paramstyle="format")  # type: ignore[no-untyped-call]
    try:
        compiled = adapted.compile(dialect=dialect, compile_kwargs={"render_postcompile": True})
        params = tuple(compiled.params[name] for name in compiled.positiontup or ())
        return Fragment(compiled.string, params)
    except InvalidCounterDefinition:
        raise
    except Exception as exc:
        raise InvalidCounterDefinition(
            f"the filter on {table.name} cannot be compiled: {exc}"
        ) from None


def _columns(expression: ColumnElement[Any]) -> Iterable[Column[Any]]:
    from sqlalchemy.sql.visitors import iterate

    for element in iterate(expression):
        if isinstance(element, Column):
            yield element


def spec_of(column: Column[Any]) -> CounterSpec:
    """The core spec of a counted column (the mappers are configured first)."""
    declaration = declaration_of(column)
    if declaration is None:
        raise InvalidArgument(f"column {column} is not a pgcounters counted() column")
    if declaration.mapper is None:
        declaration.mapper = _mapper_of(column)
    mapper = declaration.mapper
    what = f"{column.table.name}.{column.name}"
    if mapper is None:
        raise InvalidCounterDefinition(f"{what}: counted() is for a column of a mapped class")
    what = f"{mapper.class_.__name__}.{column.key}"
    relationship = mapper.relationships.get(declaration.relationship)
    if relationship is None:
        raise InvalidCounterDefinition(
            f"{what}: {mapper.class_.__name__} has no relationship {declaration.relationship!r}"
        )
    pairs = relationship.local_remote_pairs or []
    if (
        relationship.direction is not ONETOMANY
        or relationship.secondary is not None
        or len(pairs) != 1
    ):
        raise InvalidCounterDefinition(
            f"{what}: {declaration.relationship!r} is not a one-to-many relationship over "
            "one foreign key column"
        )
    parent_key, foreign_key = pairs[0]
    source_mapper = relationship.mapper
    source = source_mapper.local_table
    if (
        not isinstance(source, Table)
        or not isinstance(foreign_key, Column)
        or not isinstance(parent_key, Column)
    ):
        raise InvalidCounterDefinition(f"{what}: the related rows are not of one table")
    where: Fragment | None = None
    if isinstance(declaration.filter, Fragment):
        where = declaration.filter
    elif declaration.filter is not None:
        condition: Any = declaration.filter
        if not isinstance(condition, ColumnElement):
            if not callable(condition):
                raise InvalidCounterDefinition(
                    f"{what}: the filter is a function of the related class giving an SQL "
                    f"condition (lambda c: c.status == 'public'), got {condition!r}"
                )
            condition = condition(source_mapper.class_)
        if hasattr(condition, "__clause_element__"):  # a boolean attribute of the model
            condition = condition.__clause_element__()
        if not isinstance(condition, ColumnElement):
            raise InvalidCounterDefinition(f"{what}: the filter is not an SQL condition")
        where = fragment(condition, source)
    summed, scale = _summed(declaration, source_mapper, what)
    return CounterSpec(
        name=declaration.name or f"{column.table.fullname}.{column.name}",
        source=_table(source),
        keys=(foreign_key.name,),
        target=ColumnTarget(
            _table(column.table), column.name, parent_key.name, _key_type(parent_key, what)
        ),
        where=where,
        sum=summed,
        mode=declaration.mode,
        scale=scale,
    )


def _summed(
    declaration: Declaration, source: Mapper[Any], what: str
) -> tuple[str | None, int | None]:
    if declaration.sum is None:
        return None, None
    prop = source.column_attrs.get(declaration.sum)
    column = prop.columns[0] if prop is not None and prop.columns else None
    if not isinstance(column, Column):
        raise InvalidCounterDefinition(
            f"{what}: {source.class_.__name__} has no column attribute {declaration.sum!r}"
        )
    places = declaration.decimal_places
    if isinstance(column.type, Float):
        raise InvalidCounterDefinition(
            f"{what}: {declaration.sum} is floating-point: its values are not exact, nor is "
            "their sum; sum a Numeric column (with decimal_places) or an integer"
        )
    if isinstance(column.type, Numeric):
        if column.type.scale is None:
            raise InvalidCounterDefinition(
                f"{what}: {declaration.sum} is a Numeric with no scale: give the column its "
                "decimal places (Numeric(precision, scale)) and the counter the same "
                "decimal_places to sum it exactly"
            )
        if places != column.type.scale:
            raise InvalidCounterDefinition(
                f"{what}: {declaration.sum} is a Numeric with {column.type.scale} decimal "
                f"places: sum it exactly with decimal_places={column.type.scale}"
            )
        return column.name, places
    if not isinstance(column.type, Integer):
        raise InvalidCounterDefinition(
            f"{what}: {declaration.sum} is of type {column.type}: a counter sums integers, "
            "or Numeric columns exactly"
        )
    if places is not None:
        raise InvalidCounterDefinition(
            f"{what}: {declaration.sum} is an integer: its sum has no decimal_places"
        )
    return column.name, None


def declare_counter(metadata: MetaData, spec: CounterSpec) -> CounterSpec:
    """Declare any counter spec (a named counter, say) beside the models' counted columns:
    :func:`counter_specs`, :func:`install_counters` and Alembic's autogenerate see it."""
    if not isinstance(spec, CounterSpec):
        raise InvalidArgument(f"expected a CounterSpec, got {spec!r}")
    declared: dict[str, CounterSpec] = metadata.info.setdefault(METADATA_KEY, {})
    if spec.name in declared and declared[spec.name] != spec:
        raise InvalidCounterDefinition(f"counter {spec.name} is declared twice")
    declared[spec.name] = spec
    return spec


def counter_specs(metadata: MetaData | Iterable[MetaData]) -> list[CounterSpec]:
    """Every counter declared on the tables of ``metadata`` (counted columns, and the specs
    given to :func:`declare_counter`), by name."""
    found: dict[str, CounterSpec] = {}
    every = [metadata] if isinstance(metadata, MetaData) else list(metadata)
    for one in every:
        specs = [
            spec_of(column)
            for table in one.tables.values()
            for column in table.columns
            if declaration_of(column) is not None
        ]
        specs += list(one.info.get(METADATA_KEY, {}).values())
        for spec in specs:
            if spec.name in found and found[spec.name] != spec:
                raise InvalidCounterDefinition(f"counter {spec.name} is declared twice")
            found[spec.name] = spec
    return [found[name] for name in sorted(found)]


# -- exact reads ------------------------------------------------------------------


class Exact(ColumnElement[Any]):
    """The exact value of a counted column: stored + pending, in the query's statement."""

    __visit_name__ = "pgcounters_exact"
    inherit_cache = False

    def __init__(self, column: ColumnElement[Any], key: ColumnElement[Any], spec: CounterSpec):
        self.counted_column = column
        self.key_column = key
        self.spec = spec
        self.type = BigInteger() if spec.scale is None else Numeric(38, spec.scale, asdecimal=True)

    @property
    def _from_objects(self) -> list[Any]:
        return [*self.counted_column._from_objects, *self.key_column._from_objects]

    def get_children(self, **kw: Any) -> tuple[ColumnElement[Any], ...]:
        return (self.counted_column, self.key_column)


@compiles(Exact)
def _compile_exact(element: Exact, compiler: SQLCompiler, **kw: Any) -> str:
    text = ddl.exact_sql(element.spec)
    if compiler.dialect.paramstyle in ("format", "pyformat"):
        text = text.replace("%", "%%")
    key = compiler.process(element.key_column, **kw)
    column = compiler.process(element.counted_column, **kw)
    return text.replace(ddl.KEY_SLOT, key).replace(ddl.COLUMN_SLOT, column)


_UNLOGGED_TERM = re.compile(
    re.escape(ddl.UNLOGGED_MARK) + r"([0-9a-f]*)\*/.*?" + re.escape(ddl.UNLOGGED_END), re.DOTALL
)


def for_standby(statement: str) -> str:
    """``statement`` as a hot standby can run it: each exact() without the unlogged queue's
    term (a standby cannot plan a statement naming an unlogged table, and holds no
    unlogged rows). An unlogged counter's exact() raises ReplicaError: its pending deltas
    exist only on the primary."""

    def drop(match: re.Match[str]) -> str:
        if match.group(1):
            name = bytes.fromhex(match.group(1)).decode()
            raise ReplicaError(
                f"counter {name!r} is unlogged: its pending deltas exist only on the primary, "
                "read it there (its stored value is readable here)"
            )
        return "0"

    return _UNLOGGED_TERM.sub(drop, statement)


@event.listens_for(Engine, "before_cursor_execute", retval=True)
def _exact_on_standby(
    conn: Connection,
    cursor: Any,
    statement: str,
    parameters: Any,
    context: Any,
    executemany: bool,
) -> tuple[str, Any]:
    """Every engine's statements: one holding an exact() sent to a hot standby is rewritten
    with :func:`for_standby` (PostgreSQL 14+ reports the standby to the driver: no query)."""
    if ddl.UNLOGGED_MARK in statement:
        driver = conn.connection.driver_connection
        info = getattr(driver, "info", None)
        if info is not None and info.parameter_status("in_hot_standby") == "on":
            statement = for_standby(statement)
    return statement, parameters


def counter_spec(attribute: Any) -> CounterSpec:
    """The core spec of a counted column, from its model attribute (``Article.comment_count``)."""
    prop = getattr(attribute, "property", None)
    columns = getattr(prop, "columns", None)
    column = columns[0] if columns else None
    if not isinstance(column, Column) or declaration_of(column) is None:
        raise InvalidArgument(f"{attribute!r} is not a pgcounters counted() column")
    return spec_of(column)


def exact(attribute: Any) -> ColumnElement[Any]:
    """``select(Article.id, exact(Article.comment_count))``: the exact value of a counted
    column in a query (stored + pending deltas, from the statement's snapshot), for the
    class or an ``aliased()`` one."""
    from sqlalchemy import inspect

    spec = counter_spec(attribute)
    column = attribute.property.columns[0]
    target = spec.target
    assert isinstance(target, ColumnTarget)
    entity = inspect(attribute.parent.entity)
    key_prop = entity.mapper.get_property_by_column(column.table.c[target.key_column])
    key = getattr(attribute.parent.entity, key_prop.key)
    return Exact(attribute.__clause_element__(), key.__clause_element__(), spec)
