"""The Python client: declare, increment, read, rank and drain counters.

A :class:`Counters` wraps one psycopg 3 connection (or a pool) and works inside
whatever transaction that connection is in: an increment made in a transaction
that rolls back leaves nothing behind. :class:`AsyncCounters` is the same client
on an ``AsyncConnection`` (or an ``AsyncConnectionPool``): both run the one
implementation of each operation (see :mod:`pgcounters.plans`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json
import logging
import math
import re
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Literal, TypeAlias, TypeVar, cast, get_args

import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from pgcounters import notifications, plans, schema
from pgcounters.connection import Conn
from pgcounters.dberrors import translate, translated
from pgcounters.errors import (
    ConfigurationError,
    CounterOverflow,
    DrainError,
    InvalidArgument,
    InvalidCounterDefinition,
    InvalidDelta,
    InvalidKey,
    ReplicaError,
    ReplicaNotCaughtUp,
    UnknownCounter,
)
from pgcounters.keys import (
    BIGINT_MAX,
    Key,
    KeyType,
    check_delta,
    check_name,
    decode_key,
    encode_key,
    normalize_key_types,
)
from pgcounters.plans import (
    AsyncConn,
    Connection,
    ConnState,
    Execute,
    Plan,
    Row,
    Sleep,
    Transaction,
    fetch_one,
)
from pgcounters.sqlfiles import query

T = TypeVar("T")

Mode: TypeAlias = Literal["queued", "unlogged", "direct"]
MODES: tuple[Mode, ...] = get_args(Mode)
Increment: TypeAlias = tuple[str, object, int]
"""One item of :meth:`Counters.incr_many`: ``(counter name, key, delta)``."""

logger = logging.getLogger("pgcounters.drain")

_MAX_ROWS_PER_STATEMENT = 5000
_ENQUEUE = query("enqueue")  # the statement of a queued increment
INT_MAX = 2**31 - 1  # a drain batch size is an integer parameter of drain_batch()
_DRAIN_RETRIES = 5

MAX_BATCH_SIZE = 500_000
"""The most deltas a drain (:meth:`Counters.drain`, the worker) takes in one batch when a
queue holds more than a batch: a backlog is applied in one larger batch, so that each key
is written once for all of its deltas instead of once per batch."""


def _outside_a_transaction() -> Plan[ConnState]:
    """The connection, refused (DrainError) inside a transaction: a batch commits."""
    conn: ConnState = yield Connection()
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        raise DrainError("drain must run outside a transaction: each batch commits on its own")
    return conn


def batch_for(queued: int, batch_size: int, max_batch_size: int) -> int:
    """The size of the next batch of a queue holding about ``queued`` deltas: ``batch_size``,
    or all of them up to ``max_batch_size`` when more are queued."""
    return max(batch_size, min(queued, max_batch_size, INT_MAX))


def batches_after_refusal(refused: int, batch_size: int) -> int:
    """How many more batches of ``batch_size`` cover the part of a queue that a refused
    batch of ``refused`` deltas covered (the first of them is the one taken instead)."""
    return -(-refused // batch_size) - 1


def check_batch_size(name: str, value: object) -> int:
    """``value`` as a batch size (a positive int of at most 2**31 - 1), or InvalidArgument."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= INT_MAX:
        raise InvalidArgument(f"{name} must be a positive int of at most {INT_MAX}, got {value!r}")
    return value


@dataclass(frozen=True)
class Counter:
    """A declared counter, as stored in ``pgcounters.targets``."""

    id: int
    name: str
    key_types: tuple[KeyType, ...]
    mode: Mode
    table_schema: str | None = None
    table: str | None = None
    column: str | None = None
    key_column: str | None = None
    scale: int | None = None
    """Decimal places of a sum of decimals (its values in units of ``10^-scale``);
    None for an integer counter."""

    @property
    def is_column(self) -> bool:
        """True when the values live in a column of a user table."""
        return self.table is not None

    def _identifiers(self) -> dict[str, sql.Composable]:
        if not (self.table_schema and self.table and self.column and self.key_column):
            raise InvalidCounterDefinition(f"counter {self.name!r} is not a column counter")
        column = sql.SQL("x.{}").format(sql.Identifier(self.column))
        return {
            "table": sql.Identifier(self.table_schema, self.table),
            "column": sql.Identifier(self.column),
            "key_column": sql.Identifier(self.key_column),
            # the stored value in the units of the queues (a decimal column: * 10^scale)
            "units": column
            if self.scale is None
            else sql.SQL("({} * {})").format(column, sql.Literal(10**self.scale)),
        }

    def units(self, delta: object) -> int:
        """A delta in this counter's units: an int for an integer counter; an int or a
        Decimal with at most ``scale`` decimal places for a sum of decimals."""
        if self.scale is None:
            return check_delta(delta)
        if isinstance(delta, bool) or not isinstance(delta, int | Decimal):
            raise InvalidDelta(
                f"counter {self.name} sums decimals: a delta is an int or a Decimal, got {delta!r}"
            )
        try:
            units = Decimal(delta).scaleb(self.scale)
            exact = units == units.to_integral_value()
        except InvalidOperation:
            exact = False
        if not exact:
            raise InvalidDelta(
                f"counter {self.name} keeps {self.scale} decimal places: {delta} has more"
            )
        try:
            return check_delta(int(units))
        except InvalidDelta:
            raise InvalidDelta(
                f"delta {delta} is out of the range of counter {self.name}"
            ) from None

    def composed(self, name: str) -> sql.Composed:
        """The named query with this column target's identifiers quoted in."""
        return sql.SQL(query(name)).format(**self._identifiers())


@dataclass(frozen=True)
class BatchResult:
    """What one drain batch did (:meth:`Counters.drain_queue_batch`)."""

    deltas: int
    """Deltas applied."""
    keys: int
    """Counter values changed."""
    busy: int = 0
    """Deltas left queued because an application transaction held their parent row."""
    quarantined: int = 0
    """Deltas set aside in ``pgcounters.quarantine`` (they could not be applied)."""
    ahead: bool = False
    """With ``busy``: deltas queued before the ones left busy remain."""
    changes: notifications.Changes | None = None
    """With ``changes=True``: counter name -> the keys this batch changed (None for a
    counter of more than ``max_keys`` keys: many keys, not listed)."""
    refused: int = 0
    """A batch of this size held a delta that cannot be applied, and was taken again at
    ``careful_limit`` (what this result reports): the part of the queue it covered is
    drained in batches of that size."""

    @property
    def done(self) -> bool:
        """True when the queue holds nothing this drainer can apply now."""
        return self.deltas == 0 and self.quarantined == 0 and (self.busy == 0 or not self.ahead)


@dataclass(frozen=True)
class DrainResult:
    """What :meth:`Counters.drain` applied."""

    deltas: int
    keys: int
    batches: int
    seconds: float
    busy: int = 0
    """Queued deltas the last batch of each queue left for later (their parent rows were
    busy); those left again are folded into one delta per key."""
    quarantined: int = 0
    """Deltas set aside (see ``pgcounters quarantine``)."""

    @property
    def rate(self) -> float:
        """Deltas applied per second."""
        return self.deltas / self.seconds if self.seconds > 0 else 0.0


def _names(counters: Iterable[Counter]) -> str:
    return ", ".join(sorted({repr(c.name) for c in counters}))


def _row_to_counter(row: Sequence[Any]) -> Counter:
    return Counter(
        id=row[0],
        name=row[1],
        key_types=tuple(row[2]),
        mode=row[3],
        table_schema=row[4],
        table=row[5],
        column=row[6],
        key_column=row[7],
        scale=row[8] if len(row) > 8 else None,
    )


class _CounterPlans:
    """The behaviour of :class:`Counters` and :class:`AsyncCounters`, written once.

    Each operation is a plan (see :mod:`pgcounters.plans`): the two clients only run it,
    on a connection or on one borrowed from a pool. The state kept here (declarations
    looked up, the schema checked, the role's write right) is per client.
    """

    def __init__(self, *, check_schema: bool) -> None:
        self._cache: dict[str, Counter] = {}
        # counters per period: the recorded definition of their periods, by name
        self._buckets: dict[str, tuple[dict[str, Any], str]] = {}
        self._schema_checked = not check_schema
        self._direct_writes: bool | None = None

    # -- declarations -------------------------------------------------------

    def _ensure_schema(self) -> Plan[None]:
        if not self._schema_checked:
            yield from schema.check_plan()
            self._schema_checked = True

    def _create_counter(self, name: str, key: object, mode: Mode) -> Plan[Counter]:
        """Declare a named counter (idempotent for the same definition).

        ``key`` gives the key types: ``None`` for a global counter, ``int`` or
        ``"bigint"`` for a row id, ``(int, datetime.date)`` for a composite key.
        """
        check_name(name)
        key_types = normalize_key_types(key)
        self._check_mode(mode)
        yield from self._ensure_schema()
        yield Execute(
            query("create_counter"), {"name": name, "key_types": list(key_types), "mode": mode}
        )
        self._cache.pop(name, None)
        return (yield from self._counter(name))

    def _create_column_counter(
        self,
        name: str,
        table: str | tuple[str, str],
        column: str,
        key_column: str,
        mode: Mode,
    ) -> Plan[Counter]:
        """Declare a counter kept in ``table.column``, one value per ``key_column``.

        ``table`` is an SQL name, as PostgreSQL reads it, optionally
        schema-qualified (``"blog.article"``; a name that needs quoting is
        written quoted: ``'"My Table"'``), or a ``(schema, table)`` tuple of
        exact names, quoted by the driver. The column must be an integer
        type; the key type is read from the catalog.
        """
        check_name(name)
        self._check_mode(mode)
        for what, value in (("column", column), ("key column", key_column)):
            if not isinstance(value, str) or not value:
                raise InvalidCounterDefinition(f"the {what} must be a non-empty string")
        if isinstance(table, tuple):
            parts = [p for p in table if isinstance(p, str) and p]
            if len(parts) != 2 or len(table) != 2:
                raise InvalidCounterDefinition(
                    f"a table is a name or a (schema, table) tuple, got {table!r}"
                )
            table_name = sql.Identifier(*parts).as_string(None)
        elif isinstance(table, str) and table:
            table_name = table
        else:
            raise InvalidCounterDefinition(f"a table must be a non-empty name, got {table!r}")
        yield from self._ensure_schema()
        try:
            yield Execute(
                query("create_column_counter"),
                {
                    "name": name,
                    "table": table_name,
                    "column": column,
                    "key_column": key_column,
                    "mode": mode,
                },
            )
        except psycopg.Error as exc:
            mapped = translate(exc)
            if mapped is not None:
                raise mapped from exc
            if not isinstance(
                exc, psycopg.ProgrammingError | psycopg.NotSupportedError | psycopg.DataError
            ):
                raise
            # the table name did not parse or name a table (regclass input)
            message = exc.diag.message_primary or str(exc)
            raise InvalidCounterDefinition(
                f"counter {name}: table {table!r}: {message} (write a name that needs quoting "
                "quoted, or pass a (schema, table) tuple)"
            ) from exc
        self._cache.pop(name, None)
        return (yield from self._counter(name))

    def _drop_counter(self, name: str) -> Plan[bool]:
        """Forget a counter, its values and its pending deltas. False if it did not exist."""
        check_name(name)
        yield from self._ensure_schema()
        self._cache.pop(name, None)
        row = yield Execute(query("drop_counter"), {"name": name}, "one")
        return bool(row and row[0])

    def _counter(self, name: str) -> Plan[Counter]:
        """The declaration of ``name`` (cached per client)."""
        cached = self._cache.get(name)
        if cached is not None:
            return cached
        check_name(name)
        yield from self._ensure_schema()
        row = yield Execute(query("target_by_name"), {"name": name}, "one")
        if row is None:
            raise UnknownCounter(f"no counter named {name!r} is declared")
        found = _row_to_counter(row)
        self._cache[name] = found
        return found

    def _counters(self) -> Plan[list[Counter]]:
        """Every declared counter, by name."""
        yield from self._ensure_schema()
        rows = yield Execute(query("list_targets"), fetch="all")
        return [_row_to_counter(r) for r in rows]

    @staticmethod
    def _check_mode(mode: object) -> None:
        if mode not in MODES:
            raise InvalidCounterDefinition(f"mode must be one of {', '.join(MODES)}, got {mode!r}")

    # -- increments ---------------------------------------------------------

    @staticmethod
    def _applying(plan: Plan[T]) -> Plan[T]:
        """A write of a counter column: past its guard, in a transaction (or savepoint)."""

        def guarded() -> Plan[T]:
            yield Execute(query("applying_on"))
            result = yield from plan
            yield Execute(query("applying_off"))
            return result

        result: T = yield Transaction(guarded())
        return result

    @staticmethod
    def _direct_column(counter: Counter, key: str, delta: int) -> Plan[Row | None]:
        """Add to a direct counter column (inside ``_applying``): the row's new value, its
        key noted for a reporting worker by a second statement, once the row is written
        (``note_direct`` notes only the rows this transaction wrote)."""
        row = yield from fetch_one(
            counter.composed("direct_column"), {"delta": _column_delta(counter, delta), "key": key}
        )
        if row is not None and delta != 0:
            yield Execute(query("note_direct_column"), {"target": counter.id, "key": key})
        return row

    def _incr(self, name: str, key: object, delta: int) -> Plan[int | None]:
        """Add ``delta`` to one counter.

        Queued and unlogged counters insert one delta and return None: no lock
        on a shared row, nothing to deadlock on. Direct counters update the
        stored value at once and return it (read-your-write). A sum of decimals
        is added to with :meth:`incr_decimal`.
        """
        params = self._cached_queued(name, key, delta)
        if params is not None:
            if (yield Execute(_ENQUEUE, params, "rowcount")):
                return None
            self._forget(name, params[0])  # nothing written: the counter was dropped since
        counter = yield from self._integer(name)
        units = yield from self._incr_units(counter, key, check_delta(delta))
        return None if units is None else int(units)

    def _forget(self, name: str, stale_id: int) -> None:
        """Forget the cached declaration of ``name`` when it has the id ``stale_id``: the
        statement of an increment wrote nothing, as that counter no longer exists (dropped,
        maybe created again under its name; a new counter has a new id)."""
        cached = self._cache.get(name)
        if cached is not None and cached.id == stale_id:
            self._cache.pop(name, None)
            self._buckets.pop(name, None)

    def _cached_queued(self, name: str, key: object, delta: int) -> tuple[int, str, int] | None:
        """:meth:`_queued`, None when the cached declaration refuses the key: the plan then
        checks the key against the counter of that name (it may have been created again)."""
        try:
            return self._queued(name, key, delta)
        except InvalidKey:
            return None

    def _queued(self, name: str, key: object, delta: int) -> tuple[int, str, int] | None:
        """The parameters of a queued increment's one INSERT (the statement ``_ENQUEUE``),
        when ``name`` is a queued integer counter whose declaration is cached; else None
        (the plan looks it up, or takes another path). Validates the key and the delta.

        The hot path, written once: the plan yields this INSERT, and the clients' ``incr``
        send it at once, without driving a plan, when they can."""
        counter = self._cache.get(name)
        if counter is None or counter.mode != "queued" or counter.scale is not None:
            return None
        encoded = encode_key(key, counter.key_types, name)
        return counter.id, array_literal(encoded), check_delta(delta)

    def _incr_decimal(self, name: str, key: object, delta: Decimal | int) -> Plan[Decimal | None]:
        """Add a Decimal (or an int) to a counter: a sum of decimals takes at most its
        number of decimal places, an integer counter a whole number. Returns the new value
        of a direct counter, None for a queued one."""
        counter = yield from self._counter(name)
        units = yield from self._incr_units(counter, key, counter.units(delta))
        return None if units is None else value_of(counter.scale or 0, units)

    def _incr_units(
        self, counter: Counter, key: object, delta: int, *, again: bool = True
    ) -> Plan[int | None]:
        """Add ``delta`` units; the new value in units for a direct counter."""
        try:
            encoded = encode_key(key, counter.key_types, counter.name)
        except InvalidKey as refused:
            fresh = yield from self._refused_key(counter, refused, again)
            return (yield from self._incr_units(fresh, key, delta, again=False))
        if counter.mode != "direct":
            # the hot path: one INSERT, the key sent as one array-literal parameter
            stmt = query("enqueue" if counter.mode == "queued" else "enqueue_unlogged")
            written = yield Execute(stmt, (counter.id, array_literal(encoded), delta), "rowcount")
            if not written:  # the statement writes only for a counter that exists
                fresh = yield from self._looked_up_again(counter, again)
                return (yield from self._incr_units(fresh, key, delta, again=False))
            return None
        if counter.is_column:
            row = yield from self._applying(self._direct_column(counter, encoded[0], delta))
            return None if row is None else counter.units(row[0])
        if (yield from self._writes_counters()):
            # an UPDATE when the row exists (one statement, like the naive way);
            # the first increment of a key creates it with the upsert
            params = {"delta": delta, "target": counter.id, "key": array_literal(encoded)}
            try:
                row = yield Execute(query("direct_named_update"), params, "one")
                if row is None:
                    row = yield Execute(query("direct_named"), params, "one")
            except psycopg.errors.NumericValueOutOfRange as exc:
                # named, as add_direct names it (SQLSTATE PC008)
                raise CounterOverflow(
                    f"counter {counter.name} key {array_literal(encoded)}: a change of "
                    f"{delta} leaves the range of its values (bigint)"
                ) from exc
            if row is None:  # the counter was dropped since this client looked it up
                fresh = yield from self._looked_up_again(counter, again)
                return (yield from self._incr_units(fresh, key, delta, again=False))
        else:
            # through a SECURITY DEFINER function: a least-privilege role needs
            # no write right on pgcounters.counters (migration 0006)
            row = yield Execute(
                query("direct_named_add"), ([counter.id], [array_literal(encoded)], [delta]), "one"
            )
        return None if row is None else int(row[0])

    def _incr_many(self, items: Iterable[tuple[str, object, int | Decimal]]) -> Plan[int]:
        """Apply many increments in one transaction, with one statement per kind.

        Deltas are summed per counter and key first; every item is validated
        before anything is written, so bad input writes nothing. Returns the
        number of distinct (counter, key) pairs written.
        """
        items = list(items)
        written, dropped = yield from self._incr_many_once(items)
        if dropped:
            # a cached declaration outlived its counter, and nothing was written: once
            # more with the declarations as they are now (a name no longer declared raises
            # UnknownCounter)
            for counter in dropped:
                self._forget(counter.name, counter.id)
            written, dropped = yield from self._incr_many_once(items)
            if dropped:
                raise UnknownCounter(
                    f"counter(s) {_names(dropped)} dropped while incr_many wrote: nothing "
                    "was written"
                )
        return written

    def _incr_many_once(
        self, items: list[tuple[str, object, int | Decimal]]
    ) -> Plan[tuple[int, list[Counter]]]:
        """:meth:`_incr_many` with the declarations cached: the pairs written, and the
        cached counters that no longer exist when it found some (nothing written then)."""
        # netted per (counter id, key): hashing ints and strings, not Counter objects
        netted: dict[tuple[int, tuple[str, ...]], int] = defaultdict(int)
        by_id: dict[int, Counter] = {}
        for item in items:
            try:
                name, key, delta = item
            except (TypeError, ValueError):
                raise InvalidArgument(
                    f"incr_many takes (counter name, key, delta) tuples, got {item!r}"
                ) from None
            counter = yield from self._counter(name)
            by_id[counter.id] = counter
            encoded = tuple(encode_key(key, counter.key_types, name))
            netted[(counter.id, encoded)] += counter.units(delta)
        by_kind: dict[
            Mode | Literal["direct_column"], list[tuple[Counter, tuple[str, ...], int]]
        ] = defaultdict(list)
        for (counter_id, encoded), total in sorted(netted.items()):
            counter = by_id[counter_id]
            check_delta(total)
            if total == 0:
                continue
            kind = (
                "direct_column" if counter.mode == "direct" and counter.is_column else counter.mode
            )
            by_kind[kind].append((counter, encoded, total))
        if not by_kind:
            return 0, []
        single = len(by_kind) == 1 and all(
            k != "direct_column" and len(r) <= _MAX_ROWS_PER_STATEMENT for k, r in by_kind.items()
        )
        writes_counters = "direct" in by_kind and (yield from self._writes_counters())
        if not single:
            # several statements: check first that every counter exists (one statement
            # finding a counter gone after others wrote could not start over)
            ids = sorted(by_id)
            row = yield Execute(query("targets_alive"), {"ids": ids}, "one")
            alive = set(row[0] if row and row[0] else ())
            if len(alive) != len(ids):
                return 0, [c for i, c in by_id.items() if i not in alive]
        gone: list[Counter] = []

        def write() -> Plan[None]:
            for kind, rows in by_kind.items():
                if kind == "direct_column":

                    def columns(rows: list[tuple[Counter, tuple[str, ...], int]]) -> Plan[None]:
                        for counter, encoded, total in rows:
                            yield from self._direct_column(counter, encoded[0], total)

                    yield from self._applying(columns(rows))
                    continue
                if kind == "direct" and not writes_counters:
                    # add_direct refuses (PC003) an id of no counter
                    yield Execute(
                        query("direct_named_add"),
                        (
                            [c.id for c, _, _ in rows],
                            [array_literal(e) for _, e, _ in rows],
                            [total for _, _, total in rows],
                        ),
                    )
                    continue
                table = {
                    "queued": "queue",
                    "unlogged": "queue_unlogged",
                    "direct": "counters",
                }[kind]
                for start in range(0, len(rows), _MAX_ROWS_PER_STATEMENT):
                    chunk = rows[start : start + _MAX_ROWS_PER_STATEMENT]
                    written = yield Execute(
                        _multi_insert(table, len(chunk)), _flatten(chunk), "rowcount"
                    )
                    if written:
                        continue
                    # all or nothing: nothing, as a counter of chunk no longer exists
                    if single:
                        gone.extend(c for c, _, _ in chunk)
                        return
                    # dropped since the check above: the transaction or savepoint of
                    # these statements is rolled back (on a connection outside one and
                    # not in autocommit mode, the transaction they opened is the caller's)
                    raise UnknownCounter(
                        f"counter(s) {_names([c for c, _, _ in chunk])} dropped while "
                        "incr_many wrote"
                    )

        if single:
            yield from write()
            if gone:
                return 0, gone
        else:
            yield from self._atomic(write())
        return sum(len(rows) for rows in by_kind.values()), []

    def _writes_counters(self) -> Plan[bool]:
        """True when this connection's role may write ``pgcounters.counters`` itself.

        Direct named counters are then upserted with one plain statement (the
        fastest path); a least-privilege application role goes through the
        SECURITY DEFINER function ``add_direct`` instead. Asked once per client.
        """
        if self._direct_writes is None:
            row = yield Execute(query("counters_writable"), fetch="one")
            self._direct_writes = bool(row and row[0])
        return self._direct_writes

    @staticmethod
    def _atomic(plan: Plan[T]) -> Plan[T]:
        """All-or-nothing for several statements, without committing the caller's work.

        In autocommit mode: a transaction of its own. Inside a transaction: a
        savepoint. On an idle non-autocommit connection: the transaction the
        first statement opens, which the caller commits or rolls back.
        """
        conn: ConnState = yield Connection()
        idle = conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        if idle and not conn.autocommit:
            return (yield from plan)
        result: T = yield Transaction(plan)
        return result

    # -- reads --------------------------------------------------------------

    def _get(self, name: str, key: object, exact: bool) -> Plan[int]:
        """The value of one counter.

        ``exact=True`` (the default) adds the pending deltas to the stored
        value in one statement, so the result is exact as of one snapshot.
        ``exact=False`` reads the stored value only (cheaper, may lag).
        A sum of decimals is read with :meth:`get_decimal`.
        """
        counter = yield from self._integer(name)
        return int((yield from self._get_units(counter, key, exact)))

    def _get_decimal(self, name: str, key: object, exact: bool) -> Plan[Decimal]:
        """The value of one counter as a :class:`~decimal.Decimal` (a sum of decimals has
        its declared number of decimal places; an integer counter none)."""
        counter = yield from self._counter(name)
        return value_of(counter.scale or 0, (yield from self._get_units(counter, key, exact)))

    def _get_units(
        self, counter: Counter, key: object, exact: bool, *, again: bool = True
    ) -> Plan[int]:
        try:
            encoded = encode_key(key, counter.key_types, counter.name)
        except InvalidKey as refused:
            fresh = yield from self._refused_key(counter, refused, again)
            return (yield from self._get_units(fresh, key, exact, again=False))
        params: dict[str, Any] = {"t": counter.id, "k": encoded}
        if counter.is_column:
            params["v"] = _typed_key_value(counter, encoded[0])
            statement = yield from self._read_query(counter, "exact_column", "stored_column", exact)
            row = yield Execute(counter.composed(statement), params, "one", read=True)
        else:
            statement = yield from self._read_query(counter, "exact_named", "stored_named", exact)
            row = yield Execute(query(statement), params, "one", read=True)
        if row is None or row[0] is None:
            # the counter this client looked up was dropped since: read the one of that
            # name now (re-created, or UnknownCounter), once
            fresh = yield from self._looked_up_again(counter, again)
            return (yield from self._get_units(fresh, key, exact, again=False))
        return int(row[0])

    def _refused_key(self, counter: Counter, refused: InvalidKey, again: bool) -> Plan[Counter]:
        """A key the cached declaration of ``counter`` refused: the counter of that name now,
        when the cached one was dropped since (created again with other key parts, say);
        else the refusal stands."""
        if not again:
            raise refused
        alive = yield Execute(query("target_exists"), {"t": counter.id}, "one", read=True)
        if alive and alive[0]:
            raise refused
        return (yield from self._looked_up_again(counter, True))

    def _looked_up_again(self, stale: Counter, again: bool) -> Plan[Counter]:
        """The counter of ``stale``'s name, looked up again: its cached id named a counter
        that no longer exists (dropped, maybe created again under the same name)."""
        self._cache.pop(stale.name, None)
        self._buckets.pop(stale.name, None)
        if not again:
            raise UnknownCounter(f"counter {stale.name!r} was dropped while it was used")
        fresh = yield from self._counter(stale.name)
        if fresh.scale != stale.scale:
            raise InvalidCounterDefinition(
                f"counter {stale.name!r} was created again with other values "
                f"({'integers' if fresh.scale is None else f'{fresh.scale} decimal places'})"
            )
        return fresh

    def _get_many(self, name: str, keys: Iterable[object], exact: bool) -> Plan[list[int]]:
        """The values of one counter for many keys, in the order given, in one statement."""
        counter = yield from self._integer(name)
        return (yield from self._get_many_units(counter, keys, exact))

    def _get_many_decimal(
        self, name: str, keys: Iterable[object], exact: bool
    ) -> Plan[list[Decimal]]:
        """:meth:`get_many` as Decimals (for a sum of decimals)."""
        counter = yield from self._counter(name)
        scale = counter.scale or 0
        units = yield from self._get_many_units(counter, keys, exact)
        return [value_of(scale, v) for v in units]

    def _get_many_units(
        self, counter: Counter, keys: Iterable[object], exact: bool, *, again: bool = True
    ) -> Plan[list[int]]:
        key_list = list(keys)
        try:
            encoded = [encode_key(k, counter.key_types, counter.name) for k in key_list]
        except InvalidKey as refused:
            fresh = yield from self._refused_key(counter, refused, again)
            return (yield from self._get_many_units(fresh, key_list, exact, again=False))
        if not encoded:
            return []
        if counter.is_column:
            # one statement per key keeps each exact; column targets are rows of a
            # user table, usually read through the ORM instead
            values_in_order: list[int] = []
            for k in key_list:
                values_in_order.append((yield from self._get_units(counter, k, exact)))
            return values_in_order
        statement = yield from self._read_query(
            counter, "exact_named_many", "stored_named_many", exact
        )
        rows = yield Execute(
            query(statement), {"t": counter.id, "keys": json.dumps(encoded)}, "all", read=True
        )
        values: dict[int, int | None] = dict(rows)
        if any(v is None for v in values.values()):  # dropped since it was looked up
            fresh = yield from self._looked_up_again(counter, again)
            return (yield from self._get_many_units(fresh, key_list, exact, again=False))
        return [int(values[i] or 0) for i in range(1, len(encoded) + 1)]

    def _top(self, name: str, n: int) -> Plan[list[tuple[Key, int]]]:
        """The ``n`` keys with the highest stored values, highest first.

        Ranks by stored value (an index scan); deltas not yet drained are not
        included, so drain often when ranking matters. Ties are in the order of the
        key's parts as text (byte order); a counter per period leaves out the periods
        it no longer keeps.
        """
        counter = yield from self._integer(name)
        return (yield from self._top_units(counter, n))

    def _top_decimal(self, name: str, n: int) -> Plan[list[tuple[Key, Decimal]]]:
        """:meth:`top` with Decimal values (for a sum of decimals)."""
        counter = yield from self._counter(name)
        scale = counter.scale or 0
        ranked = yield from self._top_units(counter, n)
        return [(k, value_of(scale, v)) for k, v in ranked]

    def _top_units(self, counter: Counter, n: int) -> Plan[list[tuple[Key, int]]]:
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= BIGINT_MAX:
            raise InvalidArgument(
                f"n must be a non-negative int within the bigint range, got {n!r}"
            )
        if counter.is_column:
            rows = yield Execute(counter.composed("top_column"), {"n": n}, "all", read=True)
            return [(decode_key([str(k)], counter.key_types), int(v or 0)) for k, v in rows]
        rows = yield Execute(query("top_named"), {"t": counter.id, "n": n}, "all", read=True)
        if not rows and n:
            # an empty counter, or one dropped since this client looked it up
            alive = yield Execute(query("target_exists"), {"t": counter.id}, "one", read=True)
            if not (alive and alive[0]):
                fresh = yield from self._looked_up_again(counter, True)
                rows = yield Execute(query("top_named"), {"t": fresh.id, "n": n}, "all", read=True)
                counter = fresh
        return [(decode_key(k, counter.key_types), int(v)) for k, v in rows]

    # -- counters per period ---------------------------------------------------

    def _get_range(self, name: str, key: object, start: dt.date, end: dt.date) -> Plan[int]:
        """The exact value of a counter per period over the periods that start in
        ``[start, end)``, for ``key`` (its key without the period), in one statement.

        ``start`` and ``end`` are aware datetimes, or dates (their midnight in the
        counter's time zone): the last 7 days of a daily counter are
        ``(today - 6 days, today + 1 day)``. Periods no longer kept read 0.
        """
        row: Row | None = yield from self._range_read(name, key, start, end, "range_sum", "one")
        return 0 if row is None else int(row[0])

    def _get_series(
        self, name: str, key: object, start: dt.date, end: dt.date
    ) -> Plan[list[tuple[dt.date, int]]]:
        """One exact value per period that starts in ``[start, end)`` for ``key``,
        zero-filled, in time order, in one statement (a chart's series).

        Each period is named by its start in the counter's time zone: a date for a
        day, week or month, an aware datetime for an hour.
        """
        found: tuple[list[Row], list[tuple[dt.date, str]]] = yield from self._range_read(
            name, key, start, end, "range_values", "all"
        )
        rows, periods = found
        values = {str(bucket): int(v) for bucket, v in rows}
        return [(begins, values.get(text, 0)) for begins, text in periods]

    def _range_read(
        self, name: str, key: object, start: dt.date, end: dt.date, statement: str, fetch: str
    ) -> Plan[Any]:
        """One range read of a counter per period: the key range of the periods from the
        first to the last of ``[start, end)``, read by one static statement (one index
        range scan of each table). The bounds are made here from the counter's recorded
        periods (looked up once per client); the statement checks they still are its
        periods (no row, or a NULL first column, when not: looked up again, once).
        A series (``fetch="all"``) returns its rows and the periods to zero-fill. A read
        that finds nothing checks that the counter still exists (a client's cached id may
        outlive it): when not, the counter of that name now is read, once."""
        counter = yield from self._integer(name)
        params = yield from self._range_params(name, key, start, end, counter=counter)
        attempt = 0
        checked = False
        while attempt < 2:
            recorded = self._buckets.get(name)
            if recorded is None or attempt:
                row = yield Execute(query("bucket_of"), {"name": name}, "one", read=True)
                found = row[0] if row else {}
                # a connection may load jsonb as its text (Django's does)
                loaded = json.loads(found) if isinstance(found, str | bytes) else dict(found)
                recorded = self._buckets[name] = (loaded, json.dumps(loaded))
            bucket, bucket_json = recorded
            period, zone = str(bucket.get("period")), str(bucket.get("time_zone"))
            periods: list[tuple[dt.date, str]] = []
            if fetch == "all":
                periods = self._periods(period, zone, start, end)
                bounds = (periods[0][1], periods[-1][1]) if periods else None
            else:
                bounds = _period_bounds(period, zone, start, end)
            if bounds is None:
                return ([], []) if fetch == "all" else None
            params.update(bucket=bucket_json, first=bounds[0], last=bounds[1])
            # refuses an unlogged counter's exact read on a hot standby, with the others'
            yield from self._read_query(counter, statement, "", True)
            if fetch == "all":
                rows = yield Execute(query(statement), params, "all", read=True)
                found_nothing = not any(v for _, v in rows)
                answered = not any(bucket_text is None for bucket_text, _ in rows)
            else:
                row = yield Execute(query(statement), params, "one", read=True)
                found_nothing = row is None or not row[0]
                answered = row is not None and row[0] is not None
            if found_nothing and not checked:
                checked = True
                alive = yield Execute(query("target_exists"), {"t": counter.id}, "one", read=True)
                if not (alive and alive[0]):
                    counter = yield from self._looked_up_again(counter, True)
                    params = yield from self._range_params(name, key, start, end, counter=counter)
                    continue
            if answered:
                return (rows, periods) if fetch == "all" else row
            attempt += 1
        raise InvalidCounterDefinition(f"counter {name} changed its periods while it was read")

    def _top_range(
        self, name: str, start: dt.date, end: dt.date, n: int = 10
    ) -> Plan[list[tuple[Key, int]]]:
        """The ``n`` keys (without the period) with the highest exact values over the
        periods that start in ``[start, end)``, highest first, in one statement."""
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= BIGINT_MAX:
            raise InvalidArgument(
                f"n must be a non-negative int within the bigint range, got {n!r}"
            )
        counter = yield from self._integer(name)
        params = yield from self._range_params(name, None, start, end, counter=counter, keyed=False)
        params["n"] = n
        rows = yield Execute(query("top_range"), params, "all", read=True)
        return [(decode_key(k, counter.key_types[:-1]), int(v)) for k, v in rows]

    @staticmethod
    def _periods(period: str, zone: str, start: dt.date, end: dt.date) -> list[tuple[dt.date, str]]:
        """The periods that start in ``[start, end)``: their start and key part."""
        if period != "hour" and not isinstance(start, dt.datetime):
            if isinstance(end, dt.datetime):
                end_day = end.astimezone(_zone(zone)).date()
                end_day += dt.timedelta(days=int(_instant(end_day, zone) < end))
            else:
                end_day = end
            return _day_periods(period, start, end_day)
        return bucket_periods(period, zone, _instant(start, zone), _instant(end, zone))

    def _range_params(
        self,
        name: str,
        key: object,
        start: dt.date,
        end: dt.date,
        *,
        counter: Counter | None = None,
        keyed: bool = True,
    ) -> Plan[dict[str, Any]]:
        """The parameters of a read over a range: the key without its period part, the
        ends as instants or as dates of the counter's zone."""
        if counter is None:
            counter = yield from self._integer(name)
        if not counter.key_types:
            raise InvalidCounterDefinition(f"counter {name} is not counted per period")
        params: dict[str, Any] = {"name": name, "t": counter.id}
        if keyed:
            try:
                params["key"] = encode_key(key, counter.key_types[:-1], name)
            except InvalidKey:
                # a counter that is not counted per period is refused for that first
                yield Execute(query("bucket_of"), {"name": name}, "one", read=True)
                raise
        for label, value in (("start", start), ("end", end)):
            if isinstance(value, dt.datetime):
                if value.tzinfo is None or value.utcoffset() is None:
                    raise InvalidArgument(
                        f"{label} must be an aware datetime (or a date of the counter's "
                        f"time zone), got the naive {value!r}"
                    )
                params[label], params[label + "_day"] = value, None
            elif isinstance(value, dt.date):
                params[label], params[label + "_day"] = None, value
            else:
                raise InvalidArgument(f"{label} must be a datetime or a date, got {value!r}")
        return params

    @staticmethod
    def _drop_expired_buckets(limit: int = 10_000) -> Plan[int]:
        """Delete at most ``limit`` stored values of periods that counters per period no
        longer keep (their ``keep``), without waiting for a row another transaction
        holds; returns how many were deleted. The worker calls it once a minute."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= INT_MAX:
            raise InvalidArgument(f"limit must be a positive int below 2**31, got {limit!r}")
        row = yield Execute(query("drop_expired_buckets"), {"limit": limit}, "one")
        return int(row[0]) if row else 0

    def _integer(self, name: str) -> Plan[Counter]:
        """The counter, refused when it sums decimals (read as Decimals: ``*_decimal``)."""
        counter = yield from self._counter(name)
        if counter.scale is not None:
            raise InvalidCounterDefinition(
                f"counter {name} sums decimals ({counter.scale} decimal places): read it "
                "with get_decimal, get_many_decimal or top_decimal, add to it with incr_decimal"
            )
        return counter

    @staticmethod
    def _read_query(counter: Counter, exact_name: str, stored_name: str, exact: bool) -> Plan[str]:
        """The name of the read statement for ``counter`` on the read connection.

        A hot standby cannot plan a statement that names an unlogged table (and
        holds no unlogged rows): there, exact reads of queued and direct
        counters sum the logged queue only, and those of unlogged counters are
        refused. On a primary both queues are summed (a declared counter whose
        mode changed may still have deltas in the other queue).
        """
        if not exact:
            return stored_name
        read_conn: ConnState = yield Connection(read=True)
        if not on_standby(read_conn):
            return exact_name
        if counter.mode == "unlogged":
            raise ReplicaError(
                f"counter {counter.name!r} is unlogged: its pending deltas exist only on the "
                "primary; read it there, or read its stored value here (exact=False)"
            )
        return exact_name + "_logged"

    # -- replicas -------------------------------------------------------------

    @staticmethod
    def _wal_position() -> Plan[str]:
        """The primary's WAL position now (a ``pg_lsn`` as text), taken on ``conn``.

        Taken after a commit, it covers that commit: once a standby has
        replayed up to it (:meth:`wait_for_replay`), reads there see the write.
        """
        row = yield Execute(query("wal_insert_position"), fetch="one")
        assert row is not None
        return str(row[0])

    @staticmethod
    def _wait_for_replay(position: str, timeout: float) -> Plan[float]:
        """Wait until the read connection's server has replayed the WAL up to ``position``.

        Returns the seconds waited. Returns at once on a primary. Raises
        ReplicaNotCaughtUp after ``timeout`` seconds. The read connection must
        take a new snapshot for its next read (autocommit, or Read Committed):
        a Repeatable Read transaction already under way would not see the write.
        """
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not math.isfinite(timeout)
            or timeout < 0
        ):
            # NaN would wait for ever (no comparison with it is true)
            raise InvalidArgument(f"timeout must be a number of seconds >= 0, got {timeout!r}")
        conn: ConnState = yield Connection(read=True)
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE and (
            conn.isolation_level
            in (psycopg.IsolationLevel.REPEATABLE_READ, psycopg.IsolationLevel.SERIALIZABLE)
        ):
            raise ReplicaError(
                "wait_for_replay in a Repeatable Read or Serializable transaction: its snapshot "
                "is already taken and would not show the replayed writes"
            )
        started = time.monotonic()
        # a standby replays a commit within a millisecond or two of the primary's flush: the
        # first polls come quickly, later ones back off to spare a lagging standby
        pause = 0.0002
        while True:
            row = yield Execute(query("replay_reached"), {"lsn": position}, "one", read=True)
            assert row is not None
            in_recovery, reached = row
            waited = time.monotonic() - started
            if not in_recovery or reached:
                return waited
            if waited >= timeout:
                raise ReplicaNotCaughtUp(
                    f"the standby had not replayed up to {position} after {timeout:g} s"
                )
            yield Sleep(min(pause, max(0.0, timeout - waited)))
            pause = min(pause * 1.5, 0.005)

    def _pending(self) -> Plan[tuple[int, int]]:
        """Number of deltas waiting in the (logged, unlogged) queues."""
        yield from self._ensure_schema()
        row = yield Execute(query("pending_counts"), fetch="one")
        assert row is not None
        return int(row[0]), int(row[1])

    # -- draining -----------------------------------------------------------

    def _drain_batch(self, batch_size: int, unlogged: bool) -> Plan[tuple[int, int]]:
        """Apply one batch of at most ``batch_size`` deltas in its own transaction.

        Returns ``(deltas applied, keys updated)``; :meth:`drain_queue_batch`
        also says what was left for later or set aside.
        """
        batch = yield from self._drain_queue_batch(batch_size, unlogged)
        return batch.deltas, batch.keys

    def _drain_queue_batch(
        self,
        batch_size: int,
        unlogged: bool,
        changes: bool = False,
        one_statement: bool = False,
        max_keys: int | None = notifications.MAX_KEYS,
        careful_limit: int | None = None,
    ) -> Plan[BatchResult]:
        """Apply one batch of at most ``batch_size`` deltas in its own transaction.

        Parent rows held by other transactions are not waited for: their deltas
        stay queued for a later batch (``busy``). Deltas that cannot be applied
        are set aside in the quarantine (``quarantined``). Retries the batch when
        PostgreSQL aborts it for a deadlock or a serialization failure (the
        deltas stay queued until a batch commits, so nothing is applied twice);
        each retry is a WARNING of the ``pgcounters.drain`` logger.

        ``changes``: also return which counters and keys the batch changed
        (:mod:`pgcounters.notifications`; two more statements in the batch); a counter
        of more than ``max_keys`` keys is reported as None (many keys), its keys not
        decoded (None: every key listed).

        ``one_statement`` (the worker's rounds): the session runs Read Committed by
        default, so on a connection in autocommit mode the batch is one statement, its
        own transaction: one round trip instead of four. A batch PostgreSQL aborts is
        retried as usual.

        ``careful_limit`` (a backlog taken in one large batch): a batch larger than this
        that holds a delta that cannot be applied is not taken one key at a time (its
        rows would stay locked many times longer); it rolls back, and a batch of
        ``careful_limit`` is taken instead (``BatchResult.refused``).
        """
        check_batch_size("batch size", batch_size)
        careful = careful_limit is not None and batch_size > careful_limit
        if careful:
            assert careful_limit is not None
            try:
                return (
                    yield from self._one_batch(
                        batch_size, unlogged, changes, False, max_keys, careful_limit
                    )
                )
            except psycopg.Error as exc:
                if exc.sqlstate != "PC022":
                    raise
            logger.warning(
                "a batch of %d deltas holds one that cannot be applied: it is taken again in "
                "batches of at most %d", batch_size, careful_limit,
            )  # fmt: skip
            result = yield from self._one_batch(
                careful_limit, unlogged, changes, one_statement, max_keys
            )
            return dataclasses.replace(result, refused=batch_size)
        return (yield from self._one_batch(batch_size, unlogged, changes, one_statement, max_keys))

    def _one_batch(
        self,
        batch_size: int,
        unlogged: bool,
        changes: bool,
        one_statement: bool,
        max_keys: int | None,
        careful_limit: int | None = None,
    ) -> Plan[BatchResult]:
        """One batch of :meth:`_drain_queue_batch`; ``careful_limit`` is set for its
        transaction (a statement of its own, so not ``one_statement``)."""
        conn = yield from _outside_a_transaction()
        if not self._schema_checked:
            # in a transaction of its own: on a connection outside autocommit, a check run
            # bare would open one, and each batch would then be a savepoint in it, not a
            # transaction that commits
            yield Transaction(self._ensure_schema())

        def batch() -> Plan[tuple[Row | None, Row | None]]:
            # a batch is Read Committed whatever the connection's level: at
            # Repeatable Read a drainer fails on every parent row a writer
            # updated since its snapshot, and may fail again on each retry
            yield Execute(query("drain_read_committed"))
            if careful_limit is not None:
                yield Execute(query("careful_limit"), {"limit": str(careful_limit)})
            if changes:
                yield Execute(
                    notifications.statement("note_changes"),
                    {"max_keys": "" if max_keys is None else str(max_keys)},
                )
            row = yield from fetch_one(
                query("drain_queue"), {"limit": batch_size, "unlogged": unlogged}
            )
            noted = (
                (yield from fetch_one(notifications.statement("noted_changes")))
                if changes
                else None
            )
            return row, noted

        first = 0
        if one_statement and not changes and conn.autocommit:
            first = 1
            try:
                row = yield from fetch_one(
                    query("drain_queue"), {"limit": batch_size, "unlogged": unlogged}
                )
                assert row is not None
                return BatchResult(int(row[0]), int(row[1]), int(row[2]), int(row[3]), bool(row[4]))
            except (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure) as exc:
                reason = retry_reason(exc)
                yield from record_retry_plan("drain", reason)
                logger.warning(
                    "drain batch aborted by %s, retrying (attempt 2 of %d)", reason, _DRAIN_RETRIES
                )
                yield Sleep(0.01)
        for attempt in range(first, _DRAIN_RETRIES):
            try:
                row, noted = yield Transaction(batch())
                changed = notifications.decode_noted(noted, max_keys) if changes else None
                assert row is not None
                return BatchResult(
                    int(row[0]), int(row[1]), int(row[2]), int(row[3]), bool(row[4]), changed
                )
            except (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure) as exc:
                reason = retry_reason(exc)
                yield from record_retry_plan("drain", reason)
                if attempt == _DRAIN_RETRIES - 1:
                    raise
                logger.warning(
                    "drain batch aborted by %s, retrying (attempt %d of %d)",
                    reason, attempt + 2, _DRAIN_RETRIES,
                )  # fmt: skip
                yield Sleep(0.01 * (attempt + 1))
        raise AssertionError("unreachable")

    def _drain(
        self,
        batch_size: int,
        max_batch_size: int,
        max_batches: int | None,
        time_limit: float | None,
        stop: Callable[[], bool] | None,
        statement_timeout: float | None,
    ) -> Plan[DrainResult]:
        """Drain both queues until they are empty (or a bound is reached).

        The queues take turns, a batch each, so a busy logged queue does not
        starve the unlogged one when a bound ends the drain; a queue is done
        when a batch finds nothing it can apply (a batch may hold fewer than
        ``batch_size`` deltas while more are queued, see ``drain_batch`` in the
        SQL). Deltas whose parent rows other transactions hold are left queued
        (``DrainResult.busy``): the drain never waits for an application.
        ``stop`` is asked before every batch (e.g. set by a signal handler).

        ``max_batch_size``: a queue holding more than ``batch_size`` deltas is taken in
        one batch of up to this many (each key is then written once for all of its
        deltas: a backlog over many keys drains several times faster); the batch's
        transaction is longer, and holds the rows it changes until it commits. Equal to
        ``batch_size`` (or less), every batch is of ``batch_size``.

        ``statement_timeout``: seconds a batch may run before PostgreSQL cancels
        it (0: no limit), for this drain only: the session's own setting is put
        back when it ends. A batch it cancels rolls back, its deltas stay queued,
        and the drain raises :class:`DrainError` (the batches committed before it
        stay applied).
        """
        if max_batches is not None and (
            isinstance(max_batches, bool) or not isinstance(max_batches, int) or max_batches < 0
        ):
            raise InvalidArgument(f"max_batches must be an int >= 0 or None, got {max_batches!r}")
        if time_limit is not None and (
            isinstance(time_limit, bool)
            or not isinstance(time_limit, int | float)
            or not math.isfinite(time_limit)
            or time_limit < 0
        ):
            raise InvalidArgument(
                f"time_limit must be a number of seconds >= 0 or None, got {time_limit!r}"
            )
        check_batch_size("batch size", batch_size)
        check_batch_size("max_batch_size", max_batch_size)
        sizes = (batch_size, max_batch_size)
        if statement_timeout is None:
            return (yield from self._drain_queues(sizes, max_batches, time_limit, stop))
        if (
            isinstance(statement_timeout, bool)
            or not isinstance(statement_timeout, int | float)
            or not 0 <= statement_timeout <= _MAX_TIMEOUT
        ):
            raise InvalidArgument(
                f"statement_timeout must be zero or more seconds, at most {_MAX_TIMEOUT}, "
                f"got {statement_timeout!r}"
            )
        yield from _outside_a_transaction()
        timeout = f"{round(statement_timeout * 1000)}ms"

        def set_timeout() -> Plan[str]:
            row = yield from fetch_one(query("statement_timeout"))
            yield Execute(query("set_statement_timeout"), {"timeout": timeout})
            return str(row[0]) if row else "0"

        def put_back(previous: str) -> Plan[None]:
            # the session's own timeout again (a connection left broken has no session)
            conn: ConnState = yield Connection()
            if conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
                yield Transaction(
                    plans.execute(query("set_statement_timeout"), {"timeout": previous})
                )

        previous: str = yield Transaction(set_timeout())
        try:
            result = yield from self._drain_queues(sizes, max_batches, time_limit, stop)
        except psycopg.errors.QueryCanceled as exc:
            yield from put_back(previous)
            raise DrainError(
                "a batch was cancelled by the statement timeout and rolled back (its deltas "
                "stay queued): use a smaller (maximum) batch size or a longer statement timeout"
            ) from exc
        except BaseException:
            # a failure, or the task cancelled (asyncio.CancelledError): the connection
            # goes back to its pool, and must not keep this drain's timeout
            yield from put_back(previous)
            raise
        yield from put_back(previous)
        return result

    def _drain_queues(
        self,
        sizes: tuple[int, int],
        max_batches: int | None,
        time_limit: float | None,
        stop: Callable[[], bool] | None,
    ) -> Plan[DrainResult]:
        yield from _outside_a_transaction()
        if not self._schema_checked:
            # before the queues' spans are read (a transaction of its own, as a batch's)
            yield Transaction(self._ensure_schema())
        started = time.perf_counter()
        deltas = keys = batches = quarantined = 0
        busy = [0, 0]
        active = [False, True]
        # batches of batch_size still to take from each queue after a large one was refused
        small = [0, 0]

        def result() -> DrainResult:
            return DrainResult(
                deltas, keys, batches, time.perf_counter() - started, sum(busy), quarantined
            )

        while active:
            for unlogged in tuple(active):
                if max_batches is not None and batches >= max_batches:
                    return result()
                if time_limit is not None and time.perf_counter() - started >= time_limit:
                    return result()
                if stop is not None and stop():
                    return result()
                row = yield Transaction(fetch_one(query("queue_span"), {"unlogged": unlogged}))
                span = int(row[0]) if row else 1
                if span == 0:
                    # an empty queue costs no batch (a bound of one batch drains the other)
                    active.remove(unlogged)
                    continue
                size = sizes[0] if small[unlogged] else batch_for(span, *sizes)
                small[unlogged] = max(small[unlogged] - 1, 0)
                try:
                    batch = yield from self._drain_queue_batch(
                        size, unlogged, careful_limit=sizes[0]
                    )
                except psycopg.errors.QueryCanceled:
                    if size <= sizes[0]:
                        raise
                    # a statement timeout (the session's, a role's) too short for a batch
                    # this large: batches of batch_size from now on, the next one at once
                    logger.warning(
                        "a batch of %d deltas was cancelled by the statement timeout and rolled "
                        "back: batches of %d from now on", size, sizes[0],
                    )  # fmt: skip
                    sizes = (sizes[0], sizes[0])
                    continue
                if batch.refused:
                    # the rest of the part of the queue the refused batch covered, in
                    # batches of batch_size (one of them sets the bad delta aside)
                    small[unlogged] = batches_after_refusal(batch.refused, sizes[0])
                batches += 1
                deltas += batch.deltas
                keys += batch.keys
                quarantined += batch.quarantined
                busy[unlogged] = batch.busy
                if batch.done:
                    active.remove(unlogged)
        return result()


class Counters(_CounterPlans):
    """Counters kept in a PostgreSQL database, through one psycopg connection.

    The connection may be in autocommit mode (each call is its own transaction)
    or not (calls join the current transaction, which the caller commits).

    ``conn`` may also be a ``psycopg_pool.ConnectionPool``: each call then borrows a
    connection for its duration and is a transaction of its own, committed when the
    call returns (the pool's ``connection()`` block). A client on a pool may be shared
    by any number of threads. A client on one connection may be shared by threads
    too (psycopg serializes a connection's statements, and the state the client keeps
    is a cache of declarations), but they then share that connection's transaction:
    give each thread its own connection, or use a pool, when calls must commit or
    roll back independently.

    ``read_conn``: a connection to a hot standby (or any server holding the same
    data) for the reads (``get``, ``get_many``, ``top``); everything else goes
    to ``conn``. Reads there lag the primary by the replication delay: see
    :meth:`wal_position` and :meth:`wait_for_replay` for read-your-writes.
    """

    def __init__(
        self,
        conn: Conn | ConnectionPool[Any],
        *,
        check_schema: bool = True,
        read_conn: Conn | None = None,
    ) -> None:
        super().__init__(check_schema=check_schema)
        self._pool: ConnectionPool[Any] | None = None
        self._conn: Conn | None = None
        if isinstance(conn, psycopg.Connection):
            self._conn = conn
        elif isinstance(conn, ConnectionPool):
            self._pool = conn
        else:
            raise ConfigurationError(
                "Counters takes a psycopg Connection or a psycopg_pool.ConnectionPool, got "
                f"{type(conn).__name__} (for an AsyncConnection, use AsyncCounters)"
            )
        self._read_conn = read_conn

    @property
    def conn(self) -> Conn:
        """The connection the client runs on (not for a client on a pool)."""
        if self._conn is None:
            raise ConfigurationError("this client borrows its connections from a pool")
        return self._conn

    @property
    def read_conn(self) -> Conn:
        """The connection of the reads: ``read_conn`` if given, else ``conn``."""
        return self.conn if self._read_conn is None else self._read_conn

    @property
    def pool(self) -> ConnectionPool[Any] | None:
        """The pool the client borrows its connections from, if it was given one."""
        return self._pool

    def _run(self, plan: Plan[T]) -> T:
        if self._pool is None:
            return plans.run(plan, self.conn, self._read_conn)
        with self._pool.connection() as conn:
            return plans.run(plan, conn, self._read_conn)

    def create_counter(self, name: str, key: object = None, mode: Mode = "queued") -> Counter:
        return self._run(self._create_counter(name, key, mode))

    def create_column_counter(
        self,
        name: str,
        table: str | tuple[str, str],
        column: str,
        key_column: str = "id",
        mode: Mode = "queued",
    ) -> Counter:
        return self._run(self._create_column_counter(name, table, column, key_column, mode))

    def drop_counter(self, name: str) -> bool:
        return self._run(self._drop_counter(name))

    def counter(self, name: str) -> Counter:
        cached = self._cache.get(name)  # the hot path of every call: no plan to run
        return cached if cached is not None else self._run(self._counter(name))

    def counters(self) -> list[Counter]:
        return self._run(self._counters())

    def incr(self, name: str, key: object = None, delta: int = 1) -> int | None:
        params = self._cached_queued(name, key, delta)
        if params is None:
            return self._run(self._incr(name, key, delta))
        # the hot path: the one INSERT of a queued counter, sent as the plan would send it
        if self._pool is None:
            with translated():
                written = self.conn.execute(_ENQUEUE, params).rowcount
        else:
            with self._pool.connection() as conn, translated():
                written = conn.execute(_ENQUEUE, params).rowcount
        if written:
            return None
        # nothing written: the cached counter was dropped since (see _incr)
        self._forget(name, params[0])
        return self._run(self._incr(name, key, delta))

    def incr_decimal(
        self, name: str, key: object = None, delta: Decimal | int = 1
    ) -> Decimal | None:
        return self._run(self._incr_decimal(name, key, delta))

    def incr_many(self, items: Iterable[tuple[str, object, int | Decimal]]) -> int:
        return self._run(self._incr_many(items))

    def get(self, name: str, key: object = None, *, exact: bool = True) -> int:
        return self._run(self._get(name, key, exact))

    def get_decimal(self, name: str, key: object = None, *, exact: bool = True) -> Decimal:
        return self._run(self._get_decimal(name, key, exact))

    def get_many(self, name: str, keys: Iterable[object], *, exact: bool = True) -> list[int]:
        return self._run(self._get_many(name, keys, exact))

    def get_many_decimal(
        self, name: str, keys: Iterable[object], *, exact: bool = True
    ) -> list[Decimal]:
        return self._run(self._get_many_decimal(name, keys, exact))

    def top(self, name: str, n: int = 10) -> list[tuple[Key, int]]:
        return self._run(self._top(name, n))

    def top_decimal(self, name: str, n: int = 10) -> list[tuple[Key, Decimal]]:
        return self._run(self._top_decimal(name, n))

    def get_range(self, name: str, key: object, start: dt.date, end: dt.date) -> int:
        return self._run(self._get_range(name, key, start, end))

    def get_series(
        self, name: str, key: object, start: dt.date, end: dt.date
    ) -> list[tuple[dt.date, int]]:
        return self._run(self._get_series(name, key, start, end))

    def top_range(
        self, name: str, start: dt.date, end: dt.date, n: int = 10
    ) -> list[tuple[Key, int]]:
        return self._run(self._top_range(name, start, end, n))

    def drop_expired_buckets(self, limit: int = 10_000) -> int:
        return self._run(self._drop_expired_buckets(limit))

    def wal_position(self) -> str:
        return self._run(self._wal_position())

    def wait_for_replay(self, position: str, timeout: float = 5.0) -> float:
        return self._run(self._wait_for_replay(position, timeout))

    def pending(self) -> tuple[int, int]:
        return self._run(self._pending())

    def drain_batch(self, batch_size: int = 10_000, *, unlogged: bool = False) -> tuple[int, int]:
        return self._run(self._drain_batch(batch_size, unlogged))

    def drain_queue_batch(
        self,
        batch_size: int = 10_000,
        *,
        unlogged: bool = False,
        changes: bool = False,
        max_keys: int | None = notifications.MAX_KEYS,
    ) -> BatchResult:
        return self._run(self._drain_queue_batch(batch_size, unlogged, changes, max_keys=max_keys))

    def drain(
        self,
        batch_size: int = 10_000,
        *,
        max_batch_size: int = MAX_BATCH_SIZE,
        max_batches: int | None = None,
        time_limit: float | None = None,
        stop: Callable[[], bool] | None = None,
        statement_timeout: float | None = None,
    ) -> DrainResult:
        return self._run(
            self._drain(
                batch_size, max_batch_size, max_batches, time_limit, stop, statement_timeout
            )
        )


class AsyncCounters(_CounterPlans):
    """:class:`Counters` on a psycopg ``AsyncConnection`` or ``AsyncConnectionPool``.

    The same methods, arguments, results and errors, awaited. On a connection,
    calls join its current transaction (or are their own, in autocommit mode); on a
    pool, each call borrows a connection and commits when it returns. A client on a
    pool may be shared by every task of the event loop.
    """

    def __init__(
        self,
        conn: AsyncConn | AsyncConnectionPool[Any],
        *,
        check_schema: bool = True,
        read_conn: AsyncConn | None = None,
    ) -> None:
        super().__init__(check_schema=check_schema)
        self._pool: AsyncConnectionPool[Any] | None = None
        self._conn: AsyncConn | None = None
        if isinstance(conn, psycopg.AsyncConnection):
            self._conn = conn
        elif isinstance(conn, AsyncConnectionPool):
            self._pool = conn
        else:
            raise ConfigurationError(
                "AsyncCounters takes a psycopg AsyncConnection or a "
                f"psycopg_pool.AsyncConnectionPool, got {type(conn).__name__} "
                "(for a Connection, use Counters)"
            )
        self._read_conn = read_conn

    @property
    def conn(self) -> AsyncConn:
        """The connection the client runs on (not for a client on a pool)."""
        if self._conn is None:
            raise ConfigurationError("this client borrows its connections from a pool")
        return self._conn

    @property
    def read_conn(self) -> AsyncConn:
        """The connection of the reads: ``read_conn`` if given, else ``conn``."""
        return self.conn if self._read_conn is None else self._read_conn

    @property
    def pool(self) -> AsyncConnectionPool[Any] | None:
        """The pool the client borrows its connections from, if it was given one."""
        return self._pool

    async def _run(self, plan: Plan[T]) -> T:
        # plans.run_async written out: one coroutine less on every call
        if self._pool is None:
            conn = self.conn
            with translated():
                return await plans.drive_async(
                    plan, conn, conn if self._read_conn is None else self._read_conn
                )
        async with self._pool.connection() as conn:
            with translated():
                return await plans.drive_async(
                    plan, conn, conn if self._read_conn is None else self._read_conn
                )

    async def create_counter(self, name: str, key: object = None, mode: Mode = "queued") -> Counter:
        return await self._run(self._create_counter(name, key, mode))

    async def create_column_counter(
        self,
        name: str,
        table: str | tuple[str, str],
        column: str,
        key_column: str = "id",
        mode: Mode = "queued",
    ) -> Counter:
        return await self._run(self._create_column_counter(name, table, column, key_column, mode))

    async def drop_counter(self, name: str) -> bool:
        return await self._run(self._drop_counter(name))

    async def counter(self, name: str) -> Counter:
        cached = self._cache.get(name)
        return cached if cached is not None else await self._run(self._counter(name))

    async def counters(self) -> list[Counter]:
        return await self._run(self._counters())

    async def incr(self, name: str, key: object = None, delta: int = 1) -> int | None:
        params = self._cached_queued(name, key, delta)
        if params is None:
            return await self._run(self._incr(name, key, delta))
        # the hot path: the one INSERT of a queued counter, sent as the plan would send it
        if self._pool is None:
            with translated():
                written = (await self.conn.execute(_ENQUEUE, params)).rowcount
        else:
            async with self._pool.connection() as conn:
                with translated():
                    written = (await conn.execute(_ENQUEUE, params)).rowcount
        if written:
            return None
        # nothing written: the cached counter was dropped since (see _incr)
        self._forget(name, params[0])
        return await self._run(self._incr(name, key, delta))

    async def incr_decimal(
        self, name: str, key: object = None, delta: Decimal | int = 1
    ) -> Decimal | None:
        return await self._run(self._incr_decimal(name, key, delta))

    async def incr_many(self, items: Iterable[tuple[str, object, int | Decimal]]) -> int:
        return await self._run(self._incr_many(items))

    async def get(self, name: str, key: object = None, *, exact: bool = True) -> int:
        return await self._run(self._get(name, key, exact))

    async def get_decimal(self, name: str, key: object = None, *, exact: bool = True) -> Decimal:
        return await self._run(self._get_decimal(name, key, exact))

    async def get_many(self, name: str, keys: Iterable[object], *, exact: bool = True) -> list[int]:
        return await self._run(self._get_many(name, keys, exact))

    async def get_many_decimal(
        self, name: str, keys: Iterable[object], *, exact: bool = True
    ) -> list[Decimal]:
        return await self._run(self._get_many_decimal(name, keys, exact))

    async def top(self, name: str, n: int = 10) -> list[tuple[Key, int]]:
        return await self._run(self._top(name, n))

    async def top_decimal(self, name: str, n: int = 10) -> list[tuple[Key, Decimal]]:
        return await self._run(self._top_decimal(name, n))

    async def get_range(self, name: str, key: object, start: dt.date, end: dt.date) -> int:
        return await self._run(self._get_range(name, key, start, end))

    async def get_series(
        self, name: str, key: object, start: dt.date, end: dt.date
    ) -> list[tuple[dt.date, int]]:
        return await self._run(self._get_series(name, key, start, end))

    async def top_range(
        self, name: str, start: dt.date, end: dt.date, n: int = 10
    ) -> list[tuple[Key, int]]:
        return await self._run(self._top_range(name, start, end, n))

    async def drop_expired_buckets(self, limit: int = 10_000) -> int:
        return await self._run(self._drop_expired_buckets(limit))

    async def wal_position(self) -> str:
        return await self._run(self._wal_position())

    async def wait_for_replay(self, position: str, timeout: float = 5.0) -> float:
        return await self._run(self._wait_for_replay(position, timeout))

    async def pending(self) -> tuple[int, int]:
        return await self._run(self._pending())

    async def drain_batch(
        self, batch_size: int = 10_000, *, unlogged: bool = False
    ) -> tuple[int, int]:
        return await self._run(self._drain_batch(batch_size, unlogged))

    async def drain_queue_batch(
        self,
        batch_size: int = 10_000,
        *,
        unlogged: bool = False,
        changes: bool = False,
        max_keys: int | None = notifications.MAX_KEYS,
    ) -> BatchResult:
        return await self._run(
            self._drain_queue_batch(batch_size, unlogged, changes, max_keys=max_keys)
        )

    async def drain(
        self,
        batch_size: int = 10_000,
        *,
        max_batch_size: int = MAX_BATCH_SIZE,
        max_batches: int | None = None,
        time_limit: float | None = None,
        stop: Callable[[], bool] | None = None,
        statement_timeout: float | None = None,
    ) -> DrainResult:
        return await self._run(
            self._drain(
                batch_size, max_batch_size, max_batches, time_limit, stop, statement_timeout
            )
        )


def share_docs(plans_class: type, *clients: type) -> None:
    """Give each public method of ``clients`` the docstring of its plan (``_name``)."""
    for client in clients:
        for name, member in vars(client).items():
            if name.startswith("_") or not callable(member) or member.__doc__:
                continue
            plan = getattr(plans_class, "_" + name, None)
            if plan is not None and plan.__doc__:
                member.__doc__ = plan.__doc__


share_docs(_CounterPlans, Counters, AsyncCounters)


_MAX_TIMEOUT = (2**31 - 1) // 1000
"""The longest statement timeout PostgreSQL takes, in whole seconds."""


MAX_PERIODS = 100_000
"""The most periods a read over a range covers."""


def _instant(value: dt.date, zone: str) -> dt.datetime:
    """An end of a range as an instant: an aware datetime as it is, a date at its
    midnight in the counter's zone."""
    if isinstance(value, dt.datetime):
        return value
    return dt.datetime.combine(value, dt.time(), _zone(zone))


def _period_bounds(period: str, zone: str, start: dt.date, end: dt.date) -> tuple[str, str] | None:
    """The key parts of the first and the last period that start in ``[start, end)``
    (None when none does), refused as :func:`_day_periods` refuses a range. Days, weeks
    and months between two dates are found without listing them."""
    if period == "hour" or isinstance(start, dt.datetime) or isinstance(end, dt.datetime):
        periods = _CounterPlans._periods(period, zone, start, end)
        return (periods[0][1], periods[-1][1]) if periods else None
    if start > end:
        raise InvalidArgument(f"a range starts before it ends, got {start} to {end}")
    if (end - start).days > MAX_PERIODS * {"week": 7, "month": 31}.get(period, 1):
        raise InvalidArgument(f"a range spans at most {MAX_PERIODS} periods")
    first, last = start, end - dt.timedelta(days=1) if end > dt.date.min else end
    if period == "week":
        if first.weekday():
            first += dt.timedelta(days=7 - first.weekday())
        last -= dt.timedelta(days=last.weekday())
    elif period == "month":
        if first.day != 1:
            first = (first.replace(day=28) + dt.timedelta(days=4)).replace(day=1)
        last = last.replace(day=1)
    if first >= end or last < first:
        return None
    return first.isoformat(), last.isoformat()


def _day_periods(period: str, start: dt.date, end: dt.date) -> list[tuple[dt.date, str]]:
    """The days, weeks or months that start on a day of ``[start, end)`` (dates of the
    counter's zone: no time zone rule is needed)."""
    if start > end:
        raise InvalidArgument(f"a range starts before it ends, got {start} to {end}")
    if (end - start).days > MAX_PERIODS * {"week": 7, "month": 31}.get(period, 1):
        raise InvalidArgument(f"a range spans at most {MAX_PERIODS} periods")
    day = start
    if period == "week" and day.weekday():
        day += dt.timedelta(days=7 - day.weekday())
    elif period == "month" and day.day != 1:
        day = (day.replace(day=28) + dt.timedelta(days=4)).replace(day=1)
    step = dt.timedelta(days=7 if period == "week" else 1)
    out: list[tuple[dt.date, str]] = []
    while day < end:
        out.append((day, day.isoformat()))
        if period == "month":
            day = (day.replace(day=28) + dt.timedelta(days=4)).replace(day=1)
        else:
            day += step
    return out


def bucket_periods(
    period: str, zone: str, start: dt.datetime, end: dt.datetime
) -> list[tuple[dt.date, str]]:
    """The periods of a counter per period that start in ``[start, end)``, in time order:
    each as its start in ``zone`` (a date for a day, week or month, an aware datetime
    for an hour) and its key part, as ``pgcounters.bucket_periods`` makes them."""
    if start > end:
        raise InvalidArgument(f"a range starts before it ends, got {start} to {end}")
    tz = _zone(zone)
    out: list[tuple[dt.date, str]] = []
    if period == "hour":
        # every quarter of an hour (offsets are whole quarters), truncated to its hour
        utc_start = start.astimezone(dt.UTC)
        t = utc_start.replace(minute=utc_start.minute // 15 * 15, second=0, microsecond=0)
        t -= dt.timedelta(hours=1)
        if (end - t) / dt.timedelta(hours=1) > MAX_PERIODS + 2:
            raise InvalidArgument(f"a range spans at most {MAX_PERIODS} periods")
        seen: set[dt.datetime] = set()
        while t < end:
            local = t.astimezone(tz)
            hour = t - dt.timedelta(minutes=local.minute)
            if hour not in seen and start <= hour < end:
                seen.add(hour)
                out.append((hour.astimezone(tz), hour.strftime("%Y-%m-%dT%H:%M:%SZ")))
            t += dt.timedelta(minutes=15)
        return out
    day = start.astimezone(tz).date()
    if period == "week":
        day -= dt.timedelta(days=day.weekday())
    elif period == "month":
        day = day.replace(day=1)
    last = end.astimezone(tz).date()
    if (last - day).days > MAX_PERIODS * {"week": 7, "month": 31}.get(period, 1):
        raise InvalidArgument(f"a range spans at most {MAX_PERIODS} periods")
    while day <= last:
        began = dt.datetime.combine(day, dt.time(), tz)
        if start <= began < end:
            out.append((day, day.isoformat()))
        if period == "day":
            day += dt.timedelta(days=1)
        elif period == "week":
            day += dt.timedelta(days=7)
        else:
            day = (day.replace(day=28) + dt.timedelta(days=4)).replace(day=1)
    return out


@functools.cache
def _zone(name: str) -> dt.tzinfo:
    """An IANA time zone (the zone of a counter per period)."""
    import zoneinfo

    return zoneinfo.ZoneInfo(name)


def retry_reason(exc: BaseException) -> str:
    """A short name for why PostgreSQL aborted a statement that is worth retrying."""
    if isinstance(exc, psycopg.errors.DeadlockDetected):
        return "deadlock"
    if isinstance(exc, psycopg.errors.SerializationFailure):
        return "serialization failure"
    if isinstance(exc, psycopg.errors.LockNotAvailable):
        return "lock timeout"
    if isinstance(exc, psycopg.errors.QueryCanceled):
        return "statement timeout"
    return type(exc).__name__


def record_retry_plan(operation: str, reason: str) -> Plan[None]:
    """Count a retried batch in ``pgcounters.retries`` (for status); never fails the caller."""
    conn: ConnState = yield Connection()
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE or conn.closed:
        return
    try:
        yield Transaction(plans.execute(query("record_retry"), (operation, reason)))
    except psycopg.Error as exc:  # e.g. a role without the right: the retry goes on
        logger.debug("could not record the retry: %s", exc)


def record_retry(conn: Conn, operation: str, reason: str) -> None:
    """Count a retried batch in ``pgcounters.retries`` (for status); never fails the caller."""
    plans.run(record_retry_plan(operation, reason), conn)


def on_standby(conn: ConnState) -> bool:
    """True when ``conn`` is connected to a hot standby.

    PostgreSQL 14+ reports ``in_hot_standby`` to the client at connection and
    again when a standby is promoted: no query is needed.
    """
    return conn.info.parameter_status("in_hot_standby") == "on"


def value_of(scale: int, units: object) -> Decimal:
    """A value in units of ``10^-scale`` as a Decimal with exactly ``scale`` decimal places
    (``12345`` at 2: ``123.45``)."""
    return Decimal(int(cast(Any, units))).scaleb(-scale).quantize(Decimal(1).scaleb(-scale))


def _column_delta(counter: Counter, units: int) -> int | Decimal:
    """What a delta in units adds to a counter column (a decimal column: the Decimal)."""
    return units if counter.scale is None else value_of(counter.scale, units)


def _typed_key_value(counter: Counter, text: str) -> object:
    """The Python value of a column target's key, for comparison with its column."""
    return decode_key([text], counter.key_types)[0]


# what makes array_out quote an element: its delimiters, quotes, backslashes and
# the whitespace of array_isspace (ASCII only)
_NEEDS_QUOTES = re.compile(r'[{}",\\ \t\n\r\v\f]')


def _array_element(part: str) -> str:
    if part.isdigit():  # an integer key's part (the hot path): nothing to quote
        return part
    if part == "" or _NEEDS_QUOTES.search(part) or (part.isascii() and part.upper() == "NULL"):
        return '"' + part.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return part


def array_literal(parts: Sequence[str]) -> str:
    """The canonical text of ``parts`` as a ``text[]``: what PostgreSQL prints for it.

    Sent as a parameter value (never pasted into SQL). The queues keep keys in
    this form (schema version 7), so COPY writers must produce exactly the text
    that ``text[]::text`` gives; a property test compares the two.
    """
    return "{" + ",".join(_array_element(p) for p in parts) + "}"


@functools.lru_cache(maxsize=64)
def _multi_insert(table: str, rows: int) -> bytes:
    one = sql.SQL("(%s, %s::text[], %s)")
    values = sql.SQL(", ").join([one] * rows)
    if table == "counters":
        return sql.SQL(query("direct_named_many")).format(values=values).as_bytes(None)
    return (
        sql.SQL(query("enqueue_many"))
        .format(queue=sql.Identifier("pgcounters", table), values=values)
        .as_bytes(None)
    )


def _flatten(rows: Sequence[tuple[Counter, tuple[str, ...], int]]) -> list[object]:
    out: list[object] = []
    for counter, encoded, total in rows:
        out.extend((counter.id, array_literal(encoded), total))
    return out
