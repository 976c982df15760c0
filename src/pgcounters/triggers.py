"""Installing declared counters (specs) on a database, and finding drift.

Plain-SQL users call :func:`install` / :func:`uninstall` with a psycopg
connection; the Django app delivers the same compiled trigger bodies through
django-pgtrigger migrations and records the specs with :func:`record`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

import psycopg
from psycopg import sql
from psycopg.rows import tuple_row
from psycopg.types.json import Jsonb

from pgcounters import schema
from pgcounters.compiler import (
    ALL_VIA_EVENTS,
    EVENTS,
    GUARD_EVENTS,
    MARKER_RE,
    compile_spec,
    ensure_target_call,
    events_of,
    probe_query,
    rows_delta_sql,
    target_place,
    trigger_name,
)
from pgcounters.connection import Conn
from pgcounters.dberrors import translate, translated
from pgcounters.errors import (
    CounterBroken,
    CounterDefinitionConflict,
    CounterDeliveredElsewhere,
    InvalidArgument,
    InvalidCounterDefinition,
    UnknownCounter,
)
from pgcounters.keys import check_name
from pgcounters.specs import ColumnTarget, CounterSpec
from pgcounters.sqlfiles import named, query

State: TypeAlias = Literal[
    "installed", "outdated", "missing", "disabled", "broken", "stale", "undeclared"
]
ReplicaWrites: TypeAlias = Literal["flag", "count"]


@dataclass(frozen=True)
class InstalledTrigger:
    """A trigger compiled by pgcounters, as found in the catalog."""

    schema: str
    table: str
    trigger: str
    enabled: bool
    spec_name: str
    event: str
    fingerprint: str
    follower: bool = False
    """On a partition or inheritance child of the counted table (see :func:`follow`)."""
    source: str = field(default="", repr=False, compare=False)
    """The body of its function, as installed."""


@dataclass(frozen=True)
class Drift:
    """How the installed triggers of one counter compare with its declaration."""

    name: str
    state: State
    detail: str

    @property
    def ok(self) -> bool:
        return self.state == "installed"


def validate(conn: Conn, spec: CounterSpec) -> None:
    """Check against the database that the spec's SQL compiles (EXPLAIN of its probe: the
    condition, the key parts and the summed value, which must be an integer)."""
    try:
        with conn.transaction(), conn.cursor() as cur:
            cur.execute(sql.SQL(query("explain")).format(statement=probe_query(spec)))
    except psycopg.Error as exc:
        message = exc.diag.message_primary or str(exc)
        if isinstance(exc, psycopg.errors.UndefinedFunction) and (
            "integer_value" in message or "scaled" in message
        ):
            raise InvalidCounterDefinition(_not_summable(conn, spec)) from exc
        if exc.sqlstate == "PC020":  # a decimal sum whose column has another scale
            raise InvalidCounterDefinition(_not_summable(conn, spec, message)) from exc
        mapped = translate(exc)
        if mapped is not None and not isinstance(mapped, InvalidCounterDefinition):
            raise mapped from exc
        raise InvalidCounterDefinition(
            f"counter {spec.name}: its definition does not compile against table "
            f"{spec.source}: {message}"
        ) from exc


def _not_summable(conn: Conn, spec: CounterSpec, detail: str = "") -> str:
    """Why the sum of a spec cannot be kept exactly, and what to do."""
    kind = None
    if isinstance(spec.sum, str):
        with conn.cursor(row_factory=tuple_row) as cur:
            cur.execute(query("column_type"), (spec.source.identifier().as_string(conn), spec.sum))
            row = cur.fetchone()
        kind = None if row is None else str(row[0])
    what = f"its sum ({spec.sum}{f', {kind}' if kind else ''})"
    places = re.fullmatch(r"numeric\(\d+,(\d+)\)", kind or "")
    if places and spec.scale is None:
        return (
            f"counter {spec.name}: {what} is a decimal: declare the counter with "
            f"scale={places[1]} (its decimal places) to keep it exactly"
        )
    if kind == "numeric":
        return (
            f"counter {spec.name}: {what} has no scale, so its values may have any number "
            "of decimal places and no exact sum can be kept: give the column a scale "
            "(numeric(p, s)) and declare the counter with scale=s"
        )
    if kind in ("double precision", "real"):
        return (
            f"counter {spec.name}: {what} is floating-point: its values are not exact, so "
            "neither is their sum; sum a numeric(p, s) column (with scale=s) or an integer"
        )
    if spec.scale is not None:
        return (
            f"counter {spec.name}: {what} is not a number a decimal sum with "
            f"{spec.scale} decimal places can hold: sum a numeric(p, {spec.scale}) column"
            + (f" ({detail})" if detail else "")
        )
    return (
        f"counter {spec.name}: {what} is not of an integer type; counters hold exact "
        "values: sum an integer, or a numeric(p, s) column with scale=s"
    )


def record(conn: Conn, spec: CounterSpec) -> None:
    """Record the spec in ``pgcounters.specs`` (for verify, recount, drift and the guard
    that refuses a schema change breaking it).

    A counter that exists with values in other units (a sum of decimals declared again
    with another scale, or as an integer counter, or the reverse) is refused with
    :class:`CounterDefinitionConflict`: its stored values and pending deltas would be
    read in the wrong units.
    """
    row = conn.execute(query("target_scale"), (spec.name,)).fetchone()
    if row is not None and row[0] != spec.scale:

        def units(scale: int | None) -> str:
            return "integer values" if scale is None else f"{scale} decimal places"

        raise CounterDefinitionConflict(
            f"counter {spec.name} exists with {units(row[0])}; it is declared now with "
            f"{units(spec.scale)}: its values and pending deltas are in other units. Drop "
            "the counter (pgcounters drop) and install it again, or give it another name"
        )
    conn.execute(
        query("record_spec"),
        {
            "name": spec.name,
            "fingerprint": spec.fingerprint,
            "definition": Jsonb(spec.to_json()),
            "probe": probe_query(spec).as_string(conn),
            "rows_delta": rows_delta_sql(spec, conn),
        },
    )


def follow(conn: Conn, name: str | None = None) -> list[str]:
    """Make recorded counters (one, or all) count every partition and inheritance child of
    their tables: a descendant gets the counter's triggers and its rows counted; a table that
    left the tree loses them and its rows' contribution. Returns what was done.

    :func:`install` and Django's migrate call it; so does the database itself after each
    ``CREATE TABLE`` or ``ALTER TABLE`` where the schema was installed by a superuser.
    """
    with translated(), conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(query("follow_descendants"), {"name": name, "apply": True})
        row = cur.fetchone()
    return list(row[0]) if row and row[0] else []


def _stale(conn: Conn) -> dict[str, str]:
    with translated(), conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(query("stale_counters"))
        rows = cur.fetchall()
    return {
        name: f"{reason} ({statements} statements since {since:%Y-%m-%d %H:%M:%S%z}): recount it"
        for name, reason, since, statements in rows
    }


def set_replica_writes(conn: Conn, name: str, mode: ReplicaWrites) -> None:
    """What a counter does with rows written by a session with ``session_replication_role =
    replica`` (logical replication's apply, some restore tools), which PostgreSQL's triggers
    do not see by default: ``"flag"`` (the default) marks the counter stale until a recount;
    ``"count"`` fires its triggers in every mode, for a replica of the counted tables whose
    counters are not replicated with them."""
    check_name(name)
    if mode not in ("flag", "count"):
        raise InvalidCounterDefinition(f"replica writes are 'flag' or 'count', not {mode!r}")
    with translated(), conn.transaction():
        conn.execute(query("set_replica_writes"), {"name": name, "mode": mode})


def _unfollowed(conn: Conn) -> dict[str, list[str]]:
    with translated(), conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(query("follow_descendants"), {"name": None, "apply": False})
        row = cur.fetchone()
    out: dict[str, list[str]] = {}
    for action in list(row[0]) if row and row[0] else []:
        # "count <table> in <name>" or "uncount <table> from <name>": a counter name has no
        # space, a table's (quoted) may
        verb, _, rest = action.partition(" ")
        head, _, name = rest.rpartition(" ")
        table = head.rsplit(" ", 1)[0]
        out.setdefault(name, []).append(
            f"{table} {'is not counted' if verb == 'count' else 'left the table but is counted'}"
        )
    return out


def broken(conn: Conn, table: str) -> dict[str, str]:
    """The counters installed on ``table`` (a qualified name) that a schema change broke,
    with the error their probe gives."""
    with translated(), conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(query("broken_specs"), {"table": table})
        row = cur.fetchone()
    pairs = list(row[0]) if row and row[0] else []
    return dict(zip(pairs[::2], pairs[1::2], strict=True))


# what planning a probe raises when its table changed under it
_SCHEMA_CHANGED = (
    psycopg.errors.UndefinedColumn,
    psycopg.errors.UndefinedTable,
    psycopg.errors.UndefinedFunction,
    psycopg.errors.DatatypeMismatch,
    psycopg.errors.CannotCoerce,
)


def check_not_broken(conn: Conn, spec: CounterSpec) -> None:
    """Raise :class:`CounterBroken` naming the counter when its source table no longer has
    what it reads (verify and recount call it before reading the truth)."""
    try:
        with conn.transaction(), conn.cursor() as cur:
            cur.execute(sql.SQL(query("explain")).format(statement=probe_query(spec)))
    except psycopg.Error as exc:
        if not isinstance(exc, _SCHEMA_CHANGED):
            mapped = translate(exc)
            raise exc if mapped is None else mapped from exc
        raise CounterBroken(
            f"counter {spec.name} no longer matches table {spec.source}: "
            f"{exc.diag.message_primary or exc}; install it again to match the table "
            "(for Django models: makemigrations and migrate), or undo the change"
        ) from exc


def install(conn: Conn, specs: Iterable[CounterSpec], *, backfill: bool = True) -> list[str]:
    """Validate, declare and install counters, all or none (one transaction). Idempotent.

    Each spec gets its target declared (``pgcounters.targets``), its
    triggers created or replaced (four on the source table; for a counter
    column, two guards on the parent table), and its definition recorded.
    Returns the names installed. A counter whose triggers were delivered another way (by
    Django migrations through django-pgtrigger, say) is refused with
    :class:`CounterDeliveredElsewhere`: two sets of triggers would count twice.

    A counter installed for the first time or with another definition is
    marked for a backfill in the same transaction (its values must count the
    rows already there). With ``backfill`` (the default) it then runs, batch by
    batch, when the connection is not in a transaction; otherwise the worker
    or ``pgcounters backfill`` runs it (:mod:`pgcounters.backfill`).
    """
    from pgcounters import backfill as backfills

    chosen = list(specs)
    _check_unique(chosen)
    schema.check(conn)
    changed: list[str] = []
    with translated(), conn.transaction():
        present = installed(conn)
        _refuse_other_deliveries(chosen, present)
        _drop_moved(conn, chosen, present)
        before = {s.name: s.fingerprint for s in declared(conn)}
        for spec in chosen:
            validate(conn, spec)
            compiled = compile_spec(spec)
            replace_changed_target(conn, spec)
            conn.execute(sql.SQL(query("select_call")).format(call=ensure_target_call(spec)))
            conn.execute(compiled.install_sql())
            record(conn, spec)
            # counted again: a counter new or changed, or one whose triggers were disabled
            # or dropped (the rows written meanwhile went uncounted)
            if before.get(spec.name) != spec.fingerprint or _missed_writes(spec, present):
                backfills.request(conn, spec)
                changed.append(spec.name)
            follow(conn, spec.name)
        conn.execute(query("refresh_target_ids"))
    if backfill and changed and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
        backfills.run(conn, changed)
    return [spec.name for spec in chosen]


def _missed_writes(spec: CounterSpec, present: Sequence[InstalledTrigger]) -> bool:
    """Whether the installed triggers of ``spec`` (``present``: every counter trigger) may
    have let writes go uncounted: one is disabled, or an event has none."""
    own = [t for t in present if t.spec_name == spec.name and not t.follower]
    if not own:
        return False  # never installed: counted from scratch as a new counter
    events = {t.event for t in own}
    return any(not t.enabled for t in own) or any(e not in events for e in events_of(spec))


def as_compiled(conn: Conn, spec: CounterSpec, recorded: Mapping[str, str]) -> bool:
    """Whether every trigger of ``spec`` is installed, enabled, with the function this
    version compiles, and the spec recorded (``recorded``: name -> fingerprint of the
    recorded specs): installing it again would change nothing (and would only take locks
    on its tables)."""
    compiled = compile_spec(spec).triggers
    params = {
        "names": [t.name for t in compiled],
        "tables": [(t.table or spec.source).identifier().as_string(conn) for t in compiled],
        "sources": [t.function_source() for t in compiled],
    }
    with conn.cursor(row_factory=tuple_row) as cur:
        row = cur.execute(query("triggers_as_compiled"), params).fetchone()
    return (
        row is not None and row[0] == len(compiled) and recorded.get(spec.name) == spec.fingerprint
    )


def changed_target_params(spec: CounterSpec, *, declared: bool = False) -> dict[str, Any]:
    """The parameters of the statement ``drop_changed_target`` for ``spec`` (``declared``:
    the counter of that name is known to be a declared one, its spec record gone already)."""
    schema_name, table, column, key_column = target_place(spec)
    return {
        "name": spec.name,
        "key_types": list(spec.key_types),
        "schema": schema_name,
        "table": table,
        "column": column,
        "key_column": key_column,
        "scale": spec.scale,
        "declared": declared,
    }


def replace_changed_target(conn: Conn, spec: CounterSpec) -> bool:
    """Drop the counter of a recorded declaration whose target is defined otherwise (other
    key types, another column, other decimal places): its values and pending deltas are in
    another shape, ``ensure_target`` refuses it (and with it every write the new triggers
    count), and the backfill that follows a changed definition counts it again. A counter
    that was never declared here (made by ``create_counter``) is left to its owner.
    Returns whether it was dropped."""
    with conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(query("drop_changed_target"), changed_target_params(spec))
        return cur.fetchone() is not None


def _refuse_other_deliveries(
    specs: Sequence[CounterSpec], present: Sequence[InstalledTrigger]
) -> None:
    wanted = {spec.name for spec in specs}
    ours = {
        trigger_name(name, event)
        for name in wanted
        for event in EVENTS + GUARD_EVENTS + ALL_VIA_EVENTS
    }
    others = sorted(
        (t.spec_name, t.trigger) for t in present if t.spec_name in wanted and t.trigger not in ours
    )
    if others:
        name, first = others[0]
        raise CounterDeliveredElsewhere(
            f"counter {name} is already kept by triggers installed another way ({first}"
            f"{f' and {len(others) - 1} more' if len(others) > 1 else ''}); "
            "installing it again would count every row twice: keep one delivery "
            "(for Django models, the migrations) or uninstall the other first"
        )


def _on_source(spec: CounterSpec, t: InstalledTrigger) -> bool:
    """True when the trigger is on the table it belongs on (a guard: the target's)."""
    table = spec.source
    if t.event in GUARD_EVENTS and isinstance(spec.target, ColumnTarget):
        table = spec.target.table
    if t.event in ALL_VIA_EVENTS:  # a trigger of a path's table: step N's
        step = int(t.event[3])
        if step > len(spec.via):
            return False
        table = spec.via[step - 1].table
    return (t.schema, t.table) == (table.schema, table.name)


def _drop_moved(
    conn: Conn,
    specs: Sequence[CounterSpec],
    present: Sequence[InstalledTrigger],
) -> None:
    """A counter declared again over another table: its triggers on the old table go."""
    by_name = {spec.name: spec for spec in specs}
    for t in present:
        spec = by_name.get(t.spec_name)
        if spec is not None and not t.follower and not _on_source(spec, t):
            conn.execute(
                sql.SQL(query("drop_trigger")).format(
                    trigger=sql.Identifier(t.trigger), table=sql.Identifier(t.schema, t.table)
                )
            )


def uninstall(conn: Conn, name: str, *, drop_values: bool = False) -> bool:
    """Remove a counter's triggers (found in the catalog) and its recorded spec.

    With ``drop_values`` the counter itself goes too (stored values and pending
    deltas). Returns False when nothing was installed under that name.
    """
    check_name(name)
    with translated(), conn.transaction():
        found = [t for t in installed(conn) if t.spec_name == name]
        for t in found:
            conn.execute(
                sql.SQL(query("drop_trigger")).format(
                    trigger=sql.Identifier(t.trigger), table=sql.Identifier(t.schema, t.table)
                )
            )
        for schema_name, table in sorted({(t.schema, t.table) for t in found if t.follower}):
            # a followed descendant's BEFORE TRUNCATE trigger
            conn.execute(
                sql.SQL(query("drop_trigger_if_exists")).format(
                    trigger=sql.Identifier(trigger_name(name, "truncate")),
                    table=sql.Identifier(schema_name, table),
                )
            )
        for event in EVENTS + GUARD_EVENTS + ALL_VIA_EVENTS:
            conn.execute(
                sql.SQL(query("drop_trigger_function")).format(
                    function=sql.Identifier("pgcounters", trigger_name(name, event))
                )
            )
        cur = conn.execute(query("forget_spec"), {"name": name})
        recorded = cur.rowcount > 0
        conn.execute(named("recount.sql")["backfill_cancel"], (name,))
        dropped = False
        if drop_values:
            row = conn.execute(query("drop_counter"), {"name": name}).fetchone()
            dropped = bool(row and row[0])
    return bool(found) or recorded or dropped


def installed(conn: Conn) -> list[InstalledTrigger]:
    """Every trigger compiled by pgcounters in this database."""
    out: list[InstalledTrigger] = []
    with translated(), conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(query("counter_triggers"))
        for nsp, table, trigger, enabled, source, follower in cur.fetchall():
            match = MARKER_RE.search(source)
            if match is None:  # pragma: no cover - the query selects on the marker
                continue
            out.append(
                InstalledTrigger(
                    nsp,
                    table,
                    trigger,
                    bool(enabled),
                    match["name"],
                    match["event"],
                    match["fingerprint"],
                    bool(follower),
                    source,
                )
            )
    return out


def declared(conn: Conn) -> list[CounterSpec]:
    """The specs recorded in ``pgcounters.specs``."""
    with translated(), conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(query("declared_specs"))
        return [CounterSpec.from_json(_as_dict(row[0])) for row in cur.fetchall()]


def spec(conn: Conn, name: str) -> CounterSpec:
    """The recorded spec of one counter."""
    for found in declared(conn):
        if found.name == name:
            return found
    raise UnknownCounter(f"no counter spec named {name!r} is recorded in this database")


def select_declared(conn: Conn, names: Sequence[str] = ()) -> list[CounterSpec]:
    """The recorded specs named, in the order given, each once; with no names, all of
    them in name order. An unknown name raises :class:`UnknownCounter` naming every
    unknown one (and the declared ones), before anything is done with the others."""
    found = {spec.name: spec for spec in declared(conn)}
    if not names:
        return [found[name] for name in sorted(found)]
    unknown = [name for name in names if name not in found]
    if unknown:
        raise UnknownCounter(
            f"no declared counter named {', '.join(unknown)} is recorded in this database"
            + (f" (declared: {', '.join(sorted(found))})" if found else "")
        )
    return [found[name] for name in dict.fromkeys(names)]


def drift(conn: Conn, specs: Iterable[CounterSpec] | None = None) -> list[Drift]:
    """Compare declared specs (default: the recorded ones) with the installed triggers.

    A counter is ``installed`` when its four triggers exist, are enabled and
    carry its fingerprint; ``outdated`` when some carry another fingerprint or sit on
    another table than the spec's source;
    ``missing`` when some are absent; ``disabled`` when some are disabled; ``broken`` when
    a schema change left the table without what the counter reads (its writes fail);
    ``stale`` when rows were written that it did not count (``session_replication_role =
    replica``) and no whole recount or completed backfill followed.
    Installed triggers of a counter that is not declared are ``undeclared``.
    """
    wanted = list(declared(conn) if specs is None else specs)
    by_name: dict[str, list[InstalledTrigger]] = {}
    for t in installed(conn):
        if not t.follower:  # followed descendants: see _unfollowed below
            by_name.setdefault(t.spec_name, []).append(t)
    broken_on: dict[tuple[str, str], dict[str, str]] = {}
    for t in (t for found in by_name.values() for t in found):
        if (t.schema, t.table) not in broken_on:
            broken_on[(t.schema, t.table)] = broken(
                conn, sql.Identifier(t.schema, t.table).as_string(conn)
            )
    unfollowed = _unfollowed(conn)
    missed = _stale(conn)
    out: list[Drift] = []
    for s in wanted:
        reason = broken_on.get((s.source.schema, s.source.name), {}).get(s.name)
        if reason is None and isinstance(s.target, ColumnTarget):  # the parent table changed
            reason = broken_on.get((s.target.table.schema, s.target.table.name), {}).get(s.name)
        for step in s.via:  # a table of its path changed
            if reason is None:
                reason = broken_on.get((step.table.schema, step.table.name), {}).get(s.name)
        if reason is not None and s.name in by_name:
            by_name.pop(s.name)
            out.append(Drift(s.name, "broken", f"the table changed under it: {reason}"))
            continue
        if s.name in unfollowed:
            by_name.pop(s.name, None)
            out.append(Drift(s.name, "missing", "; ".join(unfollowed[s.name])))
            continue
        if s.name in missed:
            by_name.pop(s.name, None)
            out.append(Drift(s.name, "stale", missed[s.name]))
            continue
        found = by_name.pop(s.name, [])
        events = {t.event for t in found}
        stale = sorted(
            t.trigger for t in found if t.fingerprint != s.fingerprint or not _on_source(s, t)
        )
        off = sorted(t.trigger for t in found if not t.enabled)
        absent = [e for e in events_of(s) if e not in events]
        earlier = _compiled_earlier(s, found)
        if stale:
            out.append(Drift(s.name, "outdated", f"triggers from another definition: {stale}"))
        elif absent:
            out.append(Drift(s.name, "missing", f"no trigger for {', '.join(absent)}"))
        elif off:  # before an earlier version's: writes went uncounted, whatever the version
            out.append(Drift(s.name, "disabled", f"disabled triggers: {off}"))
        elif earlier:
            out.append(
                Drift(
                    s.name,
                    "outdated",
                    f"triggers compiled by an earlier version of pgcounters: {earlier}; "
                    "install them again (Django: makemigrations, then migrate)",
                )
            )
        else:
            out.append(Drift(s.name, "installed", f"{len(found)} triggers, {s.fingerprint}"))
    for name, found in sorted(by_name.items()):
        tables = sorted({f"{t.schema}.{t.table}" for t in found})
        out.append(Drift(name, "undeclared", f"triggers on {', '.join(tables)}"))
    return out


def _compiled_earlier(spec: CounterSpec, found: Sequence[InstalledTrigger]) -> list[str]:
    """The triggers of ``spec`` whose function does not hold the body this version compiles
    (installed by an earlier version: they count the same, in an earlier way)."""
    bodies = {t.event: t.body for t in compile_spec(spec).triggers}
    return sorted(t.trigger for t in found if t.event in bodies and bodies[t.event] not in t.source)


@contextmanager
def paused(conn: Conn, *names: str) -> Iterator[None]:
    """Counting is paused on this connection for the named counters (default: all).

    For bulk imports: rows written meanwhile on this connection are not
    counted. Run a recount afterwards (:func:`pgcounters.recount`).
    Other connections keep counting.
    """
    for name in names:
        check_name(name)
    with translated():
        row = conn.execute(query("get_paused")).fetchone()
        before = str(row[0]) if row else ""
        conn.execute(query("set_paused"), {"value": ",".join(names) if names else "all"})
    try:
        yield
    finally:
        if not conn.closed and conn.info.transaction_status in (
            psycopg.pq.TransactionStatus.IDLE,
            psycopg.pq.TransactionStatus.INTRANS,
        ):
            conn.execute(query("set_paused"), {"value": before})


def _check_unique(specs: Sequence[CounterSpec]) -> None:
    seen: set[str] = set()
    for s in specs:
        if not isinstance(s, CounterSpec):
            raise InvalidArgument(f"expected a CounterSpec, got {s!r}")
        if s.name in seen:
            raise InvalidCounterDefinition(f"counter {s.name} is declared twice")
        seen.add(s.name)


def _as_dict(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        value = json.loads(value)
    if not isinstance(value, dict):
        raise InvalidCounterDefinition(f"a recorded spec is not an object: {value!r}")
    return value
