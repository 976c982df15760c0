"""Who holds back VACUUM: the oldest snapshot of the database, and what holds it.

While a snapshot is open (a ``pg_dump``, a report in REPEATABLE READ, a session idle
in a transaction), no row version that died after it was taken can be removed. The
queue and the counters then keep every version the drain leaves behind, and every
batch walks them (see "A queue no long transaction slows down" in
docs/architecture.md). :func:`holders` lists what holds the horizon, oldest first:
``pgcounters status`` shows it (text, JSON, Prometheus, the admin page) and a worker
logs a WARNING through :class:`HorizonWatch` once one is older than its
``horizon_warning``.

A role without ``pg_read_all_stats`` sees how old other roles' snapshots are (in
transactions, ``xid_age``) and their sessions' application names, but not their state nor
since when: the worker then times a snapshot from when it first saw it.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pgcounters.connection import Conn
from pgcounters.plans import AsyncConn
from pgcounters.sqlfiles import named

HORIZON_WARNING = 60.0
"""Seconds a snapshot may hold the horizon before a worker logs a WARNING (default)."""
HORIZON_EVERY = 10.0
"""Seconds between two looks of a worker at the horizon."""
HORIZON_REMIND = 600.0
"""Seconds between two WARNINGs about the same holder while it keeps the horizon."""
SHOWN = 5
"""The most holders a look lists."""


@dataclass(frozen=True)
class HorizonHolder:
    """One thing that keeps VACUUM from removing row versions in this database."""

    kind: str
    """``session``, ``standby`` (hot-standby feedback), ``replication slot`` or
    ``prepared transaction``."""
    pid: int | None
    name: str | None
    """The application name of a session or standby, a slot's name, a prepared
    transaction's identifier."""
    state: str | None
    """A session's state (``idle in transaction``, ``active``...); None when hidden."""
    since: dt.datetime | None
    """Start of the session's transaction (of a standby's connection; of a prepared
    transaction's preparation); None when hidden or unknown."""
    seconds: float | None
    """Seconds since ``since``."""
    xid_age: int
    """Transactions started since the oldest one this holder may still see as running."""

    @property
    def visible(self) -> bool:
        """Whether the role may see who holds it (``pg_read_all_stats`` or the same role)."""
        return self.kind != "session" or self.state is not None

    def describe(self) -> str:
        """``session 4242 (psql, idle in transaction, since 2026-12-08 10:02:11 UTC)``."""
        who = f"{self.kind} {self.pid}" if self.pid is not None else self.kind
        parts = [repr(self.name) if self.kind != "session" else self.name or "no name"]
        if not self.visible:
            parts.append("its state hidden from this role: grant it pg_read_all_stats")
        if self.state:
            parts.append(self.state)
        if self.since is not None:
            parts.append(f"since {self.since:%Y-%m-%d %H:%M:%S %Z}".rstrip())
        return f"{who} ({', '.join(parts)})"


def _holders(rows: Iterable[Sequence[Any]]) -> tuple[HorizonHolder, ...]:
    return tuple(
        HorizonHolder(
            kind=str(r[0]),
            pid=None if r[1] is None else int(r[1]),
            name=None if r[2] is None else str(r[2]),
            state=None if r[3] is None else str(r[3]),
            since=r[4],
            seconds=None if r[5] is None else float(r[5]),
            xid_age=int(r[6]),
        )
        for r in rows
    )


def holders(conn: Conn, limit: int = SHOWN) -> tuple[HorizonHolder, ...]:
    """What holds the horizon of ``conn``'s database, the oldest first (read-only)."""
    rows = conn.execute(named("operations.sql")["horizon_holders"], {"limit": limit}).fetchall()
    return _holders(rows)


async def aholders(conn: AsyncConn, limit: int = SHOWN) -> tuple[HorizonHolder, ...]:
    """:func:`holders` on an async connection."""
    cur = await conn.execute(named("operations.sql")["horizon_holders"], {"limit": limit})
    return _holders(await cur.fetchall())


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


class HorizonWatch:
    """A worker's look at the horizon, every :data:`HORIZON_EVERY` seconds.

    :meth:`seen` returns the lines to log: a WARNING when a holder has kept the horizon
    longer than ``threshold`` seconds (again every :data:`HORIZON_REMIND` seconds while it
    does), an INFO line when a holder warned about lets go. A holder is told apart by its
    kind, pid and start; its age is the start's when the role may see it, else the time
    since the worker first saw it hold the horizon.
    """

    def __init__(self, threshold: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.threshold = threshold
        self._clock = clock
        self._next_look = 0.0
        self._first_seen: dict[tuple[object, ...], tuple[float, int]] = {}
        self._warned: dict[tuple[object, ...], tuple[float, HorizonHolder]] = {}

    def due(self) -> bool:
        """Whether a look is due now (never with a threshold of 0); takes the next time."""
        now = self._clock()
        if self.threshold <= 0 or now < self._next_look:
            return False
        self._next_look = now + HORIZON_EVERY
        return True

    @staticmethod
    def _identity(h: HorizonHolder) -> tuple[object, ...]:
        return (h.kind, h.pid, h.name, h.since)

    def seen(self, found: Sequence[HorizonHolder]) -> list[tuple[int, str]]:
        """The lines (level, message) to log for what one look found."""
        now = self._clock()
        out: list[tuple[int, str]] = []
        current = {self._identity(h): h for h in found}
        for key in list(self._first_seen):
            if key not in current:
                del self._first_seen[key]
        for key, (_, holder) in list(self._warned.items()):
            if key not in current:
                del self._warned[key]
                out.append(
                    (
                        logging.INFO,
                        f"the horizon is no longer held by {holder.describe()}",
                    )
                )
        for key, h in current.items():
            first, age = self._first_seen.get(key, (now, h.xid_age))
            if h.xid_age < age:
                # hidden from this role, the same session with a younger snapshot: a new
                # transaction (a snapshot's age in transactions only grows)
                first = now
                self._warned.pop(key, None)
            self._first_seen[key] = (first, h.xid_age)
            held = h.seconds if h.seconds is not None else now - first
            if held < self.threshold:
                continue
            last = self._warned.get(key)
            if last is not None and now - last[0] < HORIZON_REMIND:
                continue
            self._warned[key] = (now, h)
            out.append(
                (
                    logging.WARNING,
                    f"the oldest snapshot of the database has been held for {_age(held)} "
                    f"({h.xid_age:,} transactions) by {h.describe()}: until it ends, "
                    "VACUUM cannot remove the row versions the drain leaves behind, and "
                    "drains and exact reads slow down as they grow",
                )
            )
        return out
