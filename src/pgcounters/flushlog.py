"""What the increment buffers share: their database link and the flush log.

Both the batching incrementer and the Redis buffer write a batch of netted
increments in ONE transaction that also records a flush id in
``pgcounters.buffer_flushes`` (migration 0004). A batch whose outcome is in
doubt is looked up by its id before it is written again, so it is counted
once.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import psycopg
from psycopg import sql
from psycopg.generators import copy_end

from pgcounters import plans
from pgcounters.client import Counter, Counters, _CounterPlans, _row_to_counter, array_literal
from pgcounters.config import connect
from pgcounters.connection import Conn
from pgcounters.errors import (
    ConfigurationError,
    ConnectionFailed,
    InvalidCounterDefinition,
    UnknownCounter,
)
from pgcounters.keys import decode_key
from pgcounters.plans import Connection, ConnState, Copy, Execute, Plan, Transaction
from pgcounters.sqlfiles import query

BUFFER_NAME_RE = re.compile(r"[A-Za-z0-9_.:/-]{1,200}")
T = TypeVar("T")
_INHERITED: list[Conn] = []  # connections of a parent process, never closed


def new_flush_id() -> str:
    """A fresh flush id (32 lower-case hex digits)."""
    return os.urandom(16).hex()


def check_buffer_name(name: object) -> str:
    if not isinstance(name, str) or BUFFER_NAME_RE.fullmatch(name) is None:
        raise ConfigurationError(
            f"invalid buffer name {name!r}: use 1-200 letters, digits and _ . : / -"
        )
    return name


class DbLink:
    """One PostgreSQL connection for a buffer, serialised by a lock, reopened when broken.

    Given a DSN, the link owns its connection (autocommit) and reconnects after
    a failure. Given a connection, it uses that one and never reconnects.
    Callers hold :attr:`lock` around every use of :meth:`counters`.
    """

    def __init__(self, database: str | Conn) -> None:
        self.lock = threading.RLock()
        if isinstance(database, str):
            self._dsn: str | None = database
            self._conn: Conn | None = None
        elif isinstance(database, psycopg.Connection):
            self._dsn = None
            self._conn = database
        else:
            raise ConfigurationError(
                f"database must be a DSN string or a psycopg connection, got {database!r}"
            )
        self._pc: Counters | None = None
        self._declared: dict[str, Counter] = {}

    def counter(self, name: str) -> Counter:
        """A counter's declaration, looked up once (UnknownCounter if it is not declared)."""
        found = self._declared.get(name)
        if found is None:
            found = self.run(lambda pc: pc._counter(name))
            if found.scale is not None:
                # buffered deltas are whole numbers, which it would read as units of 10^-scale
                raise InvalidCounterDefinition(
                    f"counter {name} sums decimals: event counters take whole deltas, add to "
                    "it with Counters.incr_decimal"
                )
            self._declared[name] = found
        return found

    def run(self, make: Callable[[Counters], Plan[T]]) -> T:
        """Run the plan ``make(client)`` on the link's connection, in a transaction of its own
        unless the connection is in autocommit mode (see :func:`own_transaction`)."""
        with self.lock:
            pc = self.counters()
            return plans.run(own_transaction(make(pc)), pc.conn)

    def redeclared(self, counter: Counter) -> None:
        """Use ``counter`` from now on for its name (it was dropped and declared again)."""
        self._declared[counter.name] = counter

    def counters(self) -> Counters:
        """The client on a usable connection (call with :attr:`lock` held)."""
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            if self._dsn is None:
                raise ConnectionFailed("the connection given to the buffer is closed or broken")
            self._conn = connect(self._dsn)
            self._pc = None
        if self._pc is None:
            assert self._conn is not None
            self._pc = Counters(self._conn)
        return self._pc

    def reset(self) -> None:
        """Forget a connection that failed (an owned one is closed and reopened on next use;
        a given one is brought back to idle, see :func:`settle`)."""
        with self.lock:
            if self._dsn is not None and self._conn is not None:
                self._conn.close()
                self._conn = None
            elif self._conn is not None:
                settle(self._conn)
            self._pc = None

    @classmethod
    def after_fork(cls, parent: DbLink) -> DbLink:
        """A link for a forked child: never touches the parent's connection.

        The inherited connection object is kept referenced (closing it, even by
        garbage collection, would end the parent's session).
        """
        if parent._conn is not None:
            _INHERITED.append(parent._conn)
        if parent._dsn is not None:
            return cls(parent._dsn)
        child = cls.__new__(cls)
        child.lock = threading.RLock()
        child._dsn = None
        child._conn = None
        child._pc = None
        return child

    def close(self) -> None:
        with self.lock:
            if self._dsn is not None and self._conn is not None:
                self._conn.close()
            self._conn = None
            self._pc = None


EncodedIncrement = tuple[Counter, tuple[str, ...], int]
"""A validated increment: the counter, its key in canonical text form, the delta."""


def write_flush(
    pc: Counters,
    flush_id: str,
    buffer: str,
    rows: Sequence[EncodedIncrement],
    *,
    keep: Iterable[str] = (),
    look_up: bool = False,
    redeclared: Callable[[Counter], None] | None = None,
) -> tuple[bool, list[EncodedIncrement]]:
    """Write ``rows`` and record ``flush_id`` in one transaction (see :func:`write_flush_plan`)."""
    return plans.run(
        write_flush_plan(
            pc, flush_id, buffer, rows, keep=keep, look_up=look_up, redeclared=redeclared
        ),
        pc.conn,
    )


def write_flush_plan(
    pc: _CounterPlans,
    flush_id: str,
    buffer: str,
    rows: Sequence[EncodedIncrement],
    *,
    keep: Iterable[str] = (),
    look_up: bool = False,
    redeclared: Callable[[Counter], None] | None = None,
) -> Plan[tuple[bool, list[EncodedIncrement]]]:
    """Write ``rows`` and record ``flush_id`` in one transaction.

    Deltas of queued and unlogged counters are copied into their queue with
    COPY (a flush of 2,000 keys measured twice as fast as through the
    multi-row INSERTs of :meth:`Counters.incr_many`, which direct counters
    still use). Returns whether it wrote (False, and nothing written, when the
    flush was already recorded), and the increments of counters dropped since the
    buffer looked them up, not written (the rest is): the buffer keeps them. The
    connection must not be inside a transaction (autocommit or not). ``look_up``
    (a batch in doubt): the flush id is looked up first, in the same transaction,
    and nothing else is read or written if it is recorded; recording it is the
    last guard either way (an id recorded is never applied twice). ``keep``: the
    ids the caller holds in doubt, which the pruning of old records spares (the
    buffer's records are pruned by every fresh flush of its name, whichever
    process or slot writes it). ``redeclared`` is told of a
    counter declared again (dropped and created under its name) since the
    buffer looked it up. A plan: the sync buffers run it on a connection, the
    async one on an async connection.
    """
    conn: ConnState = yield Connection()
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        raise ConfigurationError("a buffer flush must run outside a transaction")
    keep = list(keep)
    held: list[EncodedIncrement] = []

    def body() -> Plan[bool]:
        if look_up and (yield from flush_recorded_plan(flush_id)):
            return False
        by_queue: dict[str, list[EncodedIncrement]] = {"queued": [], "unlogged": [], "direct": []}
        # the declarations as they are now: a counter dropped and created again under
        # its name since the buffer looked it up has a new id (the old one's deltas
        # would be set aside by the drain); a dropped one's increments are held back
        # (the buffer keeps them) instead of written as deltas nobody applies, and the
        # other counters' are written all the same
        current, dropped = yield from _current(pc, rows, redeclared)
        held[:] = dropped
        for item in current:
            if item[2]:
                by_queue[item[0].mode].append(item)
        row = yield Execute(
            query("record_flush"),
            {"flush_id": flush_id, "buffer": buffer, "keys": len(current),
             "total": sum(delta for _, _, delta in current), "keep": keep},
            "one",
        )  # fmt: skip
        if not (row and row[0]):
            held.clear()  # recorded before: nothing of it is written now, nothing kept
            return False
        for mode, statement in (("queued", "copy_queue"), ("unlogged", "copy_queue_unlogged")):
            if by_queue[mode]:
                yield Copy(
                    query(statement),
                    [(c.id, array_literal(encoded), delta) for c, encoded, delta in by_queue[mode]],
                )
        if by_queue["direct"]:
            yield from pc._incr_many(
                (c.name, decode_key(encoded, c.key_types), delta)
                for c, encoded, delta in by_queue["direct"]
            )
        return True

    written: bool = yield Transaction(body())
    return written, held


def _current(
    pc: _CounterPlans,
    rows: Sequence[EncodedIncrement],
    redeclared: Callable[[Counter], None] | None,
) -> Plan[tuple[list[EncodedIncrement], list[EncodedIncrement]]]:
    """``rows`` with each counter's declaration read again (one statement), and apart the
    rows of counters dropped since."""
    names = sorted({counter.name for counter, _, _ in rows})
    if not names:
        return list(rows), []
    found = yield Execute(query("targets_by_names"), {"names": names}, "all")
    now = {str(r[1]): _row_to_counter(r) for r in found}
    out: list[EncodedIncrement] = []
    dropped: list[EncodedIncrement] = []
    for counter, encoded, delta in rows:
        current = now.get(counter.name)
        if current is None:
            dropped.append((counter, encoded, delta))
            continue
        if current != counter:
            if (
                current.key_types != counter.key_types
                or current.is_column != counter.is_column
                or current.scale != counter.scale
            ):
                raise InvalidCounterDefinition(
                    f"counter {counter.name!r} was declared again with another key or target "
                    "after increments to it were buffered; they are kept"
                )
            pc._cache.pop(counter.name, None)  # direct increments below look it up again
            if redeclared is not None:
                redeclared(current)
            counter = current
        out.append((counter, encoded, delta))
    return out, dropped


_INTERRUPTED_COPY = b"pgcounters: the buffer's write was interrupted"


def settle(conn: Conn) -> None:
    """Bring a buffer's own connection back to idle after a write was interrupted on it
    (``KeyboardInterrupt``): a COPY interrupted as it began is left open by the driver, and
    is ended here (refused: nothing of it is written); an open transaction is rolled back."""
    if conn.closed or conn.broken:
        return
    if conn.pgconn.transaction_status == psycopg.pq.TransactionStatus.ACTIVE:
        with conn.lock, contextlib.suppress(psycopg.Error):
            conn.wait(copy_end(conn.pgconn, _INTERRUPTED_COPY))
    if conn.info.transaction_status in _IN_TRANSACTION:
        conn.rollback()


async def settle_async(conn: psycopg.AsyncConnection[Any]) -> None:
    """:func:`settle` for an async connection (after a write cancelled from outside)."""
    if conn.closed or conn.broken:
        return
    if conn.pgconn.transaction_status == psycopg.pq.TransactionStatus.ACTIVE:
        async with conn.lock:
            with contextlib.suppress(psycopg.Error):
                await conn.wait(copy_end(conn.pgconn, _INTERRUPTED_COPY))
    if conn.info.transaction_status in _IN_TRANSACTION:
        await conn.rollback()


_IN_TRANSACTION = (psycopg.pq.TransactionStatus.INTRANS, psycopg.pq.TransactionStatus.INERROR)


def own_transaction(plan: Plan[T]) -> Plan[T]:
    """``plan`` in a transaction of its own unless the connection is in autocommit mode (where
    each statement is one): a buffer's reads never leave a transaction open behind them on a
    connection that is not in autocommit mode."""
    conn: ConnState = yield Connection()
    if conn.autocommit:
        return (yield from plan)
    result: T = yield Transaction(plan)
    return result


def flush_recorded(pc: Counters, flush_id: str) -> bool:
    """True when ``flush_id`` was committed."""
    return plans.run(own_transaction(flush_recorded_plan(flush_id)), pc.conn)


def flush_recorded_plan(flush_id: str) -> Plan[bool]:
    """True when ``flush_id`` was committed."""
    row = yield Execute(query("flush_recorded"), {"flush_id": flush_id}, "one")
    return bool(row and row[0])


def exact_with_flushes(
    pc: Counters, counter: Counter, encoded: Sequence[str], ids: Sequence[str]
) -> tuple[int, set[str]]:
    """Exact database value of one counter and which of ``ids`` are recorded, in ONE statement."""
    return plans.run(own_transaction(exact_with_flushes_plan(counter, encoded, ids)), pc.conn)


def exact_with_flushes_plan(
    counter: Counter, encoded: Sequence[str], ids: Sequence[str]
) -> Plan[tuple[int, set[str]]]:
    """Exact database value of one counter and which of ``ids`` are recorded, in ONE statement.

    One statement means one snapshot: a flush is either counted in the value and
    listed as recorded, or neither.
    """
    params: dict[str, Any] = {"t": counter.id, "k": list(encoded), "ids": list(ids)}
    exact: sql.Composable
    if counter.is_column:
        params["v"] = decode_key([encoded[0]], counter.key_types)[0]
        exact = counter.composed("exact_column")
    else:
        exact = sql.SQL(query("exact_named"))
    statement = sql.SQL(query("exact_and_flushes")).format(
        exact=exact, flushes=sql.SQL(query("flushes_recorded"))
    )
    row = yield Execute(statement, params, "one")
    assert row is not None
    if row[0] is None:  # its id outlived it
        raise UnknownCounter(f"counter {counter.name!r} was dropped")
    return int(row[0]), set(row[1] or ())
