"""One implementation of each database operation, run by a sync or an async executor.

An operation of the clients (:class:`pgcounters.Counters`, :class:`pgcounters.Quotas`
and their async twins) is written once, as a *plan*: a generator that validates its
arguments, then yields the steps it needs (:class:`Execute` a statement and fetch its
result, :class:`Copy` rows in, run a nested plan in a :class:`Transaction`,
:class:`Sleep`, look at the :class:`Connection`'s state) and receives each step's
result, until it returns the operation's value. Errors raised by a step are thrown
back into the plan at the ``yield`` (so a plan may catch a deadlock and retry); what
escapes the plan is translated into the pgcounters exception hierarchy by the executor.
A cancellation (``asyncio.CancelledError``, ``KeyboardInterrupt``) is thrown into the
plan as well, so that a plan's ``finally`` (or ``except BaseException``) can put back
what it changed on the connection before it propagates.

:func:`run` drives a plan on a psycopg ``Connection``, :func:`run_async` on an
``AsyncConnection``. They are the only code written twice, and they know nothing of
counters or quotas: which statements run, in which order, how results are decoded,
which arguments are refused, is in the plan alone.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeAlias, TypeVar

import psycopg
from psycopg import sql
from psycopg.rows import tuple_row

from pgcounters.connection import Conn
from pgcounters.dberrors import translated

T = TypeVar("T")

Query: TypeAlias = str | bytes | sql.Composable
Fetch: TypeAlias = Literal["none", "one", "all", "rowcount"]
Row: TypeAlias = tuple[Any, ...]
AsyncConn: TypeAlias = psycopg.AsyncConnection[Any]


@dataclass(slots=True)  # not frozen: built on every call, and a frozen one costs twice
class Execute:
    """Run one statement; the step's result is its first row (or None), all rows, its
    row count, or None."""

    query: Query
    params: Any = None
    fetch: Fetch = "none"
    read: bool = False
    """On the client's read connection (a hot standby, when it has one)."""


@dataclass(frozen=True, slots=True)
class Copy:
    """Run a ``COPY ... FROM STDIN`` and send it ``rows``; the result is None."""

    query: Query
    rows: Sequence[Sequence[Any]]


@dataclass(frozen=True, slots=True)
class Transaction:
    """Run a nested plan in a transaction (a savepoint inside one); its result is the plan's."""

    plan: Plan[Any]


@dataclass(frozen=True, slots=True)
class Sleep:
    """Wait (``time.sleep`` or ``asyncio.sleep``); the result is None."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Connection:
    """The connection the plan runs on (or its read connection), to look at its state."""

    read: bool = False


Step: TypeAlias = Execute | Copy | Transaction | Sleep | Connection
Plan: TypeAlias = Generator[Step, Any, T]


class ConnState(Protocol):
    """What a plan may read of a connection, sync or async."""

    @property
    def info(self) -> psycopg.ConnectionInfo: ...

    @property
    def autocommit(self) -> bool: ...

    @property
    def isolation_level(self) -> psycopg.IsolationLevel | None: ...

    @property
    def closed(self) -> bool: ...


def fetch_one(query: Query, params: Any = None, *, read: bool = False) -> Plan[Row | None]:
    """A plan of one statement returning its first row."""
    row: Row | None = yield Execute(query, params, "one", read)
    return row


def execute(query: Query, params: Any = None) -> Plan[None]:
    """A plan of one statement whose result is not read."""
    yield Execute(query, params)


# -- the sync executor ---------------------------------------------------------------


def run(plan: Plan[T], conn: Conn, read_conn: Conn | None = None) -> T:
    """Run ``plan`` on ``conn`` (its reads on ``read_conn``, default ``conn``)."""
    with translated():
        return _drive(plan, conn, conn if read_conn is None else read_conn)


def _drive(plan: Plan[T], conn: Conn, read_conn: Conn) -> T:
    result: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = plan.send(result) if error is None else plan.throw(error)
        except StopIteration as stop:
            value: T = stop.value
            return value
        error = None
        try:
            if type(step) is Execute and step.fetch == "none" and not step.read:
                # the hot path (an increment's one INSERT): what the caller's own
                # conn.execute() would do, with no cursor of ours to open and close
                conn.execute(step.query, step.params)  # type: ignore[arg-type]
                result = None
            else:
                result = _step(step, conn, read_conn)
        except BaseException as exc:  # KeyboardInterrupt too: the plan may clean up
            result, error = None, exc


def _step(step: Step, conn: Conn, read_conn: Conn) -> Any:
    if isinstance(step, Execute):
        with (read_conn if step.read else conn).cursor(row_factory=tuple_row) as cur:
            cur.execute(step.query, step.params)  # type: ignore[arg-type]
            if step.fetch == "one":
                return cur.fetchone()
            if step.fetch == "all":
                return cur.fetchall()
            if step.fetch == "rowcount":
                return cur.rowcount
            return None
    if isinstance(step, Copy):
        with conn.cursor() as cur, cur.copy(step.query) as copy:  # type: ignore[arg-type]
            for row in step.rows:
                copy.write_row(row)
        return None
    if isinstance(step, Transaction):
        with conn.transaction():
            return _drive(step.plan, conn, read_conn)
    if isinstance(step, Sleep):
        time.sleep(step.seconds)
        return None
    return read_conn if step.read else conn


# -- the async executor --------------------------------------------------------------


async def run_async(plan: Plan[T], conn: AsyncConn, read_conn: AsyncConn | None = None) -> T:
    """Run ``plan`` on an async connection (its reads on ``read_conn``, default ``conn``)."""
    with translated():
        return await drive_async(plan, conn, conn if read_conn is None else read_conn)


async def drive_async(plan: Plan[T], conn: AsyncConn, read_conn: AsyncConn) -> T:
    """Run ``plan`` (:func:`run_async` without the translation of driver errors)."""
    result: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = plan.send(result) if error is None else plan.throw(error)
        except StopIteration as stop:
            value: T = stop.value
            return value
        error = None
        try:
            if type(step) is Execute and step.fetch == "none" and not step.read:
                # the hot path (an increment's one INSERT): what the caller's own
                # await conn.execute() would do, with no cursor of ours to open and close
                await conn.execute(step.query, step.params)  # type: ignore[arg-type]
                result = None
            else:
                result = await _step_async(step, conn, read_conn)
        except BaseException as exc:  # a cancelled task too: the plan may clean up
            result, error = None, exc


async def _step_async(step: Step, conn: AsyncConn, read_conn: AsyncConn) -> Any:
    if isinstance(step, Execute):
        async with (read_conn if step.read else conn).cursor(row_factory=tuple_row) as cur:
            await cur.execute(step.query, step.params)  # type: ignore[arg-type]
            if step.fetch == "one":
                return await cur.fetchone()
            if step.fetch == "all":
                return await cur.fetchall()
            if step.fetch == "rowcount":
                return cur.rowcount
            return None
    if isinstance(step, Copy):
        async with conn.cursor() as cur, cur.copy(step.query) as copy:  # type: ignore[arg-type]
            for row in step.rows:
                await copy.write_row(row)
        return None
    if isinstance(step, Transaction):
        async with conn.transaction():
            return await drive_async(step.plan, conn, read_conn)
    if isinstance(step, Sleep):
        await asyncio.sleep(step.seconds)
        return None
    return read_conn if step.read else conn
