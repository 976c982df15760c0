"""Deltas the drain could not apply, set aside in ``pgcounters.quarantine``.

A delta whose counter's stored value would leave the bigint range, whose key does
not cast to a column counter's key type or is not an array, or whose counter no
longer exists, would fail every batch it is in and stop the drain of every other
delta. The drain moves it here instead, with the error, and goes on. An operator
lists what was set aside, fixes the cause (widens a column, resets a value,
re-creates a counter) and replays it, or discards it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from psycopg.rows import tuple_row

from pgcounters import schema
from pgcounters.connection import Conn
from pgcounters.dberrors import translated
from pgcounters.errors import InvalidArgument
from pgcounters.sqlfiles import named


def _ops(name: str) -> str:
    return named("operations.sql")[name]


@dataclass(frozen=True)
class QuarantinedDelta:
    """One delta set aside."""

    id: int
    counter: str
    """The counter's name when it was set aside (``#<id>`` when no counter had that id)."""
    key: str
    """The key as it was queued (the text of a ``text[]``)."""
    delta: int
    unlogged: bool
    created_at: dt.datetime
    quarantined_at: dt.datetime
    sqlstate: str
    error: str


def list_quarantined(
    conn: Conn, counter: str | None = None, limit: int = 1000
) -> list[QuarantinedDelta]:
    """Deltas set aside (of one counter, or all), oldest first, at most ``limit``."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidArgument(f"limit must be a positive integer, got {limit!r}")
    schema.check(conn)
    with translated(), conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(_ops("quarantine_list"), {"counter": counter, "limit": limit})
        return [QuarantinedDelta(*row) for row in cur.fetchall()]


def _selection(ids: Sequence[int] | None, counter: str | None, everything: bool) -> dict[str, Any]:
    chosen = int(ids is not None) + int(counter is not None) + int(everything)
    if chosen != 1:
        raise InvalidArgument("choose the deltas: by ids, by counter, or all of them")
    if ids is not None and (
        not ids or any(isinstance(i, bool) or not isinstance(i, int) for i in ids)
    ):
        raise InvalidArgument(f"ids must be a non-empty list of integers, got {ids!r}")
    return {"ids": list(ids) if ids is not None else None, "counter": counter}


def replay(
    conn: Conn,
    ids: Sequence[int] | None = None,
    counter: str | None = None,
    *,
    everything: bool = False,
) -> int:
    """Move set-aside deltas back into their queues; returns how many.

    Choose them by ``ids``, by ``counter`` name (deltas of a counter that was dropped
    and re-created under that name go to the counter of that name now), or
    ``everything``. Replay after fixing the cause: a delta that still cannot be
    applied is set aside again by the next drain. The deltas of a counter that was
    dropped and not declared again are not moved: they stay set aside until it is.
    """
    return _apply(conn, "quarantine_replay", _selection(ids, counter, everything))


def discard(
    conn: Conn,
    ids: Sequence[int] | None = None,
    counter: str | None = None,
    *,
    everything: bool = False,
) -> int:
    """Delete set-aside deltas for good (chosen as for :func:`replay`); returns how many."""
    return _apply(conn, "quarantine_discard", _selection(ids, counter, everything))


def _apply(conn: Conn, name: str, params: dict[str, Any]) -> int:
    """Run the named statement on the chosen deltas; how many it moved or deleted."""
    schema.check(conn)
    with translated(), conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(_ops(name), params)
        row = cur.fetchone()
    return int(row[0]) if row else 0
