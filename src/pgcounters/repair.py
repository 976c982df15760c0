"""Verify counters against the truth, and recount them while writes go on.

The truth is the subquery compiled from the counter's spec: counting the
source table itself. ``verify`` compares it with the exact value (stored +
pending) from one snapshot. ``recount`` repairs values in batches of keys, one
transaction per batch, while writers and drainers keep running:

1. lock the batch's counter rows (parent rows, or rows of
   ``pgcounters.counters``, created first when missing, in a transaction of
   their own) in key order **without waiting** (``SKIP LOCKED``), so no
   drainer can apply to them until the batch commits;
2. in a later statement (a new snapshot that sees every drain that committed
   before the locks were granted) compute truth and pending deltas from that one
   snapshot and set ``stored = truth - pending`` for the rows locked.

A delta a drainer claimed but has not committed is still pending in that
snapshot; when the drainer applies it after the batch commits (or puts it back
in the queue because the row was busy), stored + pending equals the truth again.

Rows another transaction holds (an application's, a drainer's) are skipped by
the batch and recounted at the end of the run, one key per transaction: the
transaction waits for that one row, holding nothing else, with a
``lock_timeout`` below PostgreSQL's ``deadlock_timeout``, so a recount is never
a party to a deadlock. A batch that PostgreSQL aborts anyway (deadlock,
serialization failure, lock or statement timeout) is retried (a WARNING of the
``pgcounters.recount`` logger each time, counted in ``pgcounters.retries``);
after ``retries`` attempts the recount stops with :class:`BatchAborted`.
``verify`` retries its statement the same way.

Progress is recorded per batch in ``pgcounters.recounts``, so an interrupted
recount resumes where it stopped.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from functools import partial
from typing import Any, TypeVar

import psycopg
from psycopg import sql
from psycopg.rows import tuple_row

from pgcounters.client import record_retry, retry_reason, value_of
from pgcounters.compiler import (
    column_units,
    column_value,
    ensure_target_call,
    part_text,
    truth_query,
    typed_key_part,
)
from pgcounters.connection import Conn
from pgcounters.dberrors import translated
from pgcounters.errors import BatchAborted, InvalidArgument
from pgcounters.keys import decode_key
from pgcounters.specs import ColumnTarget, CounterSpec
from pgcounters.sqlfiles import named, query
from pgcounters.triggers import check_not_broken
from pgcounters.triggers import spec as recorded_spec

logger = logging.getLogger("pgcounters.recount")


def _sql(name: str) -> str:
    """A named statement of ``sql/recount.sql``."""
    return named("recount.sql")[name]


def _composed(name: str, **parts: sql.Composable) -> sql.Composed:
    """A named statement of ``sql/recount.sql`` with its {placeholders} filled in."""
    return sql.SQL(_sql(name)).format(**parts)


Progress = Callable[[int], None]
T = TypeVar("T")

RETRIES = 5
"""How many times a batch aborted by PostgreSQL is retried before giving up."""
BUSY_ATTEMPTS = 20
"""How many times a key whose row stays busy is tried (one ``lock_timeout`` each)."""
BUSY_LOCK_TIMEOUT = "500ms"
"""How long the recount of one busy key waits for its row: below the default
``deadlock_timeout`` (1s), so the recount gives up before any deadlock is looked for."""

# what PostgreSQL aborts and a new attempt may get through
RETRYABLE: tuple[type[psycopg.Error], ...] = (
    psycopg.errors.DeadlockDetected,
    psycopg.errors.SerializationFailure,
    psycopg.errors.LockNotAvailable,
    psycopg.errors.QueryCanceled,
)


def retrying(
    conn: Conn,
    operation: str,
    what: str,
    work: Callable[[], T],
    *,
    retries: int = RETRIES,
) -> T:
    """Run ``work()`` in a transaction of its own, again when PostgreSQL aborts it.

    Each retry is a WARNING (with the reason) and is counted in ``pgcounters.retries``;
    after ``retries`` retries :class:`BatchAborted` is raised (nothing of the batch was
    written: its transaction rolled back).
    """
    for attempt in range(retries + 1):
        try:
            with conn.transaction():
                return work()
        except RETRYABLE as exc:
            reason = retry_reason(exc)
            record_retry(conn, operation, reason)
            if attempt == retries:
                raise BatchAborted(
                    f"{operation} of {what} was aborted {retries + 1} times, last by {reason}: "
                    f"{str(exc).strip()}"
                ) from exc
            logger.warning(
                "%s of %s aborted by %s, retrying (attempt %d of %d)",
                operation, what, reason, attempt + 2, retries + 1,
            )  # fmt: skip
            time.sleep(min(0.05 * 2**attempt, 1.0))
    raise AssertionError("unreachable")


KeyRange = tuple[Any, Any]
"""``(low, high)``, both included; either may be None for an open end."""


@dataclass(frozen=True)
class Mismatch:
    key: tuple[Any, ...]
    expected: int | Decimal  # the truth (a Decimal for a sum of decimals)
    actual: int | Decimal  # stored + pending


@dataclass
class VerifyResult:
    name: str
    keys_checked: int
    mismatches: list[Mismatch] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.mismatches


@dataclass
class RecountResult:
    name: str
    keys_done: int = 0
    keys_fixed: int = 0
    batches: int = 0
    resumed: bool = False
    busy_keys: int = 0
    """Keys whose rows another transaction held during their batch: recounted at the end."""


def _resolve(conn: Conn, counter: CounterSpec | str, operation: str) -> CounterSpec:
    spec = counter if isinstance(counter, CounterSpec) else recorded_spec(conn, counter)
    # a CounterBroken naming it, not a raw UndefinedColumn (planning the probe takes the
    # table's lightest lock: retried like a batch when a lock_timeout cuts it short)
    retrying(conn, operation, spec.name, partial(check_not_broken, conn, spec))
    return spec


def _target_id(conn: Conn, spec: CounterSpec) -> int:
    row = conn.execute(
        sql.SQL(query("select_call")).format(call=ensure_target_call(spec))
    ).fetchone()
    assert row is not None
    return int(row[0])


def _key_expr(spec: CounterSpec, part: int = 0) -> sql.Composable:
    """Key expression ``part`` in its key type, exactly as the triggers compute it: a
    filter on it selects the rows that count for those keys (a timestamp keying a date
    is compared as that date, not as the instant at midnight)."""
    return typed_key_part(spec, part)


def _parent_key_text(spec: CounterSpec, column: sql.Composable) -> sql.Composable:
    """A column counter's parent key as the one-part text[] key the queues keep."""
    t = spec.target
    assert isinstance(t, ColumnTarget)
    return sql.SQL("ARRAY[{}]").format(part_text(column, t.key_type))


def _typed_array(values: Sequence[Any], key_type: str) -> sql.Composable:
    """A literal array of key values, cast to the key type (values quoted by psycopg)."""
    return sql.SQL("{}::{}[]").format(sql.Literal([str(v) for v in values]), sql.SQL(key_type))


def _text_keys(keys: Sequence[Sequence[Any]]) -> sql.Composable:
    """A set of text[] keys as a subquery (keys of any length, the global key included)."""
    return _composed("text_keys", keys=sql.Literal(json.dumps([[str(p) for p in k] for k in keys])))


def _pending(target: int, keys: sql.Composable | None = None) -> sql.Composed:
    """``SELECT key, delta``: pending deltas of a target per key (optionally of some keys)."""
    if keys is None:
        return _composed("pending", target=sql.Literal(target))
    return _composed("pending_of_keys", target=sql.Literal(target), keys=keys)


# -- verify --------------------------------------------------------------------


def verify(conn: Conn, counter: CounterSpec | str, *, sample: int | None = None) -> VerifyResult:
    """Compare exact values (stored + pending) with the truth, from one snapshot.

    ``sample``: check only that many randomly chosen keys (of the parent table
    for a column counter, of all known keys for a named counter).
    """
    if sample is not None and sample < 1:
        raise InvalidArgument(f"sample must be a positive number of keys, got {sample}")
    with translated():
        spec = _resolve(conn, counter, "verify")
        target = _target_id(conn, spec)
        if isinstance(spec.target, ColumnTarget):
            stmt = _verify_column(spec, target, sample)
        else:
            stmt = _verify_named(spec, target, sample)
        if conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:

            def run() -> list[tuple[Any, ...]]:
                with conn.cursor(row_factory=tuple_row) as cur:
                    cur.execute(stmt)
                    return cur.fetchall()

            rows = retrying(conn, "verify", spec.name, run)
        else:  # inside the caller's transaction: one attempt, the caller decides
            with conn.cursor(row_factory=tuple_row) as cur:
                cur.execute(stmt)
                rows = cur.fetchall()
    checked = 0
    mismatches: list[Mismatch] = []
    for key, actual, expected in rows:
        if key is None:  # the summary row
            checked = int(actual)
            continue
        mismatches.append(
            Mismatch(
                decode_key(key, spec.key_types),
                _value(spec, expected),
                _value(spec, actual),
            )
        )
    return VerifyResult(spec.name, checked, mismatches)


def _value(spec: CounterSpec, units: Any) -> int | Decimal:
    """A value in units as the counter reads it (a sum of decimals: a Decimal)."""
    return int(units) if spec.scale is None else value_of(spec.scale, units)


def _verify_column(spec: CounterSpec, target: int, sample: int | None) -> sql.Composed:
    t = spec.target
    assert isinstance(t, ColumnTarget)
    parent, k, c = t.table.identifier(), sql.Identifier(t.key_column), sql.Identifier(t.column)
    keys: sql.Composable
    if sample is None:
        keys = _composed("parent_keys", k=k, p=parent)
        truth = truth_query(spec)
    else:
        keys = _composed("parent_keys_sample", k=k, p=parent, n=sql.Literal(sample))
        truth = truth_query(spec, sql.SQL("{} IN (SELECT k FROM keys)").format(_key_expr(spec)))
    return _composed(
        "verify_column",
        text_key=_parent_key_text(spec, sql.SQL("x.{}").format(k)),
        keys=keys,
        truth=truth,
        pending=_pending(target),
        k=k,
        stored=column_units(spec, sql.SQL("x.{}").format(c)),
        p=parent,
    )


def _verify_named(spec: CounterSpec, target: int, sample: int | None) -> sql.Composed:
    limit: sql.Composable = sql.SQL("")
    if sample is not None:
        limit = sql.SQL("ORDER BY random() LIMIT {}").format(sql.Literal(sample))
    kept = _kept_periods(spec)
    if kept is not None:  # the periods a counter no longer keeps are not compared
        limit = sql.SQL("WHERE {} {}").format(kept, limit)
    return _composed(
        "verify_named",
        truth=truth_query(spec),
        target=sql.Literal(target),
        pending=_pending(target),
        limit=limit,
    )


def _first_kept(spec: CounterSpec) -> sql.Composable:
    """The key part of the first period a counter per period keeps (its ``keep``)."""
    assert spec.bucket is not None
    b = spec.bucket
    period, zone = sql.Literal(b.period), sql.Literal(b.time_zone)
    return sql.SQL("pgcounters.bucket_text({}, {}, pgcounters.bucket_horizon({}, {}, {}))").format(
        period, zone, period, zone, sql.Literal(b.keep)
    )


def _kept_periods(spec: CounterSpec) -> sql.Composable | None:
    """A condition on ``key`` (text[]) that holds for the periods a counter keeps;
    None for a counter that keeps every value."""
    if spec.bucket is None or spec.bucket.keep is None:
        return None
    return sql.SQL('key[{}] COLLATE "C" >= {} COLLATE "C"').format(
        sql.Literal(len(spec.keys)), _first_kept(spec)
    )


# -- recount -------------------------------------------------------------------


def recount(
    conn: Conn,
    counter: CounterSpec | str,
    *,
    batch_size: int = 1000,
    resume: bool = True,
    key_range: KeyRange | None = None,
    progress: Progress | None = None,
    planned: Progress | None = None,
    busy_attempts: int = BUSY_ATTEMPTS,
) -> RecountResult:
    """Set every value of a counter to the truth, in batches, while writes continue.

    ``key_range``: only keys (the parent key of a column counter, the first key
    part of a named counter) in ``[low, high]`` (None for an open end).
    ``resume``: continue an unfinished recount of the same counter from its
    last committed batch. ``planned`` is called once, before the first batch,
    with the number of keys this run will go through (keys that appear
    meanwhile may add to it); ``progress`` with the number of keys done after
    each batch. The connection must not be in a transaction (each batch commits).
    ``busy_attempts``: how many times a key whose row another transaction holds is
    tried at the end (each waits up to ``BUSY_LOCK_TIMEOUT``) before :class:`BatchAborted`.
    """
    if (
        isinstance(batch_size, bool)
        or not isinstance(batch_size, int)
        or not 1 <= batch_size < 2**31
    ):
        raise InvalidArgument(
            f"batch size must be a positive integer below 2**31, got {batch_size!r}"
        )
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        raise psycopg.ProgrammingError("recount commits per batch: call it outside a transaction")
    with translated():
        spec = _resolve(conn, counter, "recount")
        if key_range is not None and spec.keys:
            _check_range(spec, key_range)
        with conn.transaction():
            target = _target_id(conn, spec)
        result = RecountResult(spec.name)
        cursor = _start(conn, spec.name, resume, result)
        # a whole recount puts in the writes the counter missed before it started: its stale
        # mark, as it is now, goes when the recount ends (a mark that changed meanwhile stays)
        stale = None
        if cursor is None and key_range is None:
            with conn.transaction():
                stale = conn.execute(query("stale_mark"), {"name": spec.name}).fetchone()
        column = isinstance(spec.target, ColumnTarget)
        if column:
            if planned is not None:
                planned(_column_key_count(conn, spec, cursor, key_range))
            batches = _column_batches(conn, spec, cursor, batch_size, key_range)
        else:
            known = _named_keys(conn, spec, target, cursor, key_range)
            if planned is not None:
                planned(len(known))
            batches = (known[i : i + batch_size] for i in range(0, len(known), batch_size))
        busy: list[Any] = []
        # the resume cursor never passes a key left busy: a run interrupted before
        # the end does those keys again
        floor: tuple[list[str] | None] | None = None
        previous = cursor
        for keys in batches:
            batch = list(keys)
            if not column:
                retrying(
                    conn, "recount", spec.name, partial(_create_named_rows, conn, target, batch)
                )
            one_batch = partial(_one_batch, conn, spec, target, batch, column, previous, floor)
            fixed, held, floor = retrying(conn, "recount", spec.name, one_batch)
            previous = [str(batch[-1])] if column else list(batch[-1])
            busy.extend(held)
            result.keys_done += len(batch) - len(held)
            result.keys_fixed += fixed
            result.batches += 1
            if progress is not None and len(batch) > len(held):
                progress(len(batch) - len(held))
        for key in busy:
            # one key per transaction, waiting for its row alone (see the module's doc)
            fixed = _recount_busy_key(conn, spec, target, key, column, busy_attempts)
            result.keys_done += 1
            result.keys_fixed += fixed
            result.busy_keys += 1
            if progress is not None:
                progress(1)
        with conn.transaction():
            conn.execute(_sql("recount_finished"), (spec.name,))
            if stale is not None:
                conn.execute(
                    query("clear_stale"),
                    {"name": spec.name, "since": stale[0], "statements": stale[1]},
                )
    return result


def _one_batch(
    conn: Conn,
    spec: CounterSpec,
    target: int,
    batch: Sequence[Any],
    column: bool,
    previous: list[str] | None,
    floor: tuple[list[str] | None] | None,
) -> tuple[int, list[Any], tuple[list[str] | None] | None]:
    """One batch of a recount, in the caller's transaction.

    Returns (rows fixed, keys left busy, the cursor floor): once a key is left busy,
    the recorded cursor stays before it (``previous``: the cursor before this batch;
    a cursor of None means from the start).
    """
    held: list[Any]
    if column:
        fixed, held = _recount_column(conn, spec, target, batch)
        texts = [[str(k)] for k in batch]
        held_texts = {str(k) for k in held}
        first_held = next((i for i, k in enumerate(batch) if str(k) in held_texts), None)
    else:
        fixed, held = _recount_named(conn, spec, target, batch)
        texts = [list(k) for k in batch]
        held_keys = [list(k) for k in held]
        first_held = next((i for i, k in enumerate(texts) if k in held_keys), None)
    if floor is None and first_held is not None:
        floor = (texts[first_held - 1] if first_held > 0 else previous,)
    last = floor[0] if floor is not None else texts[-1]
    conn.execute(
        _sql("recount_progress"),
        (last, len(batch) - len(held), fixed, spec.name),
    )
    return fixed, held, floor


def _start(conn: Conn, name: str, resume: bool, result: RecountResult) -> list[str] | None:
    """The cursor to resume from (None: from the start); records the recount."""
    with conn.transaction():
        row = conn.execute(_sql("recount_cursor"), (name,)).fetchone()
        if resume and row is not None and row[1] and row[0] is not None:
            result.resumed = True
            return list(row[0])
        conn.execute(_sql("recount_start"), (name,))
    return None


def _range_filter(
    column: sql.Composable, key_type: str, last: str | None, key_range: KeyRange | None
) -> sql.Composable:
    conds: list[sql.Composable] = []
    cast = sql.SQL(key_type)
    if last is not None:
        conds.append(sql.SQL("{} > {}::{}").format(column, sql.Literal(last), cast))
    low, high = key_range if key_range is not None else (None, None)
    if low is not None:
        conds.append(sql.SQL("{} >= {}::{}").format(column, sql.Literal(str(low)), cast))
    if high is not None:
        conds.append(sql.SQL("{} <= {}::{}").format(column, sql.Literal(str(high)), cast))
    return sql.SQL(" AND ").join(conds) if conds else sql.SQL("true")


def _column_key_count(
    conn: Conn,
    spec: CounterSpec,
    cursor: list[str] | None,
    key_range: KeyRange | None,
) -> int:
    """How many parent rows a recount of a column counter goes through."""
    t = spec.target
    assert isinstance(t, ColumnTarget)
    k = sql.Identifier(t.key_column)
    with conn.transaction():
        row = conn.execute(
            _composed(
                "parent_key_count",
                p=t.table.identifier(),
                w=_range_filter(k, t.key_type, cursor[0] if cursor else None, key_range),
            )
        ).fetchone()
    return int(row[0]) if row else 0


def _column_batches(
    conn: Conn,
    spec: CounterSpec,
    cursor: list[str] | None,
    batch_size: int,
    key_range: KeyRange | None,
) -> Iterator[list[Any]]:
    """Parent keys in key order, a batch at a time (read afresh before each batch)."""
    t = spec.target
    assert isinstance(t, ColumnTarget)
    k = sql.Identifier(t.key_column)
    last: str | None = cursor[0] if cursor else None
    while True:
        with conn.transaction():
            rows = conn.execute(
                _composed(
                    "parent_keys_after",
                    k=k,
                    p=t.table.identifier(),
                    w=_range_filter(k, t.key_type, last, key_range),
                    n=sql.Literal(batch_size),
                )
            ).fetchall()
        if not rows:
            return
        keys = [r[0] for r in rows]
        yield keys
        last = str(keys[-1])


def _recount_column(
    conn: Conn,
    spec: CounterSpec,
    target: int,
    keys: Sequence[Any],
    *,
    wait: bool = False,
) -> tuple[int, list[Any]]:
    """Recount the parent rows of ``keys``; returns (rows fixed, keys whose rows were busy).

    Rows are locked in key order without waiting (``wait``: waiting, for one key).
    """
    t = spec.target
    assert isinstance(t, ColumnTarget)
    parent, k, c = t.table.identifier(), sql.Identifier(t.key_column), sql.Identifier(t.column)
    wanted = _typed_array(keys, t.key_type)
    # 1. lock the counter rows, in key order, without waiting for a row another holds
    locked = [
        r[0]
        for r in conn.execute(
            _composed(
                "lock_parent_rows",
                p=parent,
                k=k,
                keys=wanted,
                skip=sql.SQL("" if wait else " SKIP LOCKED"),
            )
        ).fetchall()
    ]
    held: list[Any] = []
    if len(locked) < len(keys):
        # rows not locked: busy, or deleted since the keys were listed (nothing to do)
        taken = set(locked)
        missing = [key for key in keys if key not in taken]
        held = [
            r[0]
            for r in conn.execute(
                _composed("parent_rows", p=parent, k=k, keys=_typed_array(missing, t.key_type))
            ).fetchall()
        ]
    if not locked:
        return 0, held
    mine = _typed_array(locked, t.key_type)
    # 2. truth and pending from one snapshot: stored = truth - pending
    truth = truth_query(spec, sql.SQL("{} = ANY ({})").format(_key_expr(spec), mine))
    text_keys = _composed(
        "parent_key_texts", text_key=_parent_key_text(spec, sql.SQL("u")), keys=mine
    )
    conn.execute(query("applying_on"))
    cur = conn.execute(
        _composed(
            "recount_column",
            truth=truth,
            pending=_pending(target, text_keys),
            text_key=_parent_key_text(spec, sql.SQL("x.{}").format(k)),
            k=k,
            c=c,
            value=column_value(spec, sql.SQL("w.value")),
            p=parent,
            keys=mine,
        )
    )
    fixed = max(cur.rowcount, 0)
    conn.execute(query("applying_off"))
    return fixed, held


def _recount_busy_key(
    conn: Conn,
    spec: CounterSpec,
    target: int,
    key: Any,
    column: bool,
    attempts: int,
) -> int:
    """Recount one key whose row was busy: its own transaction waits for that row alone,
    with a lock_timeout below deadlock_timeout; retried while the row stays busy."""
    what = f"{spec.name} key {key!r}"

    def attempt() -> int:
        conn.execute(_composed("busy_lock_timeout", timeout=sql.Literal(BUSY_LOCK_TIMEOUT)))
        if column:
            fixed, _ = _recount_column(conn, spec, target, [key], wait=True)
        else:
            fixed, _ = _recount_named(conn, spec, target, [key], wait=True)
        conn.execute(_sql("recount_busy_key_done"), (fixed, spec.name))
        return fixed

    if not column:
        retrying(conn, "recount", what, partial(_create_named_rows, conn, target, [key]))
    return retrying(conn, "recount", what, attempt, retries=max(attempts - 1, 0))


def _named_keys(
    conn: Conn,
    spec: CounterSpec,
    target: int,
    cursor: list[str] | None,
    key_range: KeyRange | None,
) -> list[list[str]]:
    """Keys known now (truth, stored or pending), in key order.

    Keys that appear later had no count before: the queue brings them in.
    """
    first = (
        _range_filter(_key_expr(spec), spec.key_types[0], None, key_range)
        if (key_range is not None and spec.keys)
        else None
    )
    with conn.transaction():
        rows = conn.execute(
            # in byte order (COLLATE "C"), which is Python's order of the same keys: the
            # resume cursor below is compared in Python, whatever the database's collation
            _composed(
                "named_keys",
                truth=truth_query(spec, first),
                target=sql.Literal(target),
                pending=_pending(target),
            )
        ).fetchall()
    keys: list[list[str]] = [list(r[0]) for r in rows]
    if _kept_periods(spec) is not None:
        # periods a counter no longer keeps are not recounted (the worker deletes them)
        with conn.transaction():
            row = conn.execute(_composed("first_period_kept", kept=_first_kept(spec))).fetchone()
        if row is not None and row[0] is not None:
            keys = [key for key in keys if key[-1] >= row[0]]
    if key_range is not None and spec.keys:
        keys = [key for key in keys if _in_range(spec, key[0], key_range)]
    if cursor is not None:
        keys = [key for key in keys if key > cursor]
    return keys


def _check_range(spec: CounterSpec, key_range: KeyRange) -> None:
    """Refuse a range whose low end is above its high end: it holds no key, and a
    recount of nothing that says it is done would read as a repair."""
    low, high = key_range
    types = spec.key_types[:1]
    if low is None or high is None or types[0] == "text":
        # text is ordered by the database's collation, which Python does not know
        return
    first, last = (decode_key([str(v)], types)[0] for v in (low, high))
    if first > last:  # type: ignore[operator]
        raise InvalidArgument(
            f"{spec.name}: the key range from {low} to {high} is empty (its low end is above "
            "its high end)"
        )


def _in_range(spec: CounterSpec, part: str, key_range: KeyRange) -> bool:
    types = spec.key_types[:1]
    value = decode_key([part], types)[0]
    low, high = (None if v is None else decode_key([str(v)], types)[0] for v in key_range)
    above = low is None or low <= value  # type: ignore[operator]
    below = high is None or value <= high  # type: ignore[operator]
    return bool(above and below)


def _create_named_rows(conn: Conn, target: int, keys: Sequence[Sequence[str]]) -> None:
    """Every key gets a row in ``pgcounters.counters`` (in a transaction of its own: an
    insert may wait for another transaction inserting the same key, and must hold
    nothing else while it does)."""
    conn.execute(_composed("create_named_rows", t=sql.Literal(target), batch=_text_keys(keys)))


def _recount_named(
    conn: Conn,
    spec: CounterSpec,
    target: int,
    keys: Sequence[Sequence[str]],
    *,
    wait: bool = False,
) -> tuple[int, list[list[str]]]:
    """Recount named keys whose rows exist; returns (rows fixed, keys whose rows were busy)."""
    tid = sql.Literal(target)
    # 1. lock the rows in key order, without waiting for a row another holds
    locked = [
        list(r[0])
        for r in conn.execute(
            _composed(
                "lock_named_rows",
                t=tid,
                batch=_text_keys(keys),
                skip=sql.SQL("" if wait else " SKIP LOCKED"),
            )
        ).fetchall()
    ]
    taken = {tuple(k) for k in locked}
    held = [list(k) for k in keys if tuple(k) not in taken]
    if not locked:
        return 0, held
    batch = _text_keys(locked)
    # 2. truth and pending from one snapshot: stored = truth - pending
    extra = None
    if spec.keys:
        firsts = sorted({key[0] for key in locked})
        extra = sql.SQL("{} = ANY ({})").format(
            _key_expr(spec), _typed_array(firsts, spec.key_types[0])
        )
    cur = conn.execute(
        _composed(
            "recount_named",
            truth=truth_query(spec, extra),
            pending=_pending(target, batch),
            batch=batch,
            t=tid,
        )
    )
    return max(cur.rowcount, 0), held
