"""Online backfill of counters added or changed over tables that already have rows.

When a counter's definition is recorded for the first time, or with another
fingerprint (a new filter, sum or key), its stored values say nothing about
the rows written before its triggers were installed. :func:`request` marks it
in ``pgcounters.backfills`` (in the caller's transaction, with the triggers);
:func:`run` (``migrate``, ``pgcounters backfill``, ``triggers.install``) and
:func:`step` (the worker, one batch per idle round) recompute its values in
key order, a batch of keys per transaction, exactly as a recount does (lock
the batch's counter rows, then ``stored = truth - pending`` from one
snapshot): a writer waits at most for one batch. The cursor moves in the
batch's own transaction, so a reader sees, in one snapshot, which keys are
done. Interrupted, it resumes from its cursor; the last batch deletes the row.

While a counter is backfilled, Django's ``Exact`` reads a key beyond the cursor
from the source table (and one up to it from the counter), and the client's
``get``/``get_many`` and SQL ``pgcounters.get`` refuse every key with
:class:`~pgcounters.errors.CounterBackfilling` until the backfill ends; never a
number that misses the rows written before the counter existed.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import tuple_row

from pgcounters.connection import Conn
from pgcounters.dberrors import translated
from pgcounters.errors import InvalidArgument, PermissionDenied
from pgcounters.repair import (
    _composed,
    _create_named_rows,
    _named_keys,
    _range_filter,
    _recount_column,
    _recount_named,
    _sql,
    _target_id,
)
from pgcounters.specs import ColumnTarget, CounterSpec
from pgcounters.sqlfiles import query
from pgcounters.triggers import declared

Progress = Callable[[str, int], None]


@dataclass(frozen=True)
class Backfill:
    """A counter whose values are being recomputed."""

    name: str
    fingerprint: str
    keys_done: int
    cursor: tuple[str, ...] | None
    requested_at: datetime


BUSY_PAUSE = 0.01
"""Seconds a backfill waits before trying again a key whose row another transaction holds."""
BUSY_PAUSE_MAX = 0.5
"""The longest of those waits (the pause doubles while the row stays held)."""


def request(conn: Conn, spec: CounterSpec) -> None:
    """Mark ``spec`` for a backfill from its first key (in the caller's transaction)."""
    conn.execute(_sql("backfill_request"), (spec.name, spec.fingerprint))


def cancel(conn: Conn, name: str) -> None:
    """Forget the backfill of a counter that is gone."""
    conn.execute(_sql("backfill_cancel"), (name,))


def pending(conn: Conn) -> list[Backfill]:
    """Counters being backfilled, by name."""
    with translated(), conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(_sql("backfills"))
        return [
            Backfill(r[0], r[1], int(r[2]), None if r[3] is None else tuple(r[3]), r[4])
            for r in cur.fetchall()
        ]


def _check_batch_size(batch_size: int) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not batch_size >= 1:
        raise InvalidArgument(f"batch size must be a positive integer, got {batch_size!r}")


def run(
    conn: Conn,
    names: Sequence[str] | None = None,
    *,
    batch_size: int = 1000,
    progress: Progress | None = None,
) -> dict[str, int]:
    """Backfill the pending counters (or those named) to the end. Returns keys done per name.

    Each batch is a transaction of its own; the connection must not be in a
    transaction. Another process backfilling the same counter at the same time
    is not waited for: its batches and ours take turns (the backfill row is
    taken with ``SKIP LOCKED``), each from the cursor the other left.
    """
    _check_batch_size(batch_size)
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        raise psycopg.ProgrammingError(
            "a backfill commits per batch: call it outside a transaction"
        )
    done: dict[str, int] = {}
    wanted = [b.name for b in pending(conn) if names is None or b.name in names]
    for name in wanted:
        done[name] = 0
        resolved: dict[str, tuple[CounterSpec, int]] = {}  # looked up once per run
        listed: dict[str, list[list[str]]] = {}
        pause = BUSY_PAUSE
        while True:
            keys, more = _batch(conn, name, batch_size, resolved, listed)
            done[name] += keys
            if keys and progress is not None:
                progress(name, keys)
            if not more:
                break
            if keys:
                pause = BUSY_PAUSE
            else:
                # the next key's row is held by another transaction: try again after a
                # pause that grows while it stays held, instead of a transaction a millisecond
                time.sleep(pause)
                pause = min(pause * 2, BUSY_PAUSE_MAX)
    return done


def step(
    conn: Conn, batch_size: int = 1000, refused: dict[str, PermissionDenied] | None = None
) -> int:
    """One batch of the first pending backfill that is free; the keys it went through.

    With ``refused``, a counter whose batch this role may not run (it may not read one of
    the counter's tables: :class:`~pgcounters.errors.PermissionDenied`) is added to it with
    its error and the next one is tried; a counter already in it is skipped. Without, the
    error is raised.
    """
    _check_batch_size(batch_size)
    for b in pending(conn):
        if refused is not None and b.name in refused:
            continue
        try:
            keys, more = _batch(conn, b.name, batch_size)
        except PermissionDenied as exc:
            if refused is None:
                raise
            refused[b.name] = exc
            continue
        if keys or not more:
            return keys or 1  # a finished backfill counts as work done
    return 0


def _batch(
    conn: Conn,
    name: str,
    batch_size: int,
    resolved: dict[str, tuple[CounterSpec, int]] | None = None,
    named_keys: dict[str, list[list[str]]] | None = None,
) -> tuple[int, bool]:
    """One batch of one counter's backfill: (keys done, whether it goes on).

    ``resolved`` caches the counter's spec and target id across the batches of a run,
    ``named_keys`` a named counter's keys (listed once per run, not once per batch).
    """
    cache = {} if resolved is None else resolved
    with translated(), conn.transaction():
        row = conn.execute(_sql("backfill_claim"), (name,)).fetchone()
        if row is None:  # finished, or another process is running a batch of it
            return 0, False
        fingerprint, cursor = row[0], row[1]
        stale = None if row[2] is None else (row[2], row[3])
        if cursor is None:
            # the counter's stale mark as its first batch starts: every key is backfilled
            # from a later snapshot, so the writes that mark counts are in its truth (as in a
            # whole recount's); a mark that changes meanwhile stays when the backfill ends
            stale = conn.execute(query("stale_mark"), {"name": name}).fetchone()
            conn.execute(
                _sql("backfill_stale_mark"),
                (None, None, name) if stale is None else (stale[0], stale[1], name),
            )
        if name in cache and cache[name][0].fingerprint == fingerprint:
            spec, target = cache[name]
        else:
            found = next((s for s in declared(conn) if s.name == name), None)
            if found is None or found.fingerprint != fingerprint:
                # the counter is gone, or changed again (a newer request replaces this one)
                if found is None:
                    cancel(conn, name)
                return 0, False
            spec, target = found, _target_id(conn, found)
            cache[name] = (spec, target)
        held: list[Any] = []
        if isinstance(spec.target, ColumnTarget):
            keys: list[Any] = _column_keys(conn, spec, cursor, batch_size)
            if keys:
                _, held = _recount_column(conn, spec, target, keys)
            texts = [[str(k)] for k in keys]
            held_texts = [[str(k)] for k in held]
        else:
            keys = _named_batch(conn, spec, target, cursor, batch_size, named_keys)
            if keys:
                _create_named_rows(conn, target, keys)
                _, held = _recount_named(conn, spec, target, keys)
            texts = [list(k) for k in keys]
            held_texts = [list(k) for k in held]
        if not keys:
            if stale is not None:
                conn.execute(
                    query("clear_stale"),
                    {"name": name, "since": stale[0], "statements": stale[1]},
                )
            cancel(conn, name)
            return 0, False
        # the cursor stops before the first key whose row an application held (the recount
        # left it alone): the next step starts there
        done = next((i for i, k in enumerate(texts) if k in held_texts), len(texts))
        if done == 0:
            return 0, True
        conn.execute(_sql("backfill_progress"), (texts[done - 1], done, name))
        return done, True


def _named_batch(
    conn: Conn,
    spec: CounterSpec,
    target: int,
    cursor: list[str] | None,
    batch_size: int,
    listed: dict[str, list[list[str]]] | None,
) -> list[list[str]]:
    """The next keys of a named counter after ``cursor``, in key order.

    The keys are listed once per run (the truth's, the stored and the pending ones, in byte
    order, as recount lists them): a key that appears later had no count before, and the
    queue brings it in.
    """
    if listed is None:
        return _named_keys(conn, spec, target, cursor, None)[:batch_size]
    if spec.name not in listed:
        listed[spec.name] = _named_keys(conn, spec, target, None, None)
    keys = listed[spec.name]
    start = 0 if cursor is None else bisect.bisect_right(keys, list(cursor))
    return keys[start : start + batch_size]


def _column_keys(conn: Conn, spec: CounterSpec, cursor: list[str] | None, limit: int) -> list[Any]:
    t = spec.target
    assert isinstance(t, ColumnTarget)
    k = sql.Identifier(t.key_column)
    rows = conn.execute(
        _composed(
            "parent_keys_after",
            k=k,
            p=t.table.identifier(),
            w=_range_filter(k, t.key_type, cursor[0] if cursor else None, None),
            n=sql.Literal(limit),
        )
    ).fetchall()
    return [r[0] for r in rows]
