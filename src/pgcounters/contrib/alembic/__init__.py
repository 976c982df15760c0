"""Alembic operations for pgcounters, registered with Alembic's operation plugin API.

Importing this module (in ``env.py``) adds to ``op``:

* ``op.install_pgcounters(from_version=None)``: install the schema, or upgrade it;
* ``op.create_counter(definition)``: install a declared counter (its triggers and
  spec), then count the rows already in its table;
* ``op.change_counter(definition, previous=...)``: replace a counter's definition, and
  count its rows again;
* ``op.drop_counter(name, previous=..., drop_values=False)``: remove its triggers.

Each runs in the migration's own transaction (no autocommit block): a migration that
fails half-way leaves nothing. In offline mode (``alembic upgrade --sql``) each writes
its SQL instead. ``definition`` is the counter's spec as data
(:meth:`~pgcounters.specs.CounterSpec.to_json`), written into the migration file, so an
old migration keeps meaning what it meant whatever the models say today.

Autogenerate compares the counters declared on ``target_metadata``
(:func:`pgcounters.contrib.sqlalchemy.counter_specs`) with the database and writes
these operations for a counter whose triggers are missing or outdated, and for one that
is installed over the metadata's tables but no longer declared.
"""

from __future__ import annotations

import pprint
from collections.abc import Iterable
from typing import Any

from alembic.autogenerate import comparators, renderers
from alembic.autogenerate.api import AutogenContext
from alembic.operations import MigrateOperation, Operations
from alembic.operations.ops import UpgradeOps
from alembic.util import DispatchPriority
from sqlalchemy import MetaData

from pgcounters import sqlfiles
from pgcounters.contrib.sqlalchemy import ddl
from pgcounters.contrib.sqlalchemy.declarations import counter_specs
from pgcounters.errors import InvalidArgument, SchemaNotInstalled, SchemaVersionMismatch
from pgcounters.specs import ColumnTarget, CounterSpec

__all__ = [
    "ChangeCounterOp",
    "CreateCounterOp",
    "DropCounterOp",
    "InstallSchemaOp",
    "SchemaStaysOp",
]

_IMPORT = "import pgcounters.contrib.alembic  # noqa: F401"


class ScriptRunner:
    """Statements written to Alembic's output (offline mode): nothing is read."""

    online = False

    def __init__(self, operations: Operations) -> None:
        self._impl = operations.migration_context.impl

    def execute(self, statement: str) -> None:
        text = statement.strip()
        self._impl.static_output(text if text.endswith(";") else text + ";")

    def fetchall(self, statement: str) -> list[tuple[Any, ...]]:  # pragma: no cover
        raise InvalidArgument("nothing can be read from the database in offline mode")


def _runner(operations: Operations) -> ddl.Runner:
    if operations.migration_context.as_sql:
        return ScriptRunner(operations)
    return ddl.ConnectionRunner(operations.get_bind())


def _spec(definition: CounterSpec | dict[str, Any]) -> CounterSpec:
    if isinstance(definition, CounterSpec):
        return definition
    if not isinstance(definition, dict):
        raise InvalidArgument(
            f"a counter definition is a dict (its spec as data), got {definition!r}"
        )
    return CounterSpec.from_json(definition)


def _check_schema(runner: ddl.Runner) -> None:
    if not runner.online:
        return
    found = ddl.installed_version(runner)
    if found is None:
        raise SchemaNotInstalled(
            "the pgcounters schema is not installed: op.install_pgcounters() first"
        )
    if found != sqlfiles.latest_version():
        raise SchemaVersionMismatch(
            f"the pgcounters schema is at version {found}, this code needs "
            f"{sqlfiles.latest_version()}: op.install_pgcounters() upgrades it"
        )


# -- the schema ---------------------------------------------------------------------


@Operations.register_operation("install_pgcounters")
class InstallSchemaOp(MigrateOperation):
    """Install the pgcounters schema, or upgrade it to this package's version.

    Online it reads the installed version and does what is needed (nothing when it is
    current). Offline it writes the install script, or with ``from_version`` the upgrade
    script from that version; either refuses, raising an error, a database it was not
    written for.
    """

    def __init__(self, from_version: int | None = None) -> None:
        self.from_version = from_version

    @classmethod
    def install_pgcounters(cls, operations: Operations, from_version: int | None = None) -> None:
        operations.invoke(cls(from_version))

    def reverse(self) -> MigrateOperation:
        return SchemaStaysOp()

    def to_diff_tuple(self) -> tuple[Any, ...]:
        return ("install_pgcounters", self.from_version)


@Operations.register_operation("pgcounters_schema_stays")
class SchemaStaysOp(MigrateOperation):
    """The downgrade of an install: the schema stays (it holds every counter's values)."""

    @classmethod
    def pgcounters_schema_stays(cls, operations: Operations) -> None:
        operations.invoke(cls())

    def reverse(self) -> MigrateOperation:
        return InstallSchemaOp()

    def to_diff_tuple(self) -> tuple[Any, ...]:
        return ("pgcounters_schema_stays",)


@Operations.implementation_for(InstallSchemaOp)
def _install(operations: Operations, operation: InstallSchemaOp) -> None:
    runner = _runner(operations)
    found = ddl.installed_version(runner) if runner.online else operation.from_version
    script = ddl.schema_script(found)
    if script is not None:
        runner.execute(script)


@Operations.implementation_for(SchemaStaysOp)
def _stays(operations: Operations, operation: SchemaStaysOp) -> None:
    return None


# -- declared counters ----------------------------------------------------------------


@Operations.register_operation("create_counter")
class CreateCounterOp(MigrateOperation):
    """Install a declared counter and count the rows already in its table."""

    def __init__(self, definition: dict[str, Any], *, backfill: bool = True) -> None:
        self.spec = _spec(definition)
        self.backfill = backfill

    @classmethod
    def create_counter(
        cls,
        operations: Operations,
        definition: CounterSpec | dict[str, Any],
        *,
        backfill: bool = True,
    ) -> None:
        operations.invoke(cls(_spec(definition).to_json(), backfill=backfill))

    def reverse(self) -> MigrateOperation:
        return DropCounterOp(self.spec.name, previous=self.spec.to_json())

    def to_diff_tuple(self) -> tuple[Any, ...]:
        return ("create_counter", self.spec.name)


@Operations.register_operation("change_counter")
class ChangeCounterOp(MigrateOperation):
    """Give an installed counter another definition and count its rows again."""

    def __init__(
        self, definition: dict[str, Any], *, previous: dict[str, Any], backfill: bool = True
    ) -> None:
        self.spec = _spec(definition)
        self.previous = _spec(previous)
        if self.previous.name != self.spec.name:
            raise InvalidArgument(
                f"change_counter: the previous definition is of {self.previous.name}, "
                f"not {self.spec.name}"
            )
        self.backfill = backfill

    @classmethod
    def change_counter(
        cls,
        operations: Operations,
        definition: CounterSpec | dict[str, Any],
        *,
        previous: CounterSpec | dict[str, Any],
        backfill: bool = True,
    ) -> None:
        operations.invoke(
            cls(_spec(definition).to_json(), previous=_spec(previous).to_json(), backfill=backfill)
        )

    def reverse(self) -> MigrateOperation:
        return ChangeCounterOp(self.previous.to_json(), previous=self.spec.to_json())

    def to_diff_tuple(self) -> tuple[Any, ...]:
        return ("change_counter", self.spec.name)


@Operations.register_operation("drop_counter")
class DropCounterOp(MigrateOperation):
    """Remove a counter's triggers and recorded spec; with ``drop_values`` the counter
    itself too (its stored values and pending deltas)."""

    def __init__(
        self,
        name: str,
        *,
        previous: dict[str, Any] | None = None,
        drop_values: bool = False,
    ) -> None:
        self.name = name
        self.previous = None if previous is None else _spec(previous)
        self.drop_values = drop_values

    @classmethod
    def drop_counter(
        cls,
        operations: Operations,
        name: str,
        *,
        previous: CounterSpec | dict[str, Any] | None = None,
        drop_values: bool = False,
    ) -> None:
        operations.invoke(
            cls(
                name,
                previous=None if previous is None else _spec(previous).to_json(),
                drop_values=drop_values,
            )
        )

    def reverse(self) -> MigrateOperation:
        if self.previous is None:
            raise InvalidArgument(
                f"drop_counter({self.name!r}) cannot be reversed without its previous definition"
            )
        return CreateCounterOp(self.previous.to_json())

    def to_diff_tuple(self) -> tuple[Any, ...]:
        return ("drop_counter", self.name)


@Operations.implementation_for(CreateCounterOp)
def _create(operations: Operations, operation: CreateCounterOp) -> None:
    runner = _runner(operations)
    _check_schema(runner)
    if runner.online:
        ddl.validate(runner, operation.spec)
    for statement in ddl.create_statements(operation.spec, backfill=operation.backfill):
        runner.execute(statement)


@Operations.implementation_for(ChangeCounterOp)
def _change(operations: Operations, operation: ChangeCounterOp) -> None:
    runner = _runner(operations)
    _check_schema(runner)
    if runner.online:
        ddl.validate(runner, operation.spec)
    for statement in ddl.drop_statements(operation.spec.name, operation.previous):
        runner.execute(statement)
    for statement in ddl.create_statements(
        operation.spec, backfill=operation.backfill, changed=True
    ):
        runner.execute(statement)


@Operations.implementation_for(DropCounterOp)
def _drop(operations: Operations, operation: DropCounterOp) -> None:
    runner = _runner(operations)
    found: list[tuple[str, str, str]] = []
    if runner.online:
        _check_schema(runner)
        found = [t[:3] for t in ddl.triggers_of(runner).get(operation.name, [])]
    for statement in ddl.drop_statements(operation.name, operation.previous, found):
        runner.execute(statement)
    if operation.drop_values:
        runner.execute(ddl.drop_values_statement(operation.name))


# -- autogenerate ---------------------------------------------------------------------


def _metadatas(metadata: MetaData | Iterable[MetaData] | None) -> list[MetaData]:
    if metadata is None:
        return []
    return [metadata] if isinstance(metadata, MetaData) else list(metadata)


def _tables_of(spec: CounterSpec) -> set[tuple[str, str]]:
    tables = {(spec.source.schema, spec.source.name)}
    if isinstance(spec.target, ColumnTarget):
        tables.add((spec.target.table.schema, spec.target.table.name))
    return tables


@comparators.dispatch_for("schema", priority=DispatchPriority.LAST)
def _compare_counters(
    autogen_context: AutogenContext, upgrade_ops: UpgradeOps, schemas: Any
) -> None:
    """Counters declared on the metadata against the database: the operations that
    bring the database to the declarations (after the tables' own)."""
    metadatas = _metadatas(autogen_context.metadata)
    connection = autogen_context.connection
    if not metadatas or connection is None:
        return
    specs = counter_specs(metadatas)
    tables = {(t.schema or "public", t.name) for m in metadatas for t in m.tables.values()}
    runner = ddl.ConnectionRunner(connection)
    version = ddl.installed_version(runner)
    if not specs and version is None:
        return
    if version is None or version < sqlfiles.latest_version():
        upgrade_ops.ops.append(InstallSchemaOp(version))
    recorded = {} if version is None else ddl.recorded(runner)
    triggers = {} if version is None else ddl.triggers_of(runner)
    for spec in specs:
        before = recorded.get(spec.name)
        state = ddl.state(spec, before, triggers.get(spec.name, []))
        if state == "missing" or (state == "outdated" and before is None):
            upgrade_ops.ops.append(CreateCounterOp(spec.to_json()))
        elif state == "outdated" and before is not None:
            upgrade_ops.ops.append(ChangeCounterOp(spec.to_json(), previous=before.to_json()))
    declared = {spec.name for spec in specs}
    for name, before in sorted(recorded.items()):
        if name not in declared and _tables_of(before) & tables:
            upgrade_ops.ops.append(DropCounterOp(name, previous=before.to_json()))


def _data(definition: dict[str, Any]) -> str:
    return pprint.pformat(definition, width=88, sort_dicts=False)


@renderers.dispatch_for(InstallSchemaOp)
def _render_install(autogen_context: AutogenContext, op: InstallSchemaOp) -> str:
    autogen_context.imports.add(_IMPORT)
    if op.from_version is None:
        return "op.install_pgcounters()"
    return f"op.install_pgcounters(from_version={int(op.from_version)})"


@renderers.dispatch_for(SchemaStaysOp)
def _render_stays(autogen_context: AutogenContext, op: SchemaStaysOp) -> str:
    autogen_context.imports.add(_IMPORT)
    return "op.pgcounters_schema_stays()  # it holds the counters' values"


@renderers.dispatch_for(CreateCounterOp)
def _render_create(autogen_context: AutogenContext, op: CreateCounterOp) -> str:
    autogen_context.imports.add(_IMPORT)
    extra = "" if op.backfill else ", backfill=False"
    return f"op.create_counter(\n    {_data(op.spec.to_json())}{extra}\n)"


@renderers.dispatch_for(ChangeCounterOp)
def _render_change(autogen_context: AutogenContext, op: ChangeCounterOp) -> str:
    autogen_context.imports.add(_IMPORT)
    return (
        f"op.change_counter(\n    {_data(op.spec.to_json())},\n"
        f"    previous={_data(op.previous.to_json())},\n)"
    )


@renderers.dispatch_for(DropCounterOp)
def _render_drop(autogen_context: AutogenContext, op: DropCounterOp) -> str:
    autogen_context.imports.add(_IMPORT)
    previous = "" if op.previous is None else f",\n    previous={_data(op.previous.to_json())}"
    values = ",\n    drop_values=True" if op.drop_values else ""
    return f"op.drop_counter(\n    {op.name!r}{previous}{values},\n)"
