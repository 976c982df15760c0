"""Installing declared counters (specs) on a database, and finding drift.

Plain-SQL users call :func:`install` / :func:`uninstall` with a psycopg
connection; the Django app delivers the same compiled trigger bodies through
django-pgtrigger migrations and records the specs with :func:`record`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

import psycopg
from psycopg import sql
from psycopg.rows import tuple_row
from psycopg.types.json import Jsonb

from pgcounters import schema
from pgcounters.compiler import (
    EVENTS,
    GUARD_EVENTS,
    MARKER_RE,
    compile_spec,
    ensure_target_call,
    events_of,
    trigger_name,
    truth_query,
)
from pgcounters.dberrors import translate, translated
from pgcounters.errors import CounterDeliveredElsewhere, InvalidCounterDefinition, UnknownCounter
from pgcounters.keys import check_name
from pgcounters.specs import ColumnTarget, CounterSpec
from pgcounters.sqlfiles import query

State: TypeAlias = Literal["installed", "outdated", "missing", "disabled", "undeclared"]


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


@dataclass(frozen=True)
class Drift:
    """How the installed triggers of one counter compare with its declaration."""

    name: str
    state: State
    detail: str

    @property
    def ok(self) -> bool:
        return self.state == "installed"


def validate(conn: psycopg.Connection[Any], spec: CounterSpec) -> None:
    """Check against the database that the spec's SQL compiles (EXPLAIN of its truth query)."""
    try:
        with conn.transaction(), conn.cursor() as cur:
            cur.execute(sql.SQL("EXPLAIN ") + truth_query(spec))
    except psycopg.Error as exc:
        mapped = translate(exc)
        if mapped is not None and not isinstance(mapped, InvalidCounterDefinition):
            raise mapped from exc
        message = exc.diag.message_primary or str(exc)
        raise InvalidCounterDefinition(
            f"counter {spec.name}: its definition does not compile against table "
            f"{spec.source}: {message}"
        ) from exc


def record(conn: psycopg.Connection[Any], spec: CounterSpec) -> None:
    """Record the spec in ``pgcounters.specs`` (for verify, recount and drift)."""
    conn.execute(
        query("record_spec"),
        {"name": spec.name, "fingerprint": spec.fingerprint, "definition": Jsonb(spec.to_json())},
    )


def install(
    conn: psycopg.Connection[Any], specs: Iterable[CounterSpec], *, backfill: bool = True
) -> list[str]:
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
            conn.execute(sql.SQL("SELECT {}").format(ensure_target_call(spec)))
            conn.execute(compiled.install_sql())
            record(conn, spec)
            if before.get(spec.name) != spec.fingerprint:
                backfills.request(conn, spec)
                changed.append(spec.name)
    if backfill and changed and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
        backfills.run(conn, changed)
    return [spec.name for spec in chosen]


def _refuse_other_deliveries(
    specs: Sequence[CounterSpec], present: Sequence[InstalledTrigger]
) -> None:
    wanted = {spec.name for spec in specs}
    ours = {trigger_name(name, event) for name in wanted for event in EVENTS + GUARD_EVENTS}
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
    return (t.schema, t.table) == (table.schema, table.name)


def _drop_moved(
    conn: psycopg.Connection[Any],
    specs: Sequence[CounterSpec],
    present: Sequence[InstalledTrigger],
) -> None:
    """A counter declared again over another table: its triggers on the old table go."""
    by_name = {spec.name: spec for spec in specs}
    for t in present:
        spec = by_name.get(t.spec_name)
        if spec is not None and not _on_source(spec, t):
            conn.execute(
                sql.SQL("DROP TRIGGER {} ON {}").format(
                    sql.Identifier(t.trigger), sql.Identifier(t.schema, t.table)
                )
            )


def uninstall(conn: psycopg.Connection[Any], name: str, *, drop_values: bool = False) -> bool:
    """Remove a counter's triggers (found in the catalog) and its recorded spec.

    With ``drop_values`` the counter itself goes too (stored values and pending
    deltas). Returns False when nothing was installed under that name.
    """
    check_name(name)
    with translated(), conn.transaction():
        found = [t for t in installed(conn) if t.spec_name == name]
        for t in found:
            conn.execute(
                sql.SQL("DROP TRIGGER {} ON {}").format(
                    sql.Identifier(t.trigger), sql.Identifier(t.schema, t.table)
                )
            )
        for event in EVENTS + GUARD_EVENTS:
            conn.execute(
                sql.SQL("DROP FUNCTION IF EXISTS {}()").format(
                    sql.Identifier("pgcounters", trigger_name(name, event))
                )
            )
        cur = conn.execute(query("forget_spec"), {"name": name})
        recorded = cur.rowcount > 0
        conn.execute("DELETE FROM pgcounters.backfills WHERE name = %s", (name,))
        dropped = False
        if drop_values:
            row = conn.execute("SELECT pgcounters.drop_counter(%s)", (name,)).fetchone()
            dropped = bool(row and row[0])
    return bool(found) or recorded or dropped


def installed(conn: psycopg.Connection[Any]) -> list[InstalledTrigger]:
    """Every trigger compiled by pgcounters in this database."""
    out: list[InstalledTrigger] = []
    with translated(), conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(query("counter_triggers"))
        for nsp, table, trigger, enabled, source in cur.fetchall():
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
                )
            )
    return out


def declared(conn: psycopg.Connection[Any]) -> list[CounterSpec]:
    """The specs recorded in ``pgcounters.specs``."""
    with translated(), conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(query("declared_specs"))
        return [CounterSpec.from_json(_as_dict(row[0])) for row in cur.fetchall()]


def spec(conn: psycopg.Connection[Any], name: str) -> CounterSpec:
    """The recorded spec of one counter."""
    for found in declared(conn):
        if found.name == name:
            return found
    raise UnknownCounter(f"no counter spec named {name!r} is recorded in this database")


def drift(conn: psycopg.Connection[Any], specs: Iterable[CounterSpec] | None = None) -> list[Drift]:
    """Compare declared specs (default: the recorded ones) with the installed triggers.

    A counter is ``installed`` when its four triggers exist, are enabled and
    carry its fingerprint; ``outdated`` when some carry another fingerprint or sit on
    another table than the spec's source;
    ``missing`` when some are absent; ``disabled`` when some are disabled.
    Installed triggers of a counter that is not declared are ``undeclared``.
    """
    wanted = list(declared(conn) if specs is None else specs)
    by_name: dict[str, list[InstalledTrigger]] = {}
    for t in installed(conn):
        by_name.setdefault(t.spec_name, []).append(t)
    out: list[Drift] = []
    for s in wanted:
        found = by_name.pop(s.name, [])
        events = {t.event for t in found}
        stale = sorted(
            t.trigger for t in found if t.fingerprint != s.fingerprint or not _on_source(s, t)
        )
        off = sorted(t.trigger for t in found if not t.enabled)
        absent = [e for e in events_of(s) if e not in events]
        if stale:
            out.append(Drift(s.name, "outdated", f"triggers from another definition: {stale}"))
        elif absent:
            out.append(Drift(s.name, "missing", f"no trigger for {', '.join(absent)}"))
        elif off:
            out.append(Drift(s.name, "disabled", f"disabled triggers: {off}"))
        else:
            out.append(Drift(s.name, "installed", f"{len(found)} triggers, {s.fingerprint}"))
    for name, found in sorted(by_name.items()):
        tables = sorted({f"{t.schema}.{t.table}" for t in found})
        out.append(Drift(name, "undeclared", f"triggers on {', '.join(tables)}"))
    return out


@contextmanager
def paused(conn: psycopg.Connection[Any], *names: str) -> Iterator[None]:
    """Counting is paused on this connection for the named counters (default: all).

    For bulk imports: rows written meanwhile on this connection are not
    counted. Run a recount afterwards (:func:`pgcounters.recount.recount`).
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
            raise InvalidCounterDefinition(f"expected a CounterSpec, got {s!r}")
        if s.name in seen:
            raise InvalidCounterDefinition(f"counter {s.name} is declared twice")
        seen.add(s.name)


def _as_dict(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        value = json.loads(value)
    if not isinstance(value, dict):
        raise InvalidCounterDefinition(f"a recorded spec is not an object: {value!r}")
    return value
