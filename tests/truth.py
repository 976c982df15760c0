"""The independent truth every counter of the suite is judged against.

A counter's truth is written by hand in the test: a plain ``GROUP BY`` with
``count(*)`` or ``sum(...)`` over the source rows (:func:`from_sql`), or, for a
counter declared on Django models, the ORM's own ``annotate(Count(...,
filter=Q(...)))`` / ``Sum`` (:func:`from_rows` with values the test computes).
Nothing here calls the trigger compiler, ``verify`` or ``recount``: a wrong
condition, key or sum in pgcounters disagrees with this truth instead of being
wrong on both sides.

* :func:`assert_exact` compares pgcounters' exact reads (stored + pending, as
  ``Counters.get_many`` returns them) with the truth, key by key;
* :func:`assert_drained` drains every queue first, then also checks that no
  delta of the counters is left and that the stored values (read by hand from
  the counter column or from ``pgcounters.counters``) equal the truth.

Which keys are judged: for a column counter every row of the parent table
(the truth of a parent without rows is 0); for a named counter every key the
truth counts and every key pgcounters holds a value or a pending delta for. A
key pgcounters holds that no typed key can name (a NULL part, a text that does
not parse) is a mismatch whenever its value is not zero. Every mismatching key
is listed in the failure message.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, TypeAlias

from psycopg import sql

from pgcounters import Counters
from pgcounters.connection import Conn

Key: TypeAlias = tuple[Any, ...]
Number: TypeAlias = int | Decimal  # a sum of decimals (a numeric(p, s) column) is exact too
Values: TypeAlias = dict[Key, Number]
Reader: TypeAlias = Callable[[Conn], Values]
Query: TypeAlias = str | sql.SQL | sql.Composed

_SHOWN = 40  # mismatches spelled out in a failure message (all are counted)


@dataclass(frozen=True)
class Truth:
    """One counter and how to compute its truth without pgcounters.

    ``count``: every key of the truth with its value (keys as typed tuples:
    ``(1,)``, ``(1, datetime.date(2026, 11, 21))``, ``()`` for a global counter).
    ``stored``: for a column counter, every parent key with the value stored in
    its counter column (None for a named counter, whose values are read from
    ``pgcounters.counters``).
    """

    counter: str
    count: Reader
    stored: Reader | None = None

    @property
    def is_column(self) -> bool:
        return self.stored is not None


def _rows_to_values(rows: Iterable[Sequence[Any]]) -> Values:
    """``(key part, ..., value)`` rows to a mapping; a NULL value (a sum of nothing) is 0."""
    out: Values = {}
    for row in rows:
        key = tuple(row[:-1])
        if key in out:
            raise AssertionError(f"the truth query returned key {key!r} twice")
        value = row[-1] or 0
        out[key] = value if isinstance(value, Decimal) else int(value)
    return out


def _query(text: Query, params: Sequence[Any]) -> Reader:
    def read(conn: Conn) -> Values:
        return _rows_to_values(conn.execute(text, params).fetchall())

    return read


def from_sql(
    counter: str, query: Query, params: Sequence[Any] = (), *, stored: Query | None = None
) -> Truth:
    """A truth counted by hand-written SQL.

    ``query`` returns one row per key: its key parts, then its value. ``stored``
    (column counters only) returns one row per parent: its key, then the value
    in its counter column.
    """
    return Truth(counter, _query(query, params), None if stored is None else _query(stored, ()))


def from_rows(counter: str, count: Reader, stored: Reader | None = None) -> Truth:
    """A truth computed by the test some other way (the Django ORM's own aggregates)."""
    return Truth(counter, count, stored)


# -- what pgcounters holds, read by hand ------------------------------------------------


def _target(conn: Conn, counter: str) -> tuple[int, list[str]] | None:
    """The counter's target id and key types; None when no trigger has recorded it yet
    (a declared counter gets its target when its triggers first fire)."""
    row = conn.execute(
        "SELECT id, key_types FROM pgcounters.targets WHERE name = %s", (counter,)
    ).fetchone()
    return None if row is None else (int(row[0]), list(row[1]))


def _scale(conn: Conn, target: int) -> int | None:
    """Decimal places of a sum of decimals (its values are kept in units of 10^-scale)."""
    row = conn.execute("SELECT scale FROM pgcounters.targets WHERE id = %s", (target,)).fetchone()
    return None if row is None or row[0] is None else int(row[0])


def _from_units(scale: int | None, units: int) -> Number:
    """A value kept in units, read by hand: ``12345`` at scale 2 is ``123.45``."""
    return units if scale is None else Decimal(units).scaleb(-scale)


def _part(text: str | None, key_type: str) -> Any:
    if text is None:
        raise ValueError("a NULL key part")
    if key_type == "bigint":
        if text.strip() != text or not text.lstrip("-").isdigit():
            raise ValueError(text)
        return int(text)
    if key_type == "date":
        return dt.date.fromisoformat(text)
    if key_type == "uuid":
        value = uuid.UUID(text)
        if str(value) != text:
            raise ValueError(text)
        return value
    return text


def _typed(parts: Sequence[str | None], key_types: Sequence[str]) -> Key | None:
    """The typed key of a stored ``text[]`` key, or None when no typed key names it."""
    if len(parts) != len(key_types):
        return None
    try:
        return tuple(_part(p, t) for p, t in zip(parts, key_types, strict=True))
    except ValueError:
        return None


def _held(conn: Conn, target: int) -> dict[tuple[str | None, ...], Number]:
    """Stored + pending per key of a named counter, summed by hand from the tables."""
    rows = conn.execute(
        "SELECT key, sum(v)::bigint FROM ("
        " SELECT key, value AS v FROM pgcounters.counters WHERE target_id = %(t)s"
        " UNION ALL SELECT key::text[], delta FROM pgcounters.queue WHERE target_id = %(t)s"
        " UNION ALL SELECT key::text[], delta FROM pgcounters.queue_unlogged"
        " WHERE target_id = %(t)s) AS h GROUP BY key",
        {"t": target},
    ).fetchall()
    scale = _scale(conn, target)
    return {tuple(key): _from_units(scale, int(value)) for key, value in rows}


def _stored_named(conn: Conn, target: int) -> dict[tuple[str | None, ...], Number]:
    rows = conn.execute(
        "SELECT key, value FROM pgcounters.counters WHERE target_id = %s", (target,)
    ).fetchall()
    scale = _scale(conn, target)
    return {tuple(key): _from_units(scale, int(value)) for key, value in rows}


def pending_deltas(conn: Conn, counter: str) -> int:
    """Deltas of one counter still waiting in either queue (counted by hand)."""
    found = _target(conn, counter)
    if found is None:
        return 0
    target, _ = found
    row = conn.execute(
        "SELECT (SELECT count(*) FROM pgcounters.queue WHERE target_id = %(t)s)"
        " + (SELECT count(*) FROM pgcounters.queue_unlogged WHERE target_id = %(t)s)",
        {"t": target},
    ).fetchone()
    assert row is not None
    return int(row[0])


# -- comparing ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Mismatch:
    counter: str
    key: Any
    truth: Number
    found: Number
    what: str  # "exact" or "stored"

    def __str__(self) -> str:
        return f"{self.counter} {self.key!r}: truth {self.truth}, {self.what} {self.found}"


def _compare(
    counter: str,
    what: str,
    truth: Mapping[Key, Number],
    found: Mapping[Any, Number],
    keys: Iterable[Any],
) -> list[Mismatch]:
    out = []
    for key in keys:
        expected, actual = truth.get(key, 0), found.get(key, 0)
        if expected != actual:
            out.append(Mismatch(counter, key, expected, actual, what))
    return out


def _sorted(keys: Iterable[Any]) -> list[Any]:
    return sorted(keys, key=repr)


def exact_mismatches(conn: Conn, truth: Truth) -> list[Mismatch]:
    """Keys whose exact value (``Counters.get_many``) differs from the truth."""
    expected = truth.count(conn)
    pc = Counters(conn)
    recorded = _target(conn, truth.counter)
    if truth.stored is not None:
        stored = truth.stored(conn)
        keys = _sorted(stored)  # every parent row
        if recorded is None:  # nothing pending: the column is the whole value
            return _compare(truth.counter, "exact", expected, stored, keys)
        found = dict(zip(keys, _exact(pc, truth.counter, keys), strict=True))
        return _compare(truth.counter, "exact", expected, found, keys)
    if recorded is None:  # nothing stored, nothing pending
        return _compare(truth.counter, "exact", expected, {}, _sorted(expected))
    target, key_types = recorded
    held = _held(conn, target)
    found_untyped: dict[Any, Number] = {}
    typed_keys = set(expected)
    for parts, value in held.items():
        typed = _typed(parts, key_types)
        if typed is None:
            found_untyped[parts] = value
        else:
            typed_keys.add(typed)
    keys = _sorted(typed_keys)
    exact: dict[Any, Number] = dict(zip(keys, _exact(pc, truth.counter, keys), strict=True))
    out = _compare(truth.counter, "exact", expected, exact, keys)
    out += _compare(truth.counter, "held", {}, found_untyped, _sorted(found_untyped))
    return out


def _exact(pc: Counters, counter: str, keys: list[Any]) -> list[Number]:
    """Exact values through the client: ``get_many``, or ``get_many_decimal`` for a sum of
    decimals."""
    if pc.counter(counter).scale is None:
        return list(pc.get_many(counter, keys))
    return list(pc.get_many_decimal(counter, keys))


def stored_mismatches(conn: Conn, truth: Truth) -> list[Mismatch]:
    """Keys whose stored value (read by hand, pending deltas left out) differs from the truth."""
    expected = truth.count(conn)
    if truth.stored is not None:
        stored = truth.stored(conn)
        return _compare(truth.counter, "stored", expected, stored, _sorted(stored))
    recorded = _target(conn, truth.counter)
    rows = {} if recorded is None else _stored_named(conn, recorded[0])
    key_types = [] if recorded is None else recorded[1]
    found: dict[Any, Number] = {}
    for parts, value in rows.items():
        typed = _typed(parts, key_types)
        found[parts if typed is None else typed] = value
    return _compare(truth.counter, "stored", expected, found, _sorted(set(expected) | set(found)))


def _fail(mismatches: Sequence[Mismatch], header: str) -> None:
    if not mismatches:
        return
    lines = [str(m) for m in mismatches[:_SHOWN]]
    if len(mismatches) > _SHOWN:
        lines.append(f"... and {len(mismatches) - _SHOWN} more")
    raise AssertionError(f"{header}: {len(mismatches)} mismatching keys\n" + "\n".join(lines))


def assert_exact(conn: Conn, truths: Iterable[Truth]) -> None:
    """Every counter's exact values equal its independent truth, key by key."""
    mismatches: list[Mismatch] = []
    for truth in truths:
        mismatches += exact_mismatches(conn, truth)
    _fail(mismatches, "pgcounters' exact values differ from the truth")


def assert_drained(conn: Conn, truths: Iterable[Truth]) -> None:
    """Drain every queue, then: no delta of these counters is left, and both the stored and
    the exact values equal the truth, key by key."""
    truths = list(truths)
    Counters(conn).drain()
    left = {t.counter: n for t in truths if (n := pending_deltas(conn, t.counter))}
    if left:
        raise AssertionError(f"deltas left after a full drain: {left}")
    mismatches: list[Mismatch] = []
    for truth in truths:
        mismatches += stored_mismatches(conn, truth) + exact_mismatches(conn, truth)
    _fail(mismatches, "pgcounters' values after a full drain differ from the truth")


def assert_stored(conn: Conn, truths: Iterable[Truth]) -> None:
    """The stored values (pending deltas left out) equal the truth: for a check after a drain
    the test ran itself, or of what a recount wrote."""
    mismatches: list[Mismatch] = []
    for truth in truths:
        mismatches += stored_mismatches(conn, truth)
    _fail(mismatches, "pgcounters' stored values differ from the truth")


def values(conn: Conn, truth: Truth) -> Values:
    """The truth's values (for tests that look at a few keys themselves)."""
    return truth.count(conn)
