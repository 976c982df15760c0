"""The trigger compiler: counter specs in, trigger SQL out, no database needed.

For each spec it emits four statement-level AFTER triggers on the source table:

* INSERT (``REFERENCING NEW TABLE``): +contribution of each new row, one delta
  per key for the whole statement;
* UPDATE (``OLD TABLE`` and ``NEW TABLE``): -contribution of the old rows,
  +contribution of the new rows, netted per key: condition
  flips, moves to another parent, changed summed values and NULL keys all
  follow from this one rule, and a key whose net change is zero gets no delta;
* DELETE (``OLD TABLE``): -contribution of each deleted row;
* TRUNCATE: every count from the table is zero: pending deltas of the counter
  are dropped and its stored values set to zero (``pgcounters.reset_target``).

A row contributes 1 (or its summed value) to the key formed by its key
columns if it satisfies the condition and no key part is NULL. In ``queued``
and ``unlogged`` mode the deltas are INSERTed into a queue (no lock on a
counter row); in ``direct`` mode they are applied at once, in key order.

Every function body starts with a marker line carrying the spec's name and
fingerprint, so installed-vs-declared drift is detectable from the catalog
whatever delivered the trigger.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, TypeAlias

from psycopg import sql
from psycopg.abc import AdaptContext

from pgcounters.specs import ColumnTarget, CounterSpec, Fragment, KeyExpr, Table

Event: TypeAlias = Literal[
    "insert",
    "update",
    "delete",
    "truncate",
    "guard_update",
    "guard_insert",
    "guard_key",
    "via1_insert",
    "via1_update",
    "via1_delete",
    "via1_truncate",
    "via1_key",
    "via2_insert",
    "via2_update",
    "via2_delete",
    "via2_truncate",
    "via2_key",
    "via3_insert",
    "via3_update",
    "via3_delete",
    "via3_truncate",
    "via3_key",
]
EVENTS: tuple[Event, ...] = ("insert", "update", "delete", "truncate")
# the row triggers that keep a counter column to pgcounters' writers (on the target table),
# and the one that starts it again when the row's key changes
GUARD_EVENTS: tuple[Event, ...] = ("guard_update", "guard_insert", "guard_key")
# the triggers of a path's tables (step 1, 2, 3 of ``CounterSpec.via``); ``key``: the
# BEFORE UPDATE row trigger of a change of the step's key
VIA_EVENTS: tuple[tuple[Event, ...], ...] = (
    ("via1_insert", "via1_update", "via1_delete", "via1_truncate", "via1_key"),
    ("via2_insert", "via2_update", "via2_delete", "via2_truncate", "via2_key"),
    ("via3_insert", "via3_update", "via3_delete", "via3_truncate", "via3_key"),
)
ALL_VIA_EVENTS: tuple[Event, ...] = tuple(e for step in VIA_EVENTS for e in step)
_SUFFIX: dict[Event, str] = {
    "insert": "ins",
    "update": "upd",
    "delete": "del",
    "truncate": "trn",
    "guard_update": "gup",
    "guard_insert": "gin",
    "guard_key": "key",  # after "gup": the guard of the same counter sees the value unchanged
    **{e: f"v{e[3]}{e[5]}" for e in ALL_VIA_EVENTS},
}
APPLYING = "pgcounters.applying"
"""The transaction-local setting pgcounters' writers turn on around their UPDATE of a column."""
OLD_TABLE = "pgc_old"
NEW_TABLE = "pgc_new"
MARKER_RE = re.compile(
    r"-- pgcounters spec fingerprint=(?P<fingerprint>\w+) event=(?P<event>\w+) name=(?P<name>\S+)"
)


@dataclass(frozen=True)
class CompiledTrigger:
    """One trigger of a spec: its name, event, transition tables and PL/pgSQL body."""

    spec_name: str
    event: Event
    name: str
    declare: tuple[tuple[str, str], ...]
    body: str
    # the table the trigger is on (None: the spec's source table)
    table: Table | None = None
    # a guard: a BEFORE ... FOR EACH ROW trigger of the counter column, with a WHEN condition
    column: str | None = None
    condition: str | None = None
    # a BEFORE ... FOR EACH ROW trigger that is not a guard (a path table's DELETE, a change
    # of its key)
    row: bool = False

    @property
    def is_guard(self) -> bool:
        return self.column is not None

    @property
    def is_row(self) -> bool:
        """A BEFORE ... FOR EACH ROW trigger (a guard, or a path table's DELETE)."""
        return self.is_guard or self.row

    @property
    def operation(self) -> str:
        """The trigger's event as SQL: ``INSERT``, ``UPDATE OF "col"``, ..."""
        if self.event == "guard_insert":
            return "INSERT"
        if self.event == "guard_update":
            assert self.column is not None
            return "UPDATE OF " + _quote(self.column)
        return self.base_event.upper()

    @property
    def base_event(self) -> str:
        """``insert``, ``update``, ``delete`` or ``truncate`` (a path table's too; a change
        of a key is an ``update``)."""
        if self.event == "guard_key":
            return "update"
        if self.event in ALL_VIA_EVENTS:
            base = self.event.partition("_")[2]
            return "update" if base == "key" else base
        return self.event

    @property
    def old_table(self) -> str | None:
        if self.is_row:
            return None
        return OLD_TABLE if self.base_event in ("update", "delete") else None

    @property
    def new_table(self) -> str | None:
        if self.is_row:
            return None
        return NEW_TABLE if self.base_event in ("insert", "update") else None

    def function_source(self) -> str:
        """The complete PL/pgSQL source: DECLARE ... BEGIN body END."""
        declare = "".join(f"    {name} {type_};\n" for name, type_ in self.declare)
        return (f"DECLARE\n{declare}" if declare else "") + f"BEGIN\n{self.body}END;\n"


@dataclass(frozen=True)
class CompiledSpec:
    """Everything the database needs for one spec."""

    spec: CounterSpec
    triggers: tuple[CompiledTrigger, ...]

    @property
    def fingerprint(self) -> str:
        return self.spec.fingerprint

    def install_sql(self) -> sql.Composed:
        """CREATE OR REPLACE the functions and triggers (PostgreSQL 14+); safe to re-run."""
        statements: list[sql.Composable] = []
        for trigger in self.triggers:
            source = (trigger.table or self.spec.source).identifier()
            function = sql.Identifier("pgcounters", trigger.name)
            referencing: list[sql.Composable] = []
            if trigger.old_table:
                referencing.append(sql.SQL("OLD TABLE AS {}").format(sql.Identifier(OLD_TABLE)))
            if trigger.new_table:
                referencing.append(sql.SQL("NEW TABLE AS {}").format(sql.Identifier(NEW_TABLE)))
            statements += [
                sql.SQL(
                    "CREATE OR REPLACE FUNCTION {}() RETURNS trigger LANGUAGE plpgsql AS {}"
                ).format(function, sql.Literal(trigger.function_source())),
                sql.SQL(
                    "CREATE OR REPLACE TRIGGER {} {} {} ON {} {} FOR EACH {} {}"
                    "EXECUTE FUNCTION {}()"
                ).format(
                    sql.Identifier(trigger.name),
                    sql.SQL("BEFORE" if trigger.is_row else "AFTER"),
                    sql.SQL(trigger.operation),
                    source,
                    sql.SQL("REFERENCING ") + sql.SQL(" ").join(referencing)
                    if referencing
                    else sql.SQL(""),
                    sql.SQL("ROW" if trigger.is_row else "STATEMENT"),
                    sql.SQL(f"WHEN ({trigger.condition}) " if trigger.condition else ""),
                    function,
                ),
                sql.SQL("COMMENT ON TRIGGER {} ON {} IS {}").format(
                    sql.Identifier(trigger.name),
                    source,
                    sql.Literal(f"pgcounters {self.spec.name} {self.fingerprint}"),
                ),
            ]
        return sql.SQL(";\n").join(statements) + sql.SQL(";\n")

    def uninstall_sql(self) -> sql.Composed:
        """DROP the triggers and their functions (IF EXISTS)."""
        statements: list[sql.Composable] = []
        for trigger in self.triggers:
            statements += [
                sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(
                    sql.Identifier(trigger.name), (trigger.table or self.spec.source).identifier()
                ),
                sql.SQL("DROP FUNCTION IF EXISTS {}()").format(
                    sql.Identifier("pgcounters", trigger.name)
                ),
            ]
        return sql.SQL(";\n").join(statements) + sql.SQL(";\n")


def trigger_name(spec_name: str, event: Event) -> str:
    """A deterministic trigger name of at most 45 characters (fits django-pgtrigger too)."""
    slug = re.sub(r"[^a-z0-9]+", "_", spec_name.lower()).strip("_")[:30]
    digest = hashlib.sha256(spec_name.encode()).hexdigest()[:6]
    return f"pgc_{slug}_{digest}_{_SUFFIX[event]}"


def _quote(identifier: str) -> str:
    """An identifier quoted as PostgreSQL quotes it (for trigger conditions and events)."""
    return '"' + identifier.replace('"', '""') + '"'


# -- pieces ------------------------------------------------------------------


def _expr(value: KeyExpr) -> sql.Composable:
    if isinstance(value, Fragment):
        return sql.SQL("({})").format(value.composed())
    return sql.Identifier(value)


def _key_parts(spec: CounterSpec) -> list[sql.Composable]:
    """Each key expression cast to its key type (one of KEY_TYPES, checked by the spec).

    Rows are grouped by these, and the key's text is made from them: values equal
    in the key type give one key with one canonical text (a timestamp column
    keying a date, numeric 1.0 and 1.00 keying a bigint), as the client encodes it.
    """
    if spec.via:  # a column named is one of the path's last table
        return [
            key_part(_path_expr(spec, k, len(spec.via)), t)
            for k, t in zip(spec.keys, spec.key_types, strict=True)
        ]
    return [key_part(_expr(k), t) for k, t in zip(spec.keys, spec.key_types, strict=True)]


def typed_key_part(spec: CounterSpec, index: int = 0) -> sql.Composable:
    """Key expression ``index`` of a spec in its key type, as the triggers compute it."""
    return _key_parts(spec)[index]


def key_part(expr: sql.Composable, key_type: str) -> sql.Composable:
    """One key expression in its key type, the same whatever the session has SET.

    A date goes through ``pgcounters.date_key``: a timestamptz keys its UTC date and a
    text parses with a fixed field order, where a plain cast would follow the session's
    TimeZone and DateStyle.
    """
    if key_type == "date":
        return sql.SQL("pgcounters.date_key({})").format(expr)
    return sql.SQL("(({})::{})").format(expr, sql.SQL(key_type))


def part_text(part: sql.Composable, key_type: str) -> sql.Composable:
    """The canonical text of a typed key part (a date's is ISO 8601 in every DateStyle)."""
    if key_type == "date":
        return sql.SQL("pgcounters.date_text({})").format(part)
    return sql.SQL("{}::text").format(part)


def _text_key(spec: CounterSpec) -> sql.Composable:
    """The key as the canonical text[] that the queue and the counters table store."""
    if not spec.keys:
        return sql.SQL("'{}'::text[]")
    return sql.SQL("ARRAY[{}]::text[]").format(
        sql.SQL(", ").join(
            part_text(p, t) for p, t in zip(_key_parts(spec), spec.key_types, strict=True)
        )
    )


def _typed_key(spec: CounterSpec) -> sql.Composable:
    """The key of a column target, in the parent key column's type."""
    assert isinstance(spec.target, ColumnTarget)
    return _key_parts(spec)[0]


def row_filter(spec: CounterSpec) -> sql.Composable:
    """The condition under which a source row counts: ``where`` and no NULL key part."""
    parts: list[sql.Composable] = []
    if spec.where is not None:
        parts.append(sql.SQL("({})").format(spec.where.composed()))
    parts += [sql.SQL("({}) IS NOT NULL").format(_expr(k)) for k in spec.keys]
    return sql.SQL(" AND ").join(parts) if parts else sql.SQL("true")


def _summed(spec: CounterSpec, value: sql.Composable) -> sql.Composable:
    """A summed value (a group's ``sum(...)``, or one row's value) as the queues count it:
    0 for NULL, and for a decimal sum in units of 10^-scale (refused if a value has more
    places)."""
    if spec.scale is not None:
        return sql.SQL("pgcounters.scaled(coalesce({}, 0), {}, {})").format(
            value, sql.Literal(spec.scale), sql.Literal(spec.name)
        )
    return sql.SQL("coalesce({}, 0)").format(value)


def _aggregate(spec: CounterSpec) -> sql.Composable:
    if spec.sum is None:
        return sql.SQL("count(*)")
    return _summed(spec, sql.SQL("sum({})").format(_sum_expr(spec)))


def column_units(spec: CounterSpec, value: sql.Composable) -> sql.Composable:
    """A counter column's value in the units the queues count in (for a decimal counter
    column, ``value * 10^scale``)."""
    if spec.scale is None:
        return value
    return sql.SQL("({} * {})").format(value, sql.Literal(10**spec.scale))


def column_value(spec: CounterSpec, units: sql.Composable) -> sql.Composable:
    """What a number of units adds to a counter column (for a decimal counter column,
    ``units * 10^-scale``, exactly)."""
    if spec.scale is None:
        return units
    return sql.SQL("pgcounters.unscaled({}, {})").format(units, sql.Literal(spec.scale))


def contributions(
    spec: CounterSpec,
    relation: sql.Composable,
    *,
    typed: bool = False,
    negate: bool = False,
    extra: sql.Composable | None = None,
) -> sql.Composed:
    """``SELECT key, delta`` of the rows of ``relation`` (aliased as the source table)."""
    if spec.via:  # through a path: the rows of relation joined with the path's tables
        return path_contributions(spec, relation, 0, typed=typed, negate=negate, extra=extra)
    where = row_filter(spec)
    if extra is not None:
        where = sql.SQL("{} AND ({})").format(where, extra)
    # grouped by the typed key parts: the key array is built once per group, not
    # once per row (a third of the trigger's time on a 100k-row insert)
    group = sql.SQL(", ").join(_key_parts(spec)) if spec.keys else sql.SQL("1")
    return sql.SQL(
        "SELECT {key} AS key, {sign}{agg}::bigint AS delta FROM {relation} AS {alias} "
        "WHERE {where} GROUP BY {group}"
    ).format(
        group=group,
        key=_typed_key(spec) if typed else _text_key(spec),
        sign=sql.SQL("-") if negate else sql.SQL(""),
        agg=_aggregate(spec),
        relation=relation,
        alias=sql.Identifier(spec.source.name),
        where=where,
    )


def probe_query(spec: CounterSpec) -> sql.Composed:
    """A query that reads exactly what the spec's triggers read from a source row (its
    condition, its key parts, its summed value as an integer), never run, only planned.

    It stops planning when the source table no longer has what the counter needs: a key or
    summed column renamed or dropped, a type that does not cast to the key type, a summed
    value that is not an integer (a numeric or float sum would be rounded per statement);
    or when a counter column's parent table lost its key or counter column.
    """
    values: list[sql.Composable] = list(_key_parts(spec))
    where = _path_filter(spec) if spec.via else row_filter(spec)
    if spec.sum is not None and spec.scale is None:
        values.append(sql.SQL("pgcounters.integer_value({})").format(_sum_expr(spec)))
    elif spec.sum is not None:
        values.append(
            sql.SQL("pgcounters.scaled({}, {}, {})").format(
                _sum_expr(spec), sql.Literal(spec.scale), sql.Literal(spec.name)
            )
        )
        if isinstance(spec.sum, str):
            # the column's declared scale, checked while the probe is planned
            where = sql.SQL("{} AND pgcounters.decimal_scale_is({}::regclass, {}, {})").format(
                where,
                sql.Literal(spec.source.identifier().as_string()),
                sql.Literal(spec.sum),
                sql.Literal(spec.scale),
            )
    # a counter column: its parent's key and counter columns too (a CTE is analysed even
    # when nothing reads it, so a renamed or dropped column stops the planning)
    target: sql.Composable = sql.SQL("")
    if isinstance(spec.target, ColumnTarget):
        t = spec.target
        scale: sql.Composable = sql.SQL("")
        if spec.scale is not None:  # a decimal counter column keeps its scale
            scale = sql.SQL(" WHERE pgcounters.decimal_scale_is({}::regclass, {}, {})").format(
                sql.Literal(t.table.identifier().as_string()),
                sql.Literal(t.column),
                sql.Literal(spec.scale),
            )
        target = sql.SQL("WITH pgc_target AS (SELECT x.{}, x.{} FROM {} AS x{} LIMIT 0) ").format(
            sql.Identifier(t.key_column), sql.Identifier(t.column), t.table.identifier(), scale
        )
    if spec.via:  # the path's tables, joined: their links, keys and conditions too
        return sql.SQL("{target}SELECT {values} FROM {path} WHERE {where} LIMIT 0").format(
            target=target,
            values=sql.SQL(", ").join(values) if values else sql.SQL("1"),
            path=_path_from(spec, spec.source.identifier(), 0),
            where=where,
        )
    return sql.SQL("{target}SELECT {values} FROM {source} AS {alias} WHERE {where} LIMIT 0").format(
        target=target,
        values=sql.SQL(", ").join(values) if values else sql.SQL("1"),
        source=spec.source.identifier(),
        alias=sql.Identifier(spec.source.name),
        where=where,
    )


ROWS = "pgc_rows"
_TABLE_SLOT = "\x00table\x00"  # where format() puts the table: no SQL holds a NUL


def rows_delta_sql(spec: CounterSpec, context: AdaptContext) -> str:
    """A statement that applies ``$2`` times the contribution of every row of one table, in
    the spec's mode, to its target ``$1``; the table is ``%s``, for ``format()``.

    A table that joins or leaves the counted table's tree of partitions or inheritance
    children, or a partition truncated alone, changes the counts by its rows' contribution
    without any row being inserted or deleted: the database applies this to it (+1 for a
    table that joins, -1 for one that leaves or is truncated). ``%`` in the compiled SQL is
    doubled, so that ``format('%s')`` fills in the table only.
    """
    rows = sql.Identifier(ROWS)
    head = sql.SQL("WITH {} AS MATERIALIZED (SELECT * FROM ONLY {}) ").format(
        rows, sql.SQL(_TABLE_SLOT)
    )
    statement: sql.Composed
    if spec.mode != "direct":
        queue = "queue" if spec.mode == "queued" else "queue_unlogged"
        statement = head + sql.SQL(
            "INSERT INTO {} (target_id, key, delta)"
            " SELECT $1, c.key, $2 * c.delta FROM ({}) AS c WHERE c.delta <> 0"
        ).format(sql.Identifier("pgcounters", queue), contributions(spec, rows))
    elif not isinstance(spec.target, ColumnTarget):
        statement = head + sql.SQL(
            "SELECT pgcounters.add_direct(array_agg($1), array_agg(c.key::text),"
            " array_agg($2 * c.delta)) FROM ({}) AS c WHERE c.delta <> 0"
        ).format(contributions(spec, rows))
    else:
        t = spec.target
        statement = head + sql.SQL(
            "UPDATE {parent} AS x SET {col} = coalesce(x.{col}, 0) + {added}"
            " FROM ({rows}) AS c WHERE x.{key_col} = c.key AND c.delta <> 0"
        ).format(
            parent=t.table.identifier(),
            col=sql.Identifier(t.column),
            added=column_value(spec, sql.SQL("$2 * c.delta")),
            key_col=sql.Identifier(t.key_column),
            rows=contributions(spec, rows, typed=True),
        )
    return statement.as_string(context).replace("%", "%%").replace(_TABLE_SLOT, "%s")


def truth_query(spec: CounterSpec, extra: sql.Composable | None = None) -> sql.Composed:
    """The truth: ``SELECT key, value`` counted from the source table itself."""
    return contributions(spec, spec.source.identifier(), extra=extra)


Place: TypeAlias = tuple[str | None, str | None, str | None, str | None]


def target_place(spec: CounterSpec) -> Place:
    """Where a counter's values live as ``pgcounters.targets`` records it: the schema,
    table, column and key column of a counter column; all None for a named counter."""
    t = spec.target
    if isinstance(t, ColumnTarget):
        return t.table.schema, t.table.name, t.column, t.key_column
    return None, None, None, None


def ensure_target_call(spec: CounterSpec) -> sql.Composed:
    args: list[sql.Composable] = [
        *([] if spec.scale is None else [sql.Literal(spec.scale)]),
        sql.Literal(spec.name),
        sql.SQL("{}::text[]").format(sql.Literal("{" + ",".join(spec.key_types) + "}")),
        sql.Literal(spec.mode),
    ]
    if isinstance(spec.target, ColumnTarget):
        args += [sql.Literal(v) for v in target_place(spec)]
    function = "ensure_target" if spec.scale is None else "ensure_decimal_target"
    return sql.SQL("pgcounters.{}({})").format(sql.SQL(function), sql.SQL(", ").join(args))


def target_identity(spec: CounterSpec) -> str:
    """The counter's identity as ``pgcounters._target_identity`` writes it: the JSON text
    of everything ``ensure_target`` compares (jsonb's spelling: ", " between items)."""
    return json.dumps(
        [spec.name, list(spec.key_types), spec.mode, *target_place(spec)], ensure_ascii=False
    )


def target_id_expr(spec: CounterSpec) -> sql.Composed:
    """What a trigger assigns to its target id: the id listed for the counter's identity,
    which PostgreSQL folds into the statement's plan, or ``ensure_target`` when it is not
    listed (decimal counters always call ``ensure_decimal_target``)."""
    if spec.scale is not None:
        return ensure_target_call(spec)
    return sql.SQL("coalesce(pgcounters._target_id({}), {})").format(
        sql.Literal(target_identity(spec)), ensure_target_call(spec)
    )


def _net(spec: CounterSpec, event: Event, *, typed: bool) -> sql.Composed:
    """``SELECT key, delta`` of the statement's net change per key, zero deltas left out."""
    old = sql.Identifier(OLD_TABLE)
    new = sql.Identifier(NEW_TABLE)
    if event == "insert":
        inner = contributions(spec, new, typed=typed)
    elif event == "delete":
        inner = contributions(spec, old, typed=typed, negate=True)
    else:
        both = sql.SQL("{} UNION ALL {}").format(
            contributions(spec, old, typed=typed, negate=True),
            contributions(spec, new, typed=typed),
        )
        inner = sql.SQL(
            "SELECT c.key, sum(c.delta)::bigint AS delta FROM ({}) AS c GROUP BY 1"
        ).format(both)
    return sql.SQL("SELECT d.key, d.delta FROM ({}) AS d WHERE d.delta <> 0").format(inner)


def _apply(
    spec: CounterSpec,
    event: Event,
    net: Callable[[bool], sql.Composed] | None = None,
) -> tuple[list[tuple[str, str]], sql.Composed]:
    """The statements that record the net change, by mode and target kind (``net``: the
    ``SELECT key, delta`` of the change, typed or not; by default the source rows')."""
    # the statement's rows key the parents themselves (not through a path)
    own_rows = net is None and not spec.via
    if net is None:
        net = lambda typed: _net(spec, event, typed=typed)  # noqa: E731
    if spec.mode != "direct":
        queue = sql.Identifier("pgcounters", "queue" if spec.mode == "queued" else "queue_unlogged")
        grouped = sql.SQL(
            "INSERT INTO {} (target_id, key, delta)\n"
            "    SELECT _pgc_target, n.key, n.delta FROM ({}) AS n;\n"
        ).format(queue, net(False))
        if not own_rows:
            return [], grouped
        if event == "update":
            return [], _one_row_update(spec, queue, grouped)
        return [], _one_row_first(spec, event, queue, grouped)
    if not isinstance(spec.target, ColumnTarget):
        # through a SECURITY DEFINER function (migration 0006): the writer of the
        # source table needs no write right on pgcounters.counters
        return [], sql.SQL(
            "PERFORM pgcounters.add_direct(array_agg(_pgc_target), array_agg(n.key::text),\n"
            "                                  array_agg(n.delta))\n"
            "      FROM ({}) AS n;\n"
        ).format(net(False))
    t = spec.target
    parent = t.table.identifier()
    key_col, col = sql.Identifier(t.key_column), sql.Identifier(t.column)
    declare = [("_pgc_keys", f"{t.key_type}[]"), ("_pgc_deltas", "bigint[]")]
    body = sql.SQL(
        "SELECT array_agg(n.key ORDER BY n.key), array_agg(n.delta ORDER BY n.key)\n"
        "      INTO _pgc_keys, _pgc_deltas FROM ({net}) AS n;\n"
        "    IF _pgc_keys IS NOT NULL THEN\n"
        "        -- lock the parent rows in key order, as the drain does: no deadlock\n"
        "        -- (keyed by the statement's own rows, the parents of all of them,\n"
        "        -- whatever the condition: the table's direct counters take one set)\n"
        "        PERFORM 1 FROM {parent} AS x WHERE x.{key_col} = ANY ({locked})\n"
        "          ORDER BY x.{key_col} FOR NO KEY UPDATE;\n"
        "        PERFORM set_config({applying}, 'on', true);\n"
        "        -- a parent this statement cannot see yet (a deferred foreign key, a\n"
        "        -- parent inserted by a transaction that committed since) gets its\n"
        "        -- delta queued: the drain applies it once the row is there\n"
        "        WITH applied AS (\n"
        "            UPDATE {parent} AS x SET {col} = coalesce(x.{col}, 0) + {added}\n"
        "              FROM unnest(_pgc_keys, _pgc_deltas) AS u(key, delta)\n"
        "             WHERE x.{key_col} = u.key RETURNING u.key)\n"
        "        INSERT INTO pgcounters.queue (target_id, key, delta)\n"
        "            SELECT _pgc_target, ARRAY[u.key::text]::text[], u.delta\n"
        "              FROM unnest(_pgc_keys, _pgc_deltas) AS u(key, delta)\n"
        "             WHERE u.key NOT IN (SELECT a.key FROM applied AS a);\n"
        "        PERFORM set_config({applying}, '', true);\n"
        "        -- reported after the commit by a worker that reports changes\n"
        "        PERFORM pgcounters.note_direct(_pgc_target, _pgc_keys);\n"
        "    END IF;\n"
    ).format(
        net=net(True),
        # the parent keys it locks: of every row of the statement, or (through a path)
        # those of its changes
        locked=(
            sql.SQL("ARRAY({})").format(_statement_keys(spec, event))
            if own_rows
            else sql.SQL("_pgc_keys")
        ),
        parent=parent,
        key_col=key_col,
        col=col,
        added=column_value(spec, sql.SQL("u.delta")),
        applying=sql.Literal(APPLYING),
    )
    return declare, body


def _row_delta(spec: CounterSpec, negate: bool) -> sql.Composed:
    """What one source row adds: the aggregate of a group of that row alone."""
    value = sql.SQL("1") if spec.sum is None else _summed(spec, _sum_expr(spec))
    return sql.SQL("{}({})::bigint").format(sql.SQL("-") if negate else sql.SQL(""), value)


def _by_rows(grouped: sql.Composed, one: sql.Composed, *relations: str) -> sql.Composed:
    """``grouped`` for a statement of several rows, ``one`` for one row or none. The test
    is an init plan that stops at the second row of each transition table (a statement
    trigger is given no count of its rows)."""
    several = sql.SQL(" OR ").join(
        sql.SQL("EXISTS (SELECT FROM {} OFFSET 1)").format(sql.Identifier(r)) for r in relations
    )
    return sql.SQL("IF {} THEN\n    {}    ELSE\n    {}    END IF;\n").format(several, grouped, one)


def _one_row_first(
    spec: CounterSpec, event: Event, queue: sql.Composable, grouped: sql.Composed
) -> sql.Composed:
    """A statement of one row queues that row's delta as it is (nothing when the row does
    not count or adds zero); a statement of several rows runs ``grouped``, which sums them
    per key. Grouping builds a hash table each statement: most of a counter's cost on a
    single-row INSERT."""
    relation = NEW_TABLE if event == "insert" else OLD_TABLE
    delta = _row_delta(spec, negate=event == "delete")
    where = row_filter(spec)
    if spec.sum is not None:  # a row adding nothing queues nothing (its value read only
        # when the row counts, as the aggregate reads it)
        where = sql.SQL("CASE WHEN {} THEN {} <> 0 ELSE false END").format(where, delta)
    one = sql.SQL(
        "INSERT INTO {queue} (target_id, key, delta)\n"
        "    SELECT _pgc_target, {key}, {delta} FROM {relation} AS {alias} WHERE {where};\n"
    ).format(
        queue=queue,
        key=_text_key(spec),
        delta=delta,
        relation=sql.Identifier(relation),
        alias=sql.Identifier(spec.source.name),
        where=where,
    )
    return _by_rows(grouped, one, relation)


def _one_row_update(
    spec: CounterSpec, queue: sql.Composable, grouped: sql.Composed
) -> sql.Composed:
    """An UPDATE of one row queues the change of that row (its old row's contribution
    taken back, its new row's added, one delta when both have one key, none when they
    cancel, as for a ``save()`` that keeps the row's key and value); an UPDATE of several
    rows runs ``grouped``."""

    def side(relation: str, negate: bool) -> sql.Composed:
        return sql.SQL(
            "SELECT CASE WHEN {where} THEN {key} END AS key,"
            " CASE WHEN {where} THEN {delta} END AS delta FROM {relation} AS {alias}"
        ).format(
            where=row_filter(spec),
            key=_text_key(spec),
            delta=_row_delta(spec, negate=negate),
            relation=sql.Identifier(relation),
            alias=sql.Identifier(spec.source.name),
        )

    one = sql.SQL(
        "INSERT INTO {queue} (target_id, key, delta)\n"
        "    SELECT _pgc_target, c.key, c.delta\n"
        "      FROM (SELECT) AS one LEFT JOIN ({before}) AS o ON true\n"
        "           LEFT JOIN ({after}) AS n ON true,\n"
        "        LATERAL (VALUES (o.key, CASE WHEN o.key = n.key THEN o.delta + n.delta"
        " ELSE o.delta END),\n"
        "                        (n.key, CASE WHEN o.key = n.key THEN 0 ELSE n.delta END))"
        " AS c (key, delta)\n"
        "     WHERE c.key IS NOT NULL AND c.delta <> 0;\n"
    ).format(queue=queue, before=side(OLD_TABLE, True), after=side(NEW_TABLE, False))
    return _by_rows(grouped, one, OLD_TABLE, NEW_TABLE)


def _statement_keys(spec: CounterSpec, event: Event) -> sql.Composed:
    """The parent keys of every row of the statement (its old and new rows), whether or
    not they count: what every direct counter column of the table locks."""
    relations = {"insert": [NEW_TABLE], "delete": [OLD_TABLE], "update": [OLD_TABLE, NEW_TABLE]}
    key = _typed_key(spec)
    return sql.SQL(" UNION ").join(
        sql.SQL("SELECT {key} AS key FROM {relation} AS {alias} WHERE {key} IS NOT NULL").format(
            key=key, relation=sql.Identifier(relation), alias=sql.Identifier(spec.source.name)
        )
        for relation in relations[event]
    )


def compile_trigger(spec: CounterSpec, event: Event) -> CompiledTrigger:
    marker = (
        f"    -- pgcounters spec fingerprint={spec.fingerprint} event={event} name={spec.name}\n"
    )
    paused = sql.SQL(
        "    IF pgcounters.is_paused({}) THEN\n        RETURN NULL;\n    END IF;\n"
    ).format(sql.Literal(spec.name))
    declare: list[tuple[str, str]] = []
    if event == "truncate":
        body = sql.SQL("    PERFORM pgcounters.reset_target({});\n").format(
            ensure_target_call(spec)
        )
    else:
        extra, apply = _apply(spec, event)
        declare += [("_pgc_target", "integer"), *extra]
        body = sql.SQL("    _pgc_target := {};\n    {}").format(target_id_expr(spec), apply)
        if spec.via:  # the path's rows this statement's rows count through, held first
            relations = {
                "insert": [NEW_TABLE],
                "update": [OLD_TABLE, NEW_TABLE],
                "delete": [OLD_TABLE],
            }[event]
            body = path_locks(spec, 0, [sql.Identifier(r) for r in relations]) + body
    text = marker + paused.as_string() + body.as_string() + "    RETURN NULL;\n"
    return CompiledTrigger(spec.name, event, trigger_name(spec.name, event), tuple(declare), text)


def compile_guard(spec: CounterSpec, event: Event) -> CompiledTrigger:
    """A row trigger on the target table that keeps the counter column to pgcounters.

    ``guard_update`` (``BEFORE UPDATE OF column``) refuses a change of the value unless
    one of pgcounters' writers (drain, recount, backfill, a direct trigger) has turned
    on the transaction-local ``pgcounters.applying`` around its UPDATE. The trigger's
    condition (the value changes) is evaluated without a function call; an UPDATE that
    does not name the column never evaluates it; one that sets the column to its own
    value (a Django ``save()``) evaluates only the condition.
    ``guard_insert`` starts a new row's counter at 0 whatever the INSERT says (NULL
    included: the column needs no default for a raw INSERT to work).
    """
    t = spec.target
    assert isinstance(t, ColumnTarget)
    col = _quote(t.column)
    marker = (
        f"    -- pgcounters spec fingerprint={spec.fingerprint} event={event} name={spec.name}\n"
    )
    if event == "guard_insert":
        body = sql.SQL("    NEW.{col} := 0;\n    RETURN NEW;\n").format(
            col=sql.Identifier(t.column)
        )
        condition = f"NEW.{col} IS DISTINCT FROM 0"
    else:
        # the flag is read in the function, not in the condition: a function call in the
        # condition was measured to cost an UPDATE naming the column (Django's save())
        # far more than the condition alone; pgcounters' writers pay the function call
        body = sql.SQL(
            "    IF current_setting({applying}, true) = 'on' THEN\n"
            "        RETURN NEW;\n"
            "    END IF;\n"
            "    RAISE EXCEPTION USING ERRCODE = 'PCC01', MESSAGE = {message}, HINT = {hint};\n"
        ).format(
            applying=sql.Literal(APPLYING),
            message=sql.Literal(
                f"column {t.column} of table {t.table} is counter {spec.name}, kept by "
                "pgcounters: only the rows it counts change it"
            ),
            hint=sql.Literal(f"to repair the counter: pgcounters recount {spec.name}"),
        )
        condition = f"OLD.{col} IS DISTINCT FROM NEW.{col}"
    return CompiledTrigger(
        spec.name,
        event,
        trigger_name(spec.name, event),
        (),
        marker + body.as_string(),
        table=t.table,
        column=t.column,
        condition=condition,
    )


def compile_key_guard(spec: CounterSpec) -> CompiledTrigger:
    """A row trigger on the target table: a row whose key changes starts its counter at 0.

    The counted rows of the old key do not count under the new one until they point to it:
    when the database moves them (``ON UPDATE CASCADE``) or the application does, their
    triggers add their contribution to the new key (and take it from the old one, a row
    that no longer exists). The value the row had would otherwise count them twice.
    """
    t = spec.target
    assert isinstance(t, ColumnTarget)
    key = _quote(t.key_column)
    marker = (
        f"    -- pgcounters spec fingerprint={spec.fingerprint} event=guard_key name={spec.name}\n"
    )
    body = sql.SQL("    NEW.{col} := 0;\n    RETURN NEW;\n").format(col=sql.Identifier(t.column))
    return CompiledTrigger(
        spec.name,
        "guard_key",
        trigger_name(spec.name, "guard_key"),
        (),
        marker + body.as_string(),
        table=t.table,
        column=t.column,
        condition=f"OLD.{key} IS DISTINCT FROM NEW.{key}",
    )


def events_of(spec: CounterSpec) -> tuple[Event, ...]:
    """The triggers a spec has: four on its source table, three guards for a counter column,
    five on each table of its path."""
    path = tuple(e for step in VIA_EVENTS[: len(spec.via)] for e in step)
    return (EVENTS + GUARD_EVENTS if isinstance(spec.target, ColumnTarget) else EVENTS) + path


def compile_spec(spec: CounterSpec) -> CompiledSpec:
    """Compile a spec into its triggers: four counting ones, the guards of a column, and
    those of the tables of its path."""
    triggers = [compile_trigger(spec, event) for event in EVENTS]
    if isinstance(spec.target, ColumnTarget):
        triggers += [
            compile_key_guard(spec) if event == "guard_key" else compile_guard(spec, event)
            for event in GUARD_EVENTS
        ]
    for step, events in enumerate(VIA_EVENTS[: len(spec.via)], start=1):
        triggers += [compile_via_trigger(spec, step, event) for event in events]
    return CompiledSpec(spec, tuple(triggers))


# -- paths: rows counted through other tables ----------------------------------


def _sum_expr(spec: CounterSpec) -> sql.Composable:
    """The summed value of a source row (a column qualified by its table on a path)."""
    assert spec.sum is not None
    return _path_expr(spec, spec.sum, 0) if spec.via else _expr(spec.sum)


def _path_table(spec: CounterSpec, index: int) -> Table:
    """Table ``index`` of the spec's path: 0 is the counted table, then each step's."""
    return spec.source if index == 0 else spec.via[index - 1].table


def _path_expr(spec: CounterSpec, value: KeyExpr, index: int) -> sql.Composable:
    """A column of table ``index`` of the path (qualified by its alias), or a fragment."""
    if isinstance(value, Fragment):
        return sql.SQL("({})").format(value.composed())
    return sql.Identifier(_path_table(spec, index).name, value)


def _path_from(
    spec: CounterSpec,
    relation: sql.Composable,
    at: int,
    *,
    start: int = 0,
    stop: int | None = None,
) -> sql.Composed:
    """``FROM`` items joining the tables ``start`` to ``stop`` of the path (each aliased by
    its table name), with ``relation`` in place of table ``at``."""
    last = len(spec.via) if stop is None else stop
    items: list[sql.Composable] = []
    for index in range(start, last + 1):
        table = _path_table(spec, index)
        rel = relation if index == at else table.identifier()
        alias = sql.Identifier(table.name)
        if index == start:
            items.append(sql.SQL("{} AS {}").format(rel, alias))
            continue
        step = spec.via[index - 1]
        items.append(
            sql.SQL("JOIN {} AS {} ON {}.{} = {}.{}").format(
                rel,
                alias,
                alias,
                sql.Identifier(step.key),
                sql.Identifier(_path_table(spec, index - 1).name),
                sql.Identifier(step.link),
            )
        )
    return sql.SQL(" ").join(items)


def _path_filter(spec: CounterSpec) -> sql.Composable:
    """The condition under which a row counts through the path: the counted rows' and each
    step's condition, and no NULL key part (the joins need every link)."""
    parts: list[sql.Composable] = []
    if spec.where is not None:
        parts.append(sql.SQL("({})").format(spec.where.composed()))
    parts += [
        sql.SQL("({})").format(step.where.composed()) for step in spec.via if step.where is not None
    ]
    parts += [
        sql.SQL("({}) IS NOT NULL").format(_path_expr(spec, k, len(spec.via))) for k in spec.keys
    ]
    return sql.SQL(" AND ").join(parts) if parts else sql.SQL("true")


def path_contributions(
    spec: CounterSpec,
    relation: sql.Composable,
    at: int,
    *,
    typed: bool = False,
    negate: bool = False,
    extra: sql.Composable | None = None,
) -> sql.Composed:
    """``SELECT key, delta`` of the counted rows reached through the path when ``relation``
    stands for its table ``at`` (the counted table's transition table, a step's, or a
    table itself): the other tables are read as they are."""
    where = _path_filter(spec)
    if extra is not None:
        where = sql.SQL("{} AND ({})").format(where, extra)
    group = sql.SQL(", ").join(_key_parts(spec)) if spec.keys else sql.SQL("1")
    return sql.SQL(
        "SELECT {key} AS key, {sign}{agg}::bigint AS delta FROM {path} WHERE {where} "
        "GROUP BY {group}"
    ).format(
        key=_typed_key(spec) if typed else _text_key(spec),
        sign=sql.SQL("-") if negate else sql.SQL(""),
        agg=_aggregate(spec),
        path=_path_from(spec, relation, at),
        where=where,
        group=group,
    )


def path_locks(spec: CounterSpec, at: int, relations: Sequence[sql.Composable]) -> sql.Composed:
    """Statements that take a share lock, in key order, on the rows of the path's tables
    above table ``at`` that the rows of ``relations`` reach: a concurrent move or delete of
    such a row waits for this transaction (and this one for it), so each of the two counts
    the other's rows once, through the row as it is after the other."""
    out: list[sql.Composable] = []
    for index in range(at + 1, len(spec.via) + 1):
        step = spec.via[index - 1]
        reached = sql.SQL(" UNION ALL ").join(
            sql.SQL("SELECT {}.{} FROM {}").format(
                sql.Identifier(_path_table(spec, index - 1).name),
                sql.Identifier(step.link),
                _path_from(spec, rel, at, start=at, stop=index - 1),
            )
            for rel in relations
        )
        out.append(
            sql.SQL(
                "    PERFORM 1 FROM {table} AS pgc_held WHERE pgc_held.{key} IN ({reached})\n"
                "      ORDER BY pgc_held.{key} FOR SHARE;\n"
            ).format(table=step.table.identifier(), key=sql.Identifier(step.key), reached=reached)
        )
    return sql.Composed(out)


def compile_via_trigger(spec: CounterSpec, step: int, event: Event) -> CompiledTrigger:
    """A trigger on table ``step`` of the spec's path (``CounterSpec.via``).

    * INSERT and UPDATE (statement-level, with transition tables): the counted rows under
      the new rows count through them, those under the old rows no longer do, netted per
      key: a moved row (an article given to another author) moves all its counted rows in
      one delta per key; a changed condition on it adds or removes them. An UPDATE by
      pgcounters' own writers of counter columns is skipped (a path's condition does not
      read a counter column).
    * DELETE (``BEFORE ... FOR EACH ROW``): the counted rows under the row no longer count.
      It runs before the row goes, while the rows under it are still there: when the
      database deletes them afterwards (``ON DELETE CASCADE``), their own trigger finds no
      row above them and counts nothing; when the application deleted them first (Django),
      this finds none. The delta is queued (in direct mode too).
    * TRUNCATE: nothing counts through the table any more (the counter is reset).
    * A change of the row's key: :func:`compile_via_key_trigger`.
    """
    base = event.partition("_")[2]
    if base == "key":
        return compile_via_key_trigger(spec, step)
    via = spec.via[step - 1]
    marker = (
        f"    -- pgcounters spec fingerprint={spec.fingerprint} event={event} name={spec.name}\n"
    )
    done = "    RETURN OLD;\n" if base == "delete" else "    RETURN NULL;\n"
    paused = sql.SQL("    IF pgcounters.is_paused({}) THEN\n    {}    END IF;\n").format(
        sql.Literal(spec.name), sql.SQL(done)
    )
    declare: list[tuple[str, str]] = []
    if base == "truncate":
        body: sql.Composable = sql.SQL("    PERFORM pgcounters.reset_target({});\n").format(
            ensure_target_call(spec)
        )
    else:
        old, new = sql.Identifier(OLD_TABLE), sql.Identifier(NEW_TABLE)
        if base == "delete":
            gone = sql.SQL("(SELECT * FROM {} AS pgc_gone WHERE pgc_gone.{} = OLD.{})").format(
                via.table.identifier(), sql.Identifier(via.key), sql.Identifier(via.key)
            )
            relations: list[sql.Composable] = [gone]
        else:
            relations = [new] if base == "insert" else [old, new]

        def net(typed: bool, old: sql.Composable = old, new: sql.Composable = new) -> sql.Composed:
            if base == "insert":
                inner = path_contributions(spec, new, step, typed=typed)
            elif base == "delete":
                inner = path_contributions(spec, relations[0], step, typed=typed, negate=True)
            else:
                inner = _moved_net(spec, step, old, new, typed)
            return sql.SQL("SELECT d.key, d.delta FROM ({}) AS d WHERE d.delta <> 0").format(inner)

        declare.append(("_pgc_target", "integer"))
        if base == "delete":
            queue = "queue_unlogged" if spec.mode == "unlogged" else "queue"
            apply: sql.Composable = sql.SQL(
                "INSERT INTO {} (target_id, key, delta)\n"
                "    SELECT _pgc_target, n.key, n.delta FROM ({}) AS n;\n"
            ).format(sql.Identifier("pgcounters", queue), net(False))
        else:
            extra, apply = _apply(spec, event, net)
            declare += extra
            if base == "update":  # rows whose key changed were counted by their row trigger
                apply = _unless_keys_moved(spec, step, apply, net)
                declare.append(("_pgc_moved", "bigint"))
        body = (
            path_locks(spec, step, relations)
            + sql.SQL("    _pgc_target := {};\n    ").format(target_id_expr(spec))
            + apply
        )
    if base == "update":
        # pgcounters' own writes of counter columns (the drain, recount, a direct-mode
        # trigger) change no link, key or condition of a path: nothing moves
        paused = paused + sql.SQL(
            "    IF current_setting({}, true) = 'on' THEN\n        RETURN NULL;\n    END IF;\n"
        ).format(sql.Literal(APPLYING))
    text = marker + paused.as_string() + body.as_string() + done
    return CompiledTrigger(
        spec.name,
        event,
        trigger_name(spec.name, event),
        tuple(declare),
        text,
        table=via.table,
        row=base == "delete",
    )


def _moved_net(
    spec: CounterSpec, step: int, old: sql.Composable, new: sql.Composable, typed: bool
) -> sql.Composed:
    """``SELECT key, delta`` of rows of table ``step`` going from ``old`` to ``new``: the
    counted rows under the old ones no longer count through them, those under the new ones
    do, netted per key (zero deltas included)."""
    return sql.SQL(
        "SELECT c.key, sum(c.delta)::bigint AS delta FROM ({} UNION ALL {}) AS c GROUP BY 1"
    ).format(
        path_contributions(spec, old, step, typed=typed, negate=True),
        path_contributions(spec, new, step, typed=typed),
    )


def key_moves_setting(spec: CounterSpec, step: int) -> str:
    """The transaction-local setting in which the row trigger of a change of the key of
    table ``step`` counts the rows it counted (their old and new keys that are not NULL),
    for the table's UPDATE statement trigger, which resets it."""
    return "pgcounters." + trigger_name(spec.name, VIA_EVENTS[step - 1][4])


def compile_via_key_trigger(spec: CounterSpec, step: int) -> CompiledTrigger:
    """``BEFORE UPDATE ... FOR EACH ROW WHEN (the key changes)`` on table ``step`` of a path.

    A row whose key changes takes the counted rows that pointed to its old key away (they
    no longer reach it) and gives those that already point to its new key. It is counted
    here, before the statement ends, while the rows under it are as they were: PostgreSQL
    runs an ``ON UPDATE CASCADE`` of the rows under it (their triggers then count their
    move, through the row with its new key) before any statement trigger of the update,
    so the UPDATE statement trigger, which would see the rows under it moved already,
    leaves such rows to this trigger. The delta is queued, in every mode (as a delete's).
    """
    event = VIA_EVENTS[step - 1][4]
    via = spec.via[step - 1]
    key = sql.Identifier(via.key)
    old = sql.SQL("(SELECT OLD.*)")
    new = sql.SQL("(SELECT NEW.*)")
    marker = (
        f"    -- pgcounters spec fingerprint={spec.fingerprint} event={event} name={spec.name}\n"
    )
    queue = "queue_unlogged" if spec.mode == "unlogged" else "queue"
    setting = sql.Literal(key_moves_setting(spec, step))
    body = sql.SQL(
        "    IF pgcounters.is_paused({name}) THEN\n        RETURN NEW;\n    END IF;\n"
        "{locks}"
        "    _pgc_target := {target};\n"
        "    INSERT INTO {queue} (target_id, key, delta)\n"
        "    SELECT _pgc_target, d.key, d.delta FROM ({net}) AS d WHERE d.delta <> 0;\n"
        "    -- the UPDATE statement trigger checks that it leaves out as many rows\n"
        "    PERFORM set_config({setting}, (coalesce(nullif(current_setting({setting}, true),"
        " ''), '0')::bigint + (OLD.{key} IS NOT NULL)::int + (NEW.{key} IS NOT NULL)::int)::text,"
        " true);\n"
        "    RETURN NEW;\n"
    ).format(
        name=sql.Literal(spec.name),
        locks=path_locks(spec, step, [old, new]),
        target=target_id_expr(spec),
        queue=sql.Identifier("pgcounters", queue),
        net=_moved_net(spec, step, old, new, False),
        setting=setting,
        key=key,
    )
    return CompiledTrigger(
        spec.name,
        event,
        trigger_name(spec.name, event),
        (("_pgc_target", "integer"),),
        marker + body.as_string(),
        table=via.table,
        condition=f"OLD.{_quote(via.key)} IS DISTINCT FROM NEW.{_quote(via.key)}",
        row=True,
    )


def _unless_keys_moved(
    spec: CounterSpec,
    step: int,
    apply: sql.Composable,
    net: Callable[..., sql.Composed],
) -> sql.Composed:
    """The UPDATE statement trigger of table ``step``: ``apply`` when no key changed, else
    the same for the rows whose key is the same before and after (those whose key changed
    were counted by their row trigger).

    A statement that gave a row the key another of its rows had (``id = id + 1``) cannot
    tell the rows apart: it is refused, with the number of rows left out checked against
    the number the row triggers counted."""
    via = spec.via[step - 1]
    key = sql.Identifier(via.key)
    old, new = sql.Identifier(OLD_TABLE), sql.Identifier(NEW_TABLE)
    kept_old = sql.SQL(
        "(SELECT * FROM {old} AS o WHERE EXISTS (SELECT 1 FROM {new} AS n WHERE n.{key} = o.{key}))"
    ).format(old=old, new=new, key=key)
    kept_new = sql.SQL(
        "(SELECT * FROM {new} AS n WHERE EXISTS (SELECT 1 FROM {old} AS o WHERE o.{key} = n.{key}))"
    ).format(old=old, new=new, key=key)
    _, kept = _apply(spec, VIA_EVENTS[step - 1][1], lambda typed: net(typed, kept_old, kept_new))
    setting = sql.Literal(key_moves_setting(spec, step))
    return sql.SQL(
        "_pgc_moved := coalesce(nullif(current_setting({setting}, true), ''), '0')::bigint;\n"
        "    IF _pgc_moved = 0 THEN\n    {apply}"
        "    ELSE\n"
        "        PERFORM set_config({setting}, '0', true);\n"
        "        IF _pgc_moved <> (SELECT count(*) FROM {old} AS o WHERE o.{key} IS NOT NULL AND"
        " NOT EXISTS (SELECT 1 FROM {new} AS n WHERE n.{key} = o.{key}))"
        " + (SELECT count(*) FROM {new} AS n WHERE n.{key} IS NOT NULL AND"
        " NOT EXISTS (SELECT 1 FROM {old} AS o WHERE o.{key} = n.{key})) THEN\n"
        "            RAISE EXCEPTION USING ERRCODE = '0A000', MESSAGE = {message}, HINT = {hint};\n"
        "        END IF;\n"
        "    {kept}"
        "    END IF;\n"
    ).format(
        setting=setting,
        apply=apply,
        old=old,
        new=new,
        key=key,
        kept=kept,
        message=sql.Literal(
            f"counter {spec.name} cannot count an update of {via.table.name} that gives a row "
            f"the {via.key} another of its rows had"
        ),
        hint=sql.Literal(f"change the {via.key} of such rows in two statements"),
    )
