"""``pgcounters status``: what an operator needs to see, as one typed snapshot.

:func:`get_status` reads, in a few statements, the queue depth and the age of
the oldest pending delta (lag) per queue and per counter, the recent apply
rate and totals (from ``pgcounters.drain_stats``, written once per batch by
the drain), the size, live and dead tuples of every table pgcounters writes
to, the installed schema version, the connected workers and the wake-up
setting. The snapshot renders as text, JSON and the Prometheus text
exposition format (:func:`prometheus`).

The report ends with sections (installed vs declared triggers, deltas set
aside and retries, backfills), listed in :data:`_SECTIONS`: a section is
collected with the same connection and rendered in all three formats.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal, Protocol

import psycopg
from psycopg.rows import tuple_row

from pgcounters import horizon, schema
from pgcounters.config import connect
from pgcounters.connection import Conn
from pgcounters.dberrors import translated
from pgcounters.errors import ConfigurationError, PgCountersError, SchemaNotInstalled
from pgcounters.sqlfiles import named
from pgcounters.worker import APPLICATION_NAME

logger = logging.getLogger("pgcounters.status")

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

WINDOWS_MINUTES: tuple[int, ...] = (1, 5, 15)
"""The windows of the recent apply rate."""

MetricType = Literal["gauge", "counter"]
Labels = tuple[tuple[str, str], ...]


def _ops(name: str) -> str:
    return named("operations.sql")[name]


@dataclass(frozen=True)
class Metric:
    """One Prometheus metric family: its samples share a name, help and type."""

    name: str
    help: str
    type: MetricType
    samples: tuple[tuple[Labels, float], ...]


class Section(Protocol):
    """A part of the status report, rendered in every format."""

    @property
    def name(self) -> str: ...

    def as_json(self) -> object: ...

    def lines(self) -> list[str]: ...

    def metrics(self) -> list[Metric]: ...


SectionCollector = Callable[[Conn], Section]


def _queue_label(unlogged: bool) -> str:
    return "unlogged" if unlogged else "logged"


# -- the snapshot -------------------------------------------------------------


@dataclass(frozen=True)
class QueueStatus:
    """One queue: how many deltas wait, and for how long the oldest has."""

    queue: Literal["logged", "unlogged"]
    depth: int
    oldest_age: float | None
    """Seconds since the oldest pending delta was queued; None when the queue is empty."""


@dataclass(frozen=True)
class CounterStatus:
    """Pending deltas of one counter."""

    counter: str
    mode: str | None
    """None for deltas of a counter dropped while they were in flight."""
    pending_logged: int
    pending_unlogged: int
    oldest_age: float | None

    @property
    def pending(self) -> int:
        return self.pending_logged + self.pending_unlogged


@dataclass(frozen=True)
class TableStatus:
    """Size and bloat of one table pgcounters writes to."""

    schema: str
    table: str
    role: str
    """``queue``, ``counters``, ``internal`` or ``counter columns`` (a user table)."""
    unlogged: bool
    total_bytes: int
    """Table, indexes and TOAST (``pg_total_relation_size``)."""
    table_bytes: int
    live_tuples: int
    dead_tuples: int
    last_vacuum: dt.datetime | None
    """The later of the last manual and automatic vacuum."""
    vacuums: int

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.table}"

    @property
    def dead_ratio(self) -> float:
        total = self.live_tuples + self.dead_tuples
        return self.dead_tuples / total if total else 0.0


@dataclass(frozen=True)
class DrainStatus:
    """Drain statistics of one queue."""

    queue: Literal["logged", "unlogged"]
    rates: dict[int, float]
    """Deltas applied per second over the last N minutes, by N."""
    batches_total: int
    deltas_total: int
    keys_total: int
    seconds_total: float
    """Time spent inside drain batches."""
    last_minute: dt.datetime | None
    """Start of the last minute in which this queue was drained."""


@dataclass(frozen=True)
class WorkerConnection:
    pid: int
    application_name: str
    state: str | None
    backend_start: dt.datetime | None


@dataclass(frozen=True)
class Status:
    """A snapshot of pgcounters in one database (see :func:`get_status`)."""

    taken_at: dt.datetime
    schema_installed: int | None
    schema_expected: int
    queues: tuple[QueueStatus, ...]
    counters: tuple[CounterStatus, ...]
    tables: tuple[TableStatus, ...]
    drain: tuple[DrainStatus, ...]
    """Empty when the installed schema predates the drain statistics."""
    workers: tuple[WorkerConnection, ...]
    wakeup_interval: float | None
    """Seconds between wake-up notifications; None when wake-ups are off."""
    sections: tuple[Section, ...] = field(default=())

    @property
    def schema_current(self) -> bool:
        return self.schema_installed == self.schema_expected

    @property
    def depth(self) -> int:
        return sum(q.depth for q in self.queues)

    @property
    def lag(self) -> float:
        """Seconds since the oldest pending delta of any queue was queued (0 when empty)."""
        ages = [q.oldest_age for q in self.queues if q.oldest_age is not None]
        return max(ages, default=0.0)

    def queue(self, name: Literal["logged", "unlogged"]) -> QueueStatus:
        return next(q for q in self.queues if q.queue == name)

    def counter(self, name: str) -> CounterStatus:
        return next(c for c in self.counters if c.counter == name)

    def table(self, qualified: str) -> TableStatus:
        return next(t for t in self.tables if t.qualified == qualified)

    def as_json(self) -> dict[str, object]:
        def plain(obj: object) -> object:
            if isinstance(obj, dt.datetime):
                return obj.isoformat()
            if isinstance(obj, dict):
                return {str(k): plain(v) for k, v in obj.items()}
            if isinstance(obj, list | tuple):
                return [plain(v) for v in obj]
            return obj

        out: dict[str, object] = {
            "taken_at": self.taken_at.isoformat(),
            "schema": {
                "installed": self.schema_installed,
                "expected": self.schema_expected,
                "current": self.schema_current,
            },
            "depth": self.depth,
            "lag_seconds": self.lag,
            "queues": [asdict(q) for q in self.queues],
            "counters": [{**asdict(c), "pending": c.pending} for c in self.counters],
            "drain": [plain(asdict(d)) for d in self.drain],
            "tables": [
                plain({**asdict(t), "dead_ratio": round(t.dead_ratio, 4)}) for t in self.tables
            ],
            "workers": [plain(asdict(w)) for w in self.workers],
            "wakeup_interval_seconds": self.wakeup_interval,
        }
        for section in self.sections:
            out[section.name] = section.as_json()
        return out


# -- collecting -----------------------------------------------------------------


def get_status(conn: Conn) -> Status:
    """Collect a :class:`Status` through ``conn`` (read-only; a few statements).

    Needs the schema installed; works on an older or newer installed version
    too (so it can report the mismatch), without the drain statistics when
    they are not installed yet. The queues are scanned once each (count and
    oldest delta per counter): cheap for the queue sizes of a healthy system,
    about 100 ms per million pending deltas.
    """
    state = schema.state(conn)
    if state.installed is None:
        raise SchemaNotInstalled()
    with translated(), conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(_ops("status_clock"))
        taken_at = _one(cur)[0]
        cur.execute(_ops("status_counters"))
        declared = {str(name): str(mode) for name, mode in cur.fetchall()}
        cur.execute(_ops("status_pending"))
        pending = cur.fetchall()
        cur.execute(_ops("status_tables"))
        tables = tuple(
            TableStatus(
                schema=r[0], table=r[1], role=r[2], unlogged=bool(r[3]),
                total_bytes=int(r[4]), table_bytes=int(r[5]), live_tuples=int(r[6]),
                dead_tuples=int(r[7]), last_vacuum=r[8], vacuums=int(r[9]),
            )
            for r in cur.fetchall()
        )  # fmt: skip
        cur.execute(_ops("status_workers"), {"prefix": APPLICATION_NAME + "%"})
        workers = tuple(WorkerConnection(int(r[0]), r[1], r[2], r[3]) for r in cur.fetchall())
        cur.execute(_ops("operations_installed"))
        drain: tuple[DrainStatus, ...] = ()
        wakeup: float | None = None
        if _one(cur)[0]:
            drain = _drain_status(cur)
            cur.execute(_ops("wakeup_interval"))
            ms = _one(cur)[0]
            wakeup = None if ms is None else int(ms) / 1000
    queues, counters = _pending(declared, pending)
    sections = tuple(collect(conn) for collect in _SECTIONS.values())
    return Status(
        taken_at=taken_at,
        schema_installed=state.installed,
        schema_expected=state.expected,
        queues=queues,
        counters=counters,
        tables=tables,
        drain=drain,
        workers=workers,
        wakeup_interval=wakeup,
        sections=sections,
    )


def _one(cur: psycopg.Cursor[tuple[Any, ...]]) -> tuple[Any, ...]:
    row = cur.fetchone()
    assert row is not None
    return row


def _pending(
    declared: dict[str, str], rows: Sequence[tuple[Any, ...]]
) -> tuple[tuple[QueueStatus, ...], tuple[CounterStatus, ...]]:
    per_counter: dict[str, list[Any]] = {
        name: [mode, 0, 0, None] for name, mode in declared.items()
    }
    depth = {False: 0, True: 0}
    oldest: dict[bool, float | None] = {False: None, True: None}
    for name, mode, unlogged, deltas, age in rows:
        entry = per_counter.setdefault(name, [mode, 0, 0, None])
        entry[2 if unlogged else 1] += int(deltas)
        entry[3] = age if entry[3] is None else max(entry[3], age)
        depth[unlogged] += int(deltas)
        current = oldest[unlogged]
        oldest[unlogged] = age if current is None else max(current, age)
    queues = tuple(
        QueueStatus(_queue_label(u), depth[u], oldest[u])  # type: ignore[arg-type]
        for u in (False, True)
    )
    counters = tuple(
        CounterStatus(name, mode, logged, unlogged, age)
        for name, (mode, logged, unlogged, age) in sorted(per_counter.items())
    )
    return queues, counters


def _drain_status(cur: psycopg.Cursor[tuple[Any, ...]]) -> tuple[DrainStatus, ...]:
    cur.execute(_ops("status_drain"), {"windows": list(WINDOWS_MINUTES)})
    rates: dict[bool, dict[int, float]] = {False: {}, True: {}}
    for unlogged, minutes, deltas, seconds in cur.fetchall():
        rates[unlogged][int(minutes)] = int(deltas) / seconds if seconds > 0 else 0.0
    cur.execute(_ops("status_drain_totals"))
    out: list[DrainStatus] = []
    for unlogged, batches, deltas, keys, seconds, last in cur.fetchall():
        out.append(
            DrainStatus(
                queue=_queue_label(unlogged),  # type: ignore[arg-type]
                rates=rates[unlogged],
                batches_total=int(batches),
                deltas_total=int(deltas),
                keys_total=int(keys),
                seconds_total=float(seconds),
                last_minute=last,
            )
        )
    return tuple(out)


# -- rendering ------------------------------------------------------------------


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _size(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"  # pragma: no cover - the loop returns at GB


format_age = _age
"""Seconds as a short human-readable duration ("-" for None)."""
format_size = _size
"""Bytes as a short human-readable size."""


def text(status: Status) -> str:
    """The human-readable report."""
    s = status
    version = f"schema version {s.schema_installed}"
    if not s.schema_current:
        version += f" (this code expects {s.schema_expected}: run `pgcounters upgrade`)"
    lines = [
        f"pgcounters status at {s.taken_at:%Y-%m-%d %H:%M:%S %Z}".rstrip(),
        version,
        f"workers connected: {len(s.workers)}"
        + (f" ({', '.join(str(w.pid) for w in s.workers)})" if s.workers else ""),
        "wake-ups: "
        + ("off (workers poll)" if s.wakeup_interval is None else f"every {s.wakeup_interval:g} s"),
        "",
        "queue      pending   oldest    applied/s (" + " / ".join(
            f"{m}m" for m in WINDOWS_MINUTES) + ")   applied in total",
    ]  # fmt: skip
    drain = {d.queue: d for d in s.drain}
    for q in s.queues:
        d = drain.get(q.queue)
        rates = " / ".join(f"{d.rates.get(m, 0):,.0f}" for m in WINDOWS_MINUTES) if d else "-"
        total = f"{d.deltas_total:,} in {d.batches_total:,} batches" if d else "-"
        lines.append(f"{q.queue:<9} {q.depth:>8,}   {_age(q.oldest_age):>8}   {rates:<22} {total}")
    busy = [c for c in s.counters if c.pending]
    lines += ["", "pending by counter:" if busy else "pending by counter: none"]
    for c in busy:
        lines.append(
            f"  {c.counter}  {c.pending:,} pending (logged {c.pending_logged:,}, "
            f"unlogged {c.pending_unlogged:,}), oldest {_age(c.oldest_age)}"
        )
    lines += ["", "tables                                  size     live      dead  last vacuum"]
    for t in s.tables:
        vac = "never" if t.last_vacuum is None else f"{t.last_vacuum:%Y-%m-%d %H:%M:%S}"
        lines.append(
            f"  {t.qualified:<34} {_size(t.total_bytes):>9} {t.live_tuples:>8,} "
            f"{t.dead_tuples:>9,}  {vac}"
        )
    for section in s.sections:
        lines += ["", *section.lines()]
    return "\n".join(lines)


def to_json(status: Status) -> str:
    return json.dumps(status.as_json(), indent=2, sort_keys=False)


def metrics(status: Status) -> list[Metric]:
    """The snapshot as Prometheus metric families."""
    s = status

    def gauge(name: str, help_text: str, samples: Iterable[tuple[Labels, float]]) -> Metric:
        return Metric(f"pgcounters_{name}", help_text, "gauge", tuple(samples))

    def counter(name: str, help_text: str, samples: Iterable[tuple[Labels, float]]) -> Metric:
        return Metric(f"pgcounters_{name}", help_text, "counter", tuple(samples))

    def q(label: str) -> Labels:
        return (("queue", label),)

    def tbl(t: TableStatus) -> Labels:
        return (("table", t.qualified), ("role", t.role))

    out = [
        gauge("up", "1 when the status could be read from PostgreSQL.", [((), 1)]),
        gauge("schema_version", "Installed schema version.", [((), s.schema_installed or 0)]),
        gauge("schema_expected_version", "Schema version this code expects.",
              [((), s.schema_expected)]),
        gauge("queue_depth", "Deltas waiting in the queue.",
              [(q(x.queue), x.depth) for x in s.queues]),
        gauge("queue_oldest_age_seconds",
              "Age of the oldest pending delta (lag); 0 when the queue is empty.",
              [(q(x.queue), x.oldest_age or 0.0) for x in s.queues]),
        gauge("counter_pending_deltas", "Deltas of one counter waiting in a queue.",
              [((("counter", c.counter), ("queue", label)), n)
               for c in s.counters
               for label, n in (("logged", c.pending_logged), ("unlogged", c.pending_unlogged))]),
        gauge("counter_oldest_age_seconds",
              "Age of the oldest pending delta of one counter; 0 when none is pending.",
              [((("counter", c.counter),), c.oldest_age or 0.0) for c in s.counters]),
        gauge("workers", "Worker connections to this database.", [((), len(s.workers))]),
        gauge("wakeup_interval_seconds", "Wake-up notification interval; 0 when off.",
              [((), s.wakeup_interval or 0.0)]),
    ]  # fmt: skip
    if s.drain:
        out += [
            gauge("drain_rate_deltas_per_second",
                  "Deltas applied per second over the last window.",
                  [((("queue", d.queue), ("window", f"{m}m")), rate)
                   for d in s.drain for m, rate in sorted(d.rates.items())]),
            counter("drained_deltas_total", "Deltas applied since install.",
                    [(q(d.queue), d.deltas_total) for d in s.drain]),
            counter("drain_batches_total", "Drain batches that applied deltas, since install.",
                    [(q(d.queue), d.batches_total) for d in s.drain]),
            counter("drain_seconds_total", "Time spent in drain batches, since install.",
                    [(q(d.queue), d.seconds_total) for d in s.drain]),
        ]  # fmt: skip
    out += [
        gauge("table_size_bytes", "Table size with indexes and TOAST.",
              [(tbl(t), t.total_bytes) for t in s.tables]),
        gauge("table_live_tuples", "Live tuples (statistics collector estimate).",
              [(tbl(t), t.live_tuples) for t in s.tables]),
        gauge("table_dead_tuples", "Dead tuples waiting for vacuum (estimate).",
              [(tbl(t), t.dead_tuples) for t in s.tables]),
        gauge("table_last_vacuum_timestamp_seconds",
              "Unix time of the last vacuum or autovacuum; 0 if never.",
              [(tbl(t), t.last_vacuum.timestamp() if t.last_vacuum else 0.0)
               for t in s.tables]),
    ]  # fmt: skip
    for section in s.sections:
        out += section.metrics()
    return out


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _value(v: float) -> str:
    if isinstance(v, bool):
        return str(int(v))
    if isinstance(v, int):
        return str(v)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


def render_metrics(families: Iterable[Metric]) -> str:
    """Prometheus text exposition format (version 0.0.4)."""
    lines: list[str] = []
    for m in families:
        help_text = m.help.replace("\\", "\\\\").replace("\n", "\\n")
        lines += [f"# HELP {m.name} {help_text}", f"# TYPE {m.name} {m.type}"]
        for labels, value in m.samples:
            rendered = ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels)
            lines.append(f"{m.name}{{{rendered}}} {_value(value)}" if labels else
                         f"{m.name} {_value(value)}")  # fmt: skip
    return "\n".join(lines) + "\n"


def prometheus(status: Status) -> str:
    """The snapshot in the Prometheus text exposition format."""
    return render_metrics(metrics(status))


def down_metrics() -> str:
    """What a metrics endpoint serves when PostgreSQL cannot be read."""
    return render_metrics(
        [Metric("pgcounters_up", "1 when the status could be read from PostgreSQL.", "gauge",
                (((), 0),))]
    )  # fmt: skip


# -- a tiny HTTP endpoint ---------------------------------------------------------


def make_server(dsn: str, host: str = "127.0.0.1", port: int = 9187) -> ThreadingHTTPServer:
    """An HTTP server (standard library only) for monitoring systems.

    ``GET /metrics`` serves the Prometheus exposition, ``GET /status.json`` the
    JSON report, ``GET /`` the text report. Every request reads a fresh
    snapshot on its own connection; when PostgreSQL cannot be read,
    ``/metrics`` still answers, with ``pgcounters_up 0``. An address it cannot
    listen on (unknown host, port in use or out of range) raises
    :class:`~pgcounters.errors.ConfigurationError`.
    """

    class Handler(BaseHTTPRequestHandler):
        server_version = "pgcounters-status"

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            renderers: dict[str, tuple[str, Callable[[Status], str]]] = {
                "/metrics": (PROMETHEUS_CONTENT_TYPE, prometheus),
                "/status.json": ("application/json", to_json),
                "/": ("text/plain; charset=utf-8", text),
            }
            if path not in renderers:
                self._send(404, "text/plain; charset=utf-8", "not found\n")
                return
            content_type, render = renderers[path]
            try:
                with connect(dsn, connect_timeout=5, application_name="pgcounters status") as c:
                    body = render(get_status(c))
            except (PgCountersError, psycopg.Error) as exc:
                logger.warning("status could not be read: %s", exc)
                if path == "/metrics":
                    self._send(200, content_type, down_metrics())
                else:
                    self._send(503, "text/plain; charset=utf-8", f"error: {exc}\n")
                return
            self._send(200, content_type, body if body.endswith("\n") else body + "\n")

        def _send(self, code: int, content_type: str, body: str) -> None:
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            logger.debug("%s " + format, self.address_string(), *args)

    try:
        return ThreadingHTTPServer((host, port), Handler)
    except (OSError, OverflowError) as exc:
        # an unknown host, a port in use or out of range: said, not a traceback
        raise ConfigurationError(f"cannot serve status on {host}:{port}: {exc}") from exc


# -- the triggers section: installed vs declared ------------------------------------

TRIGGER_STATES: tuple[str, ...] = (
    "installed",
    "outdated",
    "missing",
    "disabled",
    "broken",
    "stale",
    "undeclared",
)
"""The states of :func:`pgcounters.triggers.drift`, in the order they are reported."""


@dataclass(frozen=True)
class TriggerDrift:
    """How the installed triggers of one counter compare with its recorded declaration."""

    counter: str
    state: str
    detail: str


@dataclass(frozen=True)
class TriggersSection:
    """Installed vs declared triggers of every declared counter (a status section)."""

    counters: tuple[TriggerDrift, ...]
    available: bool = True
    """False when the installed schema predates recorded declarations."""
    name: str = "triggers"

    @property
    def drifted(self) -> tuple[TriggerDrift, ...]:
        return tuple(c for c in self.counters if c.state != "installed")

    def as_json(self) -> object:
        return {
            "available": self.available,
            "ok": not self.drifted,
            "drifted": len(self.drifted),
            "counters": [asdict(c) for c in self.counters],
        }

    def lines(self) -> list[str]:
        if not self.available:
            return ["triggers: not known (the installed schema has no recorded declarations)"]
        declared = sum(1 for c in self.counters if c.state != "undeclared")
        if not self.counters:
            return ["triggers: no declared counters"]
        if not self.drifted:
            return [f"triggers: {declared} declared counters, all installed"]
        out = [
            f"triggers: {declared} declared counters, {len(self.drifted)} drifted "
            "(install them again; Django: `manage.py makemigrations`, then `migrate`)"
        ]
        width = max(len(c.counter) for c in self.drifted)
        out += [f"  {c.counter:<{width}}  {c.state:<10}  {c.detail}" for c in self.drifted]
        return out

    def metrics(self) -> list[Metric]:
        return [
            Metric(
                "pgcounters_trigger_drift",
                "1 for the state of a counter's triggers (installed, outdated, missing, "
                "disabled, broken, stale, undeclared), 0 for the other states.",
                "gauge",
                tuple(
                    ((("counter", c.counter), ("state", state)), int(c.state == state))
                    for c in self.counters
                    for state in TRIGGER_STATES
                ),
            ),
            Metric(
                "pgcounters_triggers_drifted",
                "Counters whose triggers are not installed as declared.",
                "gauge",
                (((), len(self.drifted)),),
            ),
        ]


def collect_triggers(conn: Conn) -> TriggersSection:
    """The ``triggers`` section: :func:`pgcounters.triggers.drift` of the recorded specs."""
    from pgcounters import triggers

    installed = schema.state(conn).installed
    if installed is None or installed < SPECS_SCHEMA_VERSION:
        return TriggersSection((), available=False)
    found = triggers.drift(conn)
    return TriggersSection(tuple(TriggerDrift(d.name, d.state, d.detail) for d in found))


SPECS_SCHEMA_VERSION = 2
"""The schema version that added recorded declarations (``pgcounters.specs``)."""

# -- deltas set aside, rows left busy, retried batches (schema version 8) ---------


@dataclass(frozen=True)
class QuarantineGroup:
    """Deltas of one counter set aside for one kind of error."""

    counter: str
    sqlstate: str
    error: str
    deltas: int
    oldest: dt.datetime


@dataclass(frozen=True)
class RetryCount:
    operation: str
    reason: str
    retries: int
    last_at: dt.datetime


@dataclass(frozen=True)
class ReliabilitySection:
    """What the drain set aside, left for later, and which batches were retried."""

    quarantined: tuple[QuarantineGroup, ...]
    retries: tuple[RetryCount, ...]
    busy_total: dict[str, int]
    """Per queue: deltas left queued because their parent rows were busy, since install."""
    quarantined_total: dict[str, int]
    """Per queue: deltas set aside by the drain, since install."""
    available: bool = True
    name: str = "reliability"

    @property
    def quarantined_deltas(self) -> int:
        return sum(g.deltas for g in self.quarantined)

    def as_json(self) -> object:
        return {
            "available": self.available,
            "quarantined_deltas": self.quarantined_deltas,
            "quarantine": [{**asdict(g), "oldest": g.oldest.isoformat()} for g in self.quarantined],
            "retries": [{**asdict(r), "last_at": r.last_at.isoformat()} for r in self.retries],
            "busy_total": self.busy_total,
            "quarantined_total": self.quarantined_total,
        }

    def lines(self) -> list[str]:
        if not self.available:
            return ["quarantine: not known (the installed schema predates it)"]
        out: list[str] = []
        if not self.quarantined:
            out.append("quarantine: empty")
        else:
            out.append(
                f"quarantine: {self.quarantined_deltas:,} deltas set aside "
                "(`pgcounters quarantine list`, then `replay` or `discard`)"
            )
            for g in self.quarantined:
                out.append(f"  {g.counter}  {g.deltas:,} deltas  [{g.sqlstate}] {g.error}")
        busy = sum(self.busy_total.values())
        out.append(f"left for later (parent row busy), since install: {busy:,} deltas")
        if not self.retries:
            out.append("retried batches: none")
        else:
            out.append("retried batches:")
            for r in self.retries:
                out.append(
                    f"  {r.operation}: {r.retries:,} ({r.reason}), last at "
                    f"{r.last_at:%Y-%m-%d %H:%M:%S}"
                )
        return out

    def metrics(self) -> list[Metric]:
        return [
            Metric(
                "pgcounters_quarantined_deltas",
                "Deltas set aside because they could not be applied (pgcounters quarantine).",
                "gauge",
                tuple(
                    ((("counter", g.counter), ("sqlstate", g.sqlstate)), g.deltas)
                    for g in self.quarantined
                )
                or (((), 0),),
            ),
            Metric(
                "pgcounters_quarantined_deltas_total",
                "Deltas the drain set aside, since install.",
                "counter",
                tuple(((("queue", k),), v) for k, v in sorted(self.quarantined_total.items())),
            ),
            Metric(
                "pgcounters_busy_deltas_total",
                "Deltas left queued for a later batch because their parent row was busy.",
                "counter",
                tuple(((("queue", k),), v) for k, v in sorted(self.busy_total.items())),
            ),
            Metric(
                "pgcounters_retried_batches_total",
                "Batches PostgreSQL aborted (deadlock, serialization failure, lock or "
                "statement timeout) that were retried.",
                "counter",
                tuple(
                    ((("operation", r.operation), ("reason", r.reason)), r.retries)
                    for r in self.retries
                ),
            ),
        ]


RELIABILITY_SCHEMA_VERSION = 8
"""The schema version that added the quarantine and the retry counts."""


def collect_reliability(conn: Conn) -> ReliabilitySection:
    """The ``reliability`` section: quarantine, busy rows, retried batches."""
    installed = schema.state(conn).installed
    if installed is None or installed < RELIABILITY_SCHEMA_VERSION:
        return ReliabilitySection((), (), {}, {}, available=False)
    with translated(), conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(_ops("status_quarantine"))
        groups = tuple(
            QuarantineGroup(str(r[0]), str(r[1]), str(r[2]), int(r[3]), r[4])
            for r in cur.fetchall()
        )
        cur.execute(_ops("status_retries"))
        retries = tuple(RetryCount(str(r[0]), str(r[1]), int(r[2]), r[3]) for r in cur.fetchall())
        cur.execute(_ops("status_drain_aside"))
        busy: dict[str, int] = {}
        aside: dict[str, int] = {}
        for unlogged, b, qd in cur.fetchall():
            busy[_queue_label(bool(unlogged))] = int(b)
            aside[_queue_label(bool(unlogged))] = int(qd)
    return ReliabilitySection(groups, retries, busy, aside)


# -- the backfills section: counters being recomputed over existing rows --------------

BACKFILL_SCHEMA_VERSION = 9
"""The schema version that added online backfills (``pgcounters.backfills``)."""


@dataclass(frozen=True)
class BackfillStatus:
    counter: str
    keys_done: int
    seconds: float
    """Since the backfill was requested."""


@dataclass(frozen=True)
class BackfillsSection:
    """Counters whose values are being backfilled (a status section)."""

    counters: tuple[BackfillStatus, ...]
    name: str = "backfills"

    def as_json(self) -> object:
        return {"backfilling": len(self.counters), "counters": [asdict(c) for c in self.counters]}

    def lines(self) -> list[str]:
        if not self.counters:
            return ["backfills: none"]
        out = [f"backfills: {len(self.counters)} counters backfilling (the worker runs them)"]
        out += [
            f"  {c.counter}  backfilling, {c.keys_done} keys done in {c.seconds:.0f}s"
            for c in self.counters
        ]
        return out

    def metrics(self) -> list[Metric]:
        return [
            Metric(
                "pgcounters_backfill_keys_done",
                "Keys done by the backfill of a counter (present while it runs).",
                "gauge",
                tuple(((("counter", c.counter),), c.keys_done) for c in self.counters),
            ),
            Metric(
                "pgcounters_backfills",
                "Counters being backfilled.",
                "gauge",
                (((), len(self.counters)),),
            ),
        ]


def collect_backfills(conn: Conn) -> BackfillsSection:
    """The ``backfills`` section (empty on a schema older than backfills)."""
    installed = schema.state(conn).installed
    if installed is None or installed < BACKFILL_SCHEMA_VERSION:
        return BackfillsSection(())
    rows = conn.execute(_ops("status_backfills")).fetchall()
    return BackfillsSection(tuple(BackfillStatus(r[0], int(r[1]), float(r[2])) for r in rows))


DIRECT_CHANGES_SCHEMA_VERSION = 20


@dataclass(frozen=True)
class DirectChangesSection:
    """Change reports of direct-mode counters (a status section): ``None`` where the
    schema predates them or the role may not read them."""

    listening: int | None
    gone: int | None
    waiting: int | None
    """Notes not yet taken by a reporting worker, at most (read from the id range)."""
    name: str = "direct_changes"

    def as_json(self) -> object:
        return {"listening": self.listening, "gone": self.gone, "waiting": self.waiting}

    def lines(self) -> list[str]:
        if self.listening is None:
            return ["direct-mode change reports: unknown (no right to read them)"]
        line = (
            f"direct-mode change reports: {self.listening} reporting workers, "
            f"{self.waiting or 0:,} notes waiting at most"
        )
        if self.gone:
            line += f", {self.gone} registrations of sessions gone (the next worker forgets them)"
        return [line]

    def metrics(self) -> list[Metric]:
        if self.listening is None:
            return []
        return [
            Metric(
                "pgcounters_direct_change_listeners",
                "Registered reporting workers of direct-mode changes, alive or gone.",
                "gauge",
                (
                    ((("state", "alive"),), self.listening),
                    ((("state", "gone"),), self.gone or 0),
                ),
            ),
            Metric(
                "pgcounters_direct_change_notes",
                "Notes of direct-mode changes waiting for a reporting worker (at most).",
                "gauge",
                (((), self.waiting or 0),),
            ),
        ]


def collect_direct_changes(conn: Conn) -> DirectChangesSection:
    """The ``direct_changes`` section (unknown on an older schema or without the right)."""
    installed = schema.state(conn).installed
    if installed is None or installed < DIRECT_CHANGES_SCHEMA_VERSION:
        return DirectChangesSection(None, None, None)
    readable = conn.execute(_ops("status_direct_changes_readable")).fetchone()
    if not readable or not readable[0]:
        return DirectChangesSection(None, None, None)
    row = conn.execute(_ops("status_direct_changes")).fetchone()
    assert row is not None
    return DirectChangesSection(int(row[0]), int(row[1]), int(row[2]))


# -- what holds back VACUUM ------------------------------------------------------------


@dataclass(frozen=True)
class HorizonSection:
    """The oldest snapshots of the database and what holds them (a status section): while
    one is old, the queue and the counters keep the row versions the drain leaves behind."""

    holders: tuple[horizon.HorizonHolder, ...]
    warning: float = horizon.HORIZON_WARNING
    """Seconds past which a holder is reported as holding the horizon (a worker's default)."""
    name: str = "horizon"

    @property
    def oldest(self) -> horizon.HorizonHolder | None:
        return self.holders[0] if self.holders else None

    def as_json(self) -> object:
        oldest = self.oldest
        return {
            "xid_age": oldest.xid_age if oldest else 0,
            "seconds": oldest.seconds if oldest else None,
            "holders": [
                {**asdict(h), "since": h.since.isoformat() if h.since else None}
                for h in self.holders
            ],
        }

    def lines(self) -> list[str]:
        oldest = self.oldest
        if oldest is None:
            return ["horizon: no open snapshot (VACUUM can remove what the drain leaves)"]
        age = "" if oldest.seconds is None else f"{_age(oldest.seconds)}, "
        held = oldest.seconds is not None and oldest.seconds >= self.warning
        out = [
            f"horizon: the oldest snapshot is {age}{oldest.xid_age:,} transactions old"
            + (" (held: the queue and the counters keep their dead row versions)" if held else "")
        ]
        out += [
            f"  {h.describe()}, {h.xid_age:,} transactions"
            + ("" if h.seconds is None else f", {_age(h.seconds)}")
            for h in self.holders
        ]
        return out

    def metrics(self) -> list[Metric]:
        oldest = self.oldest
        return [
            Metric(
                "pgcounters_horizon_xid_age",
                "Age in transactions of the oldest snapshot that keeps VACUUM from removing "
                "row versions in this database (0 when none).",
                "gauge",
                (((), oldest.xid_age if oldest else 0),),
            ),
            Metric(
                "pgcounters_horizon_seconds",
                "Seconds since the transaction holding the oldest snapshot started (0 when "
                "none; absent when the role may not see it).",
                "gauge",
                ()
                if oldest is not None and oldest.seconds is None
                else (((), oldest.seconds if oldest and oldest.seconds else 0.0),),
            ),
        ]


def collect_horizon(conn: Conn) -> HorizonSection:
    """The ``horizon`` section: :func:`pgcounters.horizon.holders`."""
    return HorizonSection(horizon.holders(conn))


_SECTIONS: dict[str, SectionCollector] = {
    "triggers": collect_triggers,
    "horizon": collect_horizon,
    "reliability": collect_reliability,
    "backfills": collect_backfills,
    "direct_changes": collect_direct_changes,
}
"""The sections of every status report, by name, in the order they are rendered."""
