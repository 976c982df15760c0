"""The SQL that installs the schema and declared counters, rendered without a database.

The statements come from the core (``schema.script``, the trigger compiler, the named
blocks of ``sql/``), with every value a literal quoted by psycopg. A :class:`Runner`
executes them in the transaction of a SQLAlchemy connection (sync, or async through
``run_sync``), or writes them out (Alembic's offline mode): the same SQL either way.

A counter created or changed here is backfilled in the same transaction, each of its
counter rows locked in key order and set to ``truth - pending`` from one snapshot:
its triggers exist from that point (their ``CREATE TRIGGER`` holds the source table
against writers until the transaction ends), so no row escapes both.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from psycopg import sql
from psycopg.types.json import Jsonb

from pgcounters import schema, sqlfiles
from pgcounters.compiler import (
    ALL_VIA_EVENTS,
    EVENTS,
    GUARD_EVENTS,
    MARKER_RE,
    column_units,
    column_value,
    compile_spec,
    ensure_target_call,
    events_of,
    part_text,
    probe_query,
    rows_delta_sql,
    trigger_name,
    truth_query,
)
from pgcounters.errors import InvalidArgument, InvalidCounterDefinition
from pgcounters.specs import ColumnTarget, CounterSpec
from pgcounters.triggers import changed_target_params

_PARAM = re.compile(r"%\((\w+)\)s|%s|%%")


class Runner(Protocol):
    """Where statements go: a database connection's transaction, or a script."""

    @property
    def online(self) -> bool:
        """True when connected (reads are possible), False when writing a script."""
        ...

    def execute(self, statement: str) -> None: ...

    def fetchall(self, statement: str) -> list[tuple[Any, ...]]: ...


class ConnectionRunner:
    """Statements run on the DBAPI connection under a SQLAlchemy connection, in the
    transaction that connection is in (begun if it is not)."""

    online = True

    def __init__(self, connection: Any) -> None:
        if not connection.in_transaction():
            connection.begin()
        self._dbapi = connection.connection.dbapi_connection

    def execute(self, statement: str) -> None:
        cursor = self._dbapi.cursor()
        try:
            cursor.execute(statement)
        finally:
            cursor.close()

    def fetchall(self, statement: str) -> list[tuple[Any, ...]]:
        cursor = self._dbapi.cursor()
        try:
            cursor.execute(statement)
            return [tuple(row) for row in cursor.fetchall()]
        finally:
            cursor.close()


def _block(name: str) -> str:
    return sqlfiles.named("sqlalchemy.sql")[name]


def _text(composable: sql.Composable) -> str:
    return composable.as_string(None)


def render(statement: str, params: Mapping[str, Any] | Sequence[Any] = ()) -> str:
    """A statement of the package's ``%s`` / ``%(name)s`` style with its values as literals."""
    values = iter(params) if not isinstance(params, Mapping) else None

    def literal(match: re.Match[str]) -> str:
        if match.group() == "%%":
            return "%"
        value = params[match.group(1)] if isinstance(params, Mapping) else next(values)  # type: ignore[arg-type]
        return _text(sql.Literal(value))

    return _PARAM.sub(literal, statement)


# -- the schema -----------------------------------------------------------------


def installed_version(runner: Runner) -> int | None:
    """The installed schema version (None: not installed), read through the runner."""
    rows = runner.fetchall(sqlfiles.query("schema_exists"))
    if not rows or not rows[0][0]:
        return None
    rows = runner.fetchall(sqlfiles.query("installed_version"))
    return int(rows[0][0]) if rows and rows[0][0] is not None else None


def schema_script(installed: int | None) -> str | None:
    """The script that brings a schema at ``installed`` to the package's version, without
    ``BEGIN``/``COMMIT`` (it runs in the caller's transaction); None when it is current."""
    latest = sqlfiles.latest_version()
    if installed is not None and installed >= latest:
        return None
    return schema.script(installed, transaction=False)


# -- declared counters ------------------------------------------------------------


def _target(spec: CounterSpec) -> sql.Composable:
    return sql.SQL(_block("target_of")).format(name=sql.Literal(spec.name))


def _pending(spec: CounterSpec) -> sql.Composable:
    return sql.SQL(sqlfiles.named("recount.sql")["pending"]).format(target=_target(spec))


def create_statements(
    spec: CounterSpec, *, backfill: bool = True, changed: bool = False
) -> list[str]:
    """Declare the counter's target, create (or replace) its triggers, record its spec,
    follow its table's partitions, and (``backfill``) count the rows already there.
    ``changed``: a declared counter's new definition (its old counter goes when its key
    or target changed)."""
    statements = [
        # a recorded declaration whose key or target changed: its old counter goes (the
        # backfill counts it again), as triggers.install and Django's migrate do
        render(
            sqlfiles.query("drop_changed_target"), changed_target_params(spec, declared=changed)
        ),
        _text(sql.SQL(sqlfiles.query("select_call")).format(call=ensure_target_call(spec))),
        _text(compile_spec(spec).install_sql()).rstrip().rstrip(";"),
        render(
            sqlfiles.query("record_spec"),
            {
                "name": spec.name,
                "fingerprint": spec.fingerprint,
                "definition": Jsonb(spec.to_json()),
                "probe": _text(probe_query(spec)),
                "rows_delta": rows_delta_sql(spec, None),  # type: ignore[arg-type]
            },
        ),
        render(sqlfiles.query("follow_descendants"), {"name": spec.name, "apply": True}),
        sqlfiles.query("refresh_target_ids").rstrip().rstrip(";"),
    ]
    if backfill:
        statements += backfill_statements(spec)
    return statements


def backfill_statements(spec: CounterSpec) -> list[str]:
    """Count the rows already in the source table into the counter, in one transaction."""
    truth = truth_query(spec)
    cancel = render(sqlfiles.named("recount.sql")["backfill_cancel"], (spec.name,))
    if isinstance(spec.target, ColumnTarget):
        t = spec.target
        k, p = sql.Identifier(t.key_column), t.table.identifier()
        key_text = sql.SQL("ARRAY[{}]").format(part_text(sql.SQL("x.{}").format(k), t.key_type))
        return [
            sqlfiles.query("applying_on"),
            _text(sql.SQL(_block("lock_all_parent_rows")).format(p=p, k=k)),
            _text(
                sql.SQL(_block("backfill_column")).format(
                    truth=truth,
                    pending=_pending(spec),
                    text_key=key_text,
                    k=k,
                    c=sql.Identifier(t.column),
                    p=p,
                    value=column_value(spec, sql.SQL("w.value")),
                )
            ),
            sqlfiles.query("applying_off"),
            cancel,
        ]
    parts = {"t": _target(spec), "truth": truth, "pending": _pending(spec)}
    return [
        _text(sql.SQL(_block("backfill_named_rows")).format(**parts)),
        _text(sql.SQL(_block("lock_named_rows")).format(t=parts["t"])),
        _text(sql.SQL(_block("backfill_named")).format(**parts)),
        cancel,
    ]


def drop_statements(
    name: str, previous: CounterSpec | None, found: Iterable[tuple[str, str, str]] = ()
) -> list[str]:
    """Remove a counter's triggers and functions and forget its spec (its values stay).

    ``previous`` (the definition being dropped) names the triggers on its tables;
    ``found`` adds the ``(schema, table, trigger)`` of triggers read from the catalog
    (a followed partition's). Without either, nothing says where its triggers are.
    """
    statements: list[str] = []
    if previous is not None:
        if previous.name != name:
            raise InvalidArgument(f"the previous definition is of {previous.name}, not {name}")
        statements.append(_text(compile_spec(previous).uninstall_sql()).rstrip().rstrip(";"))
    drop_trigger = sqlfiles.query("drop_trigger_if_exists")
    for schema_name, table, trigger in found:
        statements.append(
            _text(
                sql.SQL(drop_trigger).format(
                    trigger=sql.Identifier(trigger), table=sql.Identifier(schema_name, table)
                )
            )
        )
    if previous is None and not statements:
        raise InvalidArgument(
            f"dropping counter {name} without a database connection needs its previous "
            "definition (previous=...): it says which tables its triggers are on"
        )
    for event in EVENTS + GUARD_EVENTS + ALL_VIA_EVENTS:  # a path's tables' triggers too
        statements.append(
            _text(
                sql.SQL(sqlfiles.query("drop_trigger_function")).format(
                    function=sql.Identifier("pgcounters", trigger_name(name, event))
                )
            )
        )
    statements += [
        render(sqlfiles.query("forget_spec"), {"name": name}),
        render(sqlfiles.named("recount.sql")["backfill_cancel"], (name,)),
        # the watch of replica-mode writes leaves a table no counter reads any more
        render(sqlfiles.query("follow_descendants"), {"name": None, "apply": True}),
    ]
    return statements


def drop_values_statement(name: str) -> str:
    """Forget a counter itself: its declaration, stored values and pending deltas."""
    return render(sqlfiles.query("drop_counter"), {"name": name})


def validate(runner: Runner, spec: CounterSpec) -> None:
    """Check against the database that the spec's SQL compiles (as ``triggers.validate``)."""
    try:
        runner.execute(
            _text(sql.SQL(sqlfiles.query("explain")).format(statement=probe_query(spec)))
        )
    except Exception as exc:
        message = getattr(getattr(exc, "diag", None), "message_primary", None) or str(exc)
        raise InvalidCounterDefinition(
            f"counter {spec.name}: its definition does not compile against table "
            f"{spec.source}: {message}"
        ) from exc


def recorded(runner: Runner) -> dict[str, CounterSpec]:
    """The specs recorded in the database, by name."""
    import json

    out: dict[str, CounterSpec] = {}
    for (definition,) in runner.fetchall(sqlfiles.query("declared_specs")):
        data = json.loads(definition) if isinstance(definition, str) else definition
        spec = CounterSpec.from_json(data)
        out[spec.name] = spec
    return out


InstalledTrigger = tuple[str, str, str, str, str, bool, bool]


def triggers_of(runner: Runner) -> dict[str, list[InstalledTrigger]]:
    """The installed counter triggers by counter name: (schema, table, trigger, event,
    fingerprint, follower, enabled)."""
    out: dict[str, list[InstalledTrigger]] = {}
    for nsp, table, trigger, enabled, source, follower in runner.fetchall(
        sqlfiles.query("counter_triggers")
    ):
        match = MARKER_RE.search(source)
        if match is not None:
            out.setdefault(match["name"], []).append(
                (
                    nsp,
                    table,
                    trigger,
                    match["event"],
                    match["fingerprint"],
                    bool(follower),
                    bool(enabled),
                )
            )
    return out


def state(
    spec: CounterSpec,
    recorded_spec: CounterSpec | None,
    triggers: Sequence[InstalledTrigger],
) -> str:
    """``installed``, ``missing`` (never recorded, or triggers absent) or ``outdated``
    (recorded with another definition, or triggers of another one). A counter whose
    triggers were disabled (``ALTER TABLE ... DISABLE TRIGGER``) is not installed either:
    rows written meanwhile went uncounted, and installing it again counts them."""
    own = [t for t in triggers if not t[5] and t[6]]
    if recorded_spec is None and not own:
        return "missing"
    if recorded_spec is not None and recorded_spec.fingerprint != spec.fingerprint:
        return "outdated"
    if any(t[4] != spec.fingerprint for t in own):
        return "outdated"
    if {t[3] for t in own} != set(events_of(spec)):
        return "missing" if recorded_spec is None else "outdated"
    return "installed"


KEY_SLOT = "\x00key\x00"
COLUMN_SLOT = "\x00column\x00"
# Around the unlogged queue's term of exact(): a hot standby cannot plan a statement
# naming an unlogged table (and holds no unlogged rows), so the statement sent to one
# has the term replaced by 0 (see declarations.for_standby); the counter's name (in hex:
# a name may hold "/", and comments nest) follows the opening mark when the counter
# itself is unlogged, read on the primary only.
UNLOGGED_MARK = "/*pgcounters:unlogged-queue "
UNLOGGED_END = "/*pgcounters:end*/"


def exact_sql(spec: CounterSpec) -> str:
    """The SQL of ``exact()`` for a counter column, with :data:`KEY_SLOT` and
    :data:`COLUMN_SLOT` where SQLAlchemy's compiled key and counter columns go."""
    from pgcounters.repair import _key_expr

    assert isinstance(spec.target, ColumnTarget)
    t = spec.target
    key, column = sql.SQL(KEY_SLOT), sql.SQL(COLUMN_SLOT)
    key_text = sql.SQL("ARRAY[{}]").format(part_text(sql.SQL("({})").format(key), t.key_type))
    pending = [
        sql.SQL(_block("exact_pending")).format(
            queue=sql.Identifier(queue), target=_target(spec), key_text=key_text
        )
        for queue in ("queue", "queue_unlogged")
    ]
    truth = truth_query(spec, sql.SQL("{} = {}").format(_key_expr(spec), key))
    units = sql.SQL(_block("exact_units")).format(
        name=sql.Literal(spec.name),
        key=key,
        key_type=sql.SQL(t.key_type),
        stored=column_units(spec, sql.SQL("coalesce({}, 0)").format(column)),
        pending=pending[0],
        pending_unlogged=sql.SQL("{}{}*/ {} {}").format(
            sql.SQL(UNLOGGED_MARK),
            sql.SQL(spec.name.encode().hex() if spec.mode == "unlogged" else ""),
            pending[1],
            sql.SQL(UNLOGGED_END),
        ),
        truth=truth,
    )
    if spec.scale is None:  # sum() of bigints is a numeric: an integer counter reads as one
        return _text(sql.SQL("(({})::bigint)").format(units))
    return _text(sql.SQL("({})").format(column_value(spec, units)))
