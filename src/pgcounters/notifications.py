"""Change notifications: which counters and keys a drain batch changed.

A worker asked to report changes (:class:`~pgcounters.Worker` with ``on_change``,
:attr:`~pgcounters.WorkerSettings.notify`) learns, inside each drain batch and
before it commits, the keys the batch applied: the drain functions note them in
a setting local to the batch's transaction (one extra statement a batch, none
when nobody listens). After the commit the worker

* calls ``on_change(changes)`` once per committed batch, ``changes`` mapping a
  counter name to the set of its keys the batch changed (keys as
  :meth:`Counters.get` takes them, e.g. ``(42,)``), or to None when it changed
  more than ``notify_max_keys`` keys (:data:`MAX_KEYS` by default): "many keys",
  the counter changed and its keys are not listed (a cache drops all of that
  counter); never for a batch that rolled back; a callback that raises is logged
  and the worker goes on;
* with ``notify`` on, sends one ``NOTIFY`` on :data:`CHANNEL` for the batches
  committed since the last one, at most once per ``notify_interval`` seconds:
  a JSON object of counter name to a list of keys (each key a list of its
  stored text parts, ``{"comments": [["42"], ["7"]]}``). A counter of many
  keys is named with ``"*"``: everything of that counter changed, as is, for
  the counters with the most keys, a payload larger than PostgreSQL allows
  (``{"*": "*"}``: everything changed).

Delivery is at least once while the worker runs: a key may be reported by more
than one batch, and a batch that is retried after an abort reports nothing until
it commits. A worker stopped between a commit and its report (a crash) does not
report that batch.

Counters in ``direct`` mode change inside the writing transaction, with no drain
batch. While a reporting worker runs it is registered (:func:`listen_direct`), and
the writing statements note the keys they change (one row per statement and
counter, in ``pgcounters.direct_changes``), visible once their transaction commits
and never for one that rolls back. Each round the worker takes what committed
(:func:`take_direct`) and reports it to the same listeners, the same way.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping
from operator import itemgetter
from typing import Any, TypeAlias

from pgcounters.connection import Conn
from pgcounters.errors import InvalidKey
from pgcounters.keys import Key, KeyType, decode_key
from pgcounters.sqlfiles import named

logger = logging.getLogger("pgcounters.notifications")

CHANNEL = "pgcounters_changes"
"""The channel of the worker's change notifications (``LISTEN pgcounters_changes``)."""

MAX_PAYLOAD = 7999
"""PostgreSQL refuses a notification payload of 8000 bytes or more."""

EVERYTHING = "*"
"""In a payload: every key of a counter (as its value) or every counter (as a name)."""

MAX_KEYS = 1000
"""The most keys of one counter a report lists (``notify_max_keys``): above, "many keys"."""

Changes: TypeAlias = dict[str, set[Key] | None]
"""Counter name -> the keys that changed, or None: many keys (more than the worker's
``notify_max_keys``) changed, not listed; every cached value of that counter is stale."""

ChangeCallback: TypeAlias = Callable[[Changes], object]


def _sql(name: str) -> str:
    return named("notifications.sql")[name]


def statement(name: str) -> str:
    """A named statement of the notes: ``note_changes`` (ask the drain batches of the open
    transaction to note their changes), ``noted_changes`` (read them, for :func:`decode_noted`)."""
    return _sql(name)


def decode_noted(row: Any, max_keys: int | None = MAX_KEYS) -> Changes:
    """The changes a ``noted_changes`` row holds: counter name -> decoded keys, or None
    for a counter with more than ``max_keys`` keys noted (their keys are not decoded) or
    noted by the drain as ``[name, null]`` (more keys than the batch's cap)."""
    if row is None:
        return {}
    noted: list[tuple[str, list[str] | None]] = json.loads(row[0])
    if not noted:
        return {}
    # a jsonb, parsed by psycopg; text on a connection that loads jsonb as text (Django's)
    raw_types = row[1]
    types: dict[str, list[KeyType]] = (
        json.loads(raw_types) if isinstance(raw_types, str) else raw_types or {}
    )
    changes: Changes = {}
    many: set[str] = set()
    if max_keys is not None and len(noted) > max_keys:
        # how many keys each counter noted, counted without a Python loop
        tally = Counter(map(itemgetter(0), noted))
        many = {c for c, n in tally.items() if n > max_keys}
        for counter in many:
            changes[counter] = None
        if len(many) == len(tally):
            return changes
    # the parts of each listed counter's keys first, then one decoding pass per counter
    by_counter: dict[str, list[list[str]]] = {}
    for counter, parts in noted:
        if counter in many:
            continue
        if parts is None:
            # noted by the drain as more keys than a batch lists
            many.add(counter)
            changes[counter] = None
            by_counter.pop(counter, None)
            continue
        found = by_counter.get(counter)
        if found is None:
            by_counter[counter] = [parts]
        else:
            found.append(parts)
    for counter, keys in by_counter.items():
        key_types = types.get(counter)
        if key_types == ["bigint"]:
            changes[counter] = {(int(parts[0]),) for parts in keys}
        else:
            decode = _decoder(key_types)
            changes[counter] = {decode(parts) for parts in keys}
    return changes


def capped(changes: Changes, max_keys: int | None) -> Changes:
    """``changes`` with each counter of more than ``max_keys`` keys as None (many keys)."""
    if max_keys is not None:
        for counter, keys in changes.items():
            if keys is not None and len(keys) > max_keys:
                changes[counter] = None
    return changes


def _decoder(key_types: list[KeyType] | None) -> Callable[[list[str]], Key]:
    """Stored key parts -> the key (the drain's keys are canonical: a row id is an int's
    text); the parts as they are for a counter dropped meanwhile."""
    if key_types is None:
        return tuple
    if key_types == ["bigint"]:
        return lambda parts: (int(parts[0]),)
    types = tuple(key_types)

    def decode(parts: list[str]) -> Key:
        try:
            return decode_key(parts, types)
        except InvalidKey:
            return tuple(parts)

    return decode


def merge(
    into: Changes, more: Mapping[str, Iterable[Key] | None], max_keys: int | None = None
) -> Changes:
    """Add the keys of ``more`` to ``into`` (None, many keys, absorbs any keys); a counter
    left with more than ``max_keys`` keys becomes None; return ``into``."""
    for counter, keys in more.items():
        if keys is None:
            into[counter] = None
            continue
        if counter in into and into[counter] is None:
            continue
        found = into.setdefault(counter, set())
        assert found is not None
        found.update(keys)
        if max_keys is not None and len(found) > max_keys:
            into[counter] = None
    return into


def _text(part: object) -> str:
    return part if isinstance(part, str) else str(part)


def payload(changes: Mapping[str, Collection[Key] | None], limit: int = MAX_PAYLOAD) -> str:
    """The JSON payload of a notification, at most ``limit`` bytes: a counter of many keys
    (None) is ``"*"`` (everything of that counter changed), as are the counters with the
    most keys until it fits, and ``{"*": "*"}`` (everything changed) when even that does
    not fit."""
    body: dict[str, Any] = {}
    for counter, keys in sorted(changes.items()):
        # a key takes at least 6 bytes (["1"],): a counter with more keys than fit cannot
        # be listed, and is not serialised to find out
        if keys is None or len(keys) * 6 > limit:
            body[counter] = EVERYTHING
        else:
            body[counter] = sorted([_text(p) for p in key] for key in keys)

    def encoded() -> bytes:
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()

    data = encoded()
    while len(data) > limit:
        lists = [c for c, v in body.items() if v != EVERYTHING]
        if not lists:
            return json.dumps({EVERYTHING: EVERYTHING})
        widest = max(lists, key=lambda c: (len(json.dumps(body[c])), c))
        body[widest] = EVERYTHING
        data = encoded()
    return data.decode()


def parse_payload(text: str) -> dict[str, set[tuple[str, ...]] | None]:
    """Read a notification's payload: counter name -> keys (tuples of the stored text
    parts), or None for "every key of this counter"; ``{"*": None}``: everything changed."""
    raw = json.loads(text)
    if not isinstance(raw, dict):
        raise ValueError(f"not a change notification: {text[:100]!r}")
    out: dict[str, set[tuple[str, ...]] | None] = {}
    for counter, keys in raw.items():
        out[str(counter)] = (
            None if keys == EVERYTHING else {tuple(str(p) for p in key) for key in keys}
        )
    return out


class Notifier:
    """Reports committed changes: the callback at once, the NOTIFY rate-limited."""

    def __init__(
        self,
        on_change: ChangeCallback | None,
        *,
        notify: bool,
        interval: float,
        max_keys: int | None = MAX_KEYS,
    ) -> None:
        self.on_change = on_change
        self.notify = notify
        self.interval = interval
        self.max_keys = max_keys
        self._pending: Changes = {}
        self._last_sent: float | None = None
        self.notifications = 0
        self.callback_errors = 0

    @property
    def active(self) -> bool:
        """Whether anyone listens (the drain notes its changes only then)."""
        return self.on_change is not None or self.notify

    def committed(self, conn: Conn, changes: Changes) -> None:
        """A batch committed these changes: call back, and notify when due."""
        if not changes:
            return
        if self.on_change is not None:
            try:
                self.on_change(changes)
            except Exception:
                self.callback_errors += 1
                logger.exception("the change callback failed (the worker goes on)")
        if self.notify:
            merge(self._pending, changes, self.max_keys)
            self.flush(conn)

    def flush(self, conn: Conn, *, force: bool = False) -> bool:
        """Send the pending changes in one NOTIFY if the interval has passed (or
        ``force``); True if one was sent."""
        if not self._pending:
            return False
        now = time.monotonic()
        if not force and self._last_sent is not None and now - self._last_sent < self.interval:
            return False
        conn.execute(
            _sql("notify_changes"), {"channel": CHANNEL, "payload": payload(self._pending)}
        )
        self._pending = {}
        self._last_sent = now
        self.notifications += 1
        return True


def listen_direct(conn: Conn) -> int:
    """Register the session as a reporting worker: from now on, direct-mode counters
    note the keys their writing statements change. Returns the workers registered."""
    row = conn.execute(_sql("listen_direct_changes")).fetchone()
    return int(row[0]) if row else 0


def direct_counters(conn: Conn) -> list[str]:
    """The names of the direct-mode counters."""
    return [str(r[0]) for r in conn.execute(_sql("direct_counter_names")).fetchall()]


def unlisten_direct(conn: Conn) -> int:
    """Unregister the session; the last one to go drops the notes nobody will report.
    Returns the workers still registered."""
    row = conn.execute(_sql("unlisten_direct_changes")).fetchone()
    return int(row[0]) if row else 0


def take_direct(conn: Conn, limit: int = 1000, max_keys: int | None = MAX_KEYS) -> Changes:
    """Take (delete) at most ``limit`` noted statements of direct-mode counters whose
    transactions committed, and return their changes (counter name -> keys). The taking
    commits with the caller's transaction (at once on an autocommit connection): report
    the changes after it. A counter of more than ``max_keys`` keys is None (many keys)."""
    return take_direct_batch(conn, limit, max_keys)[0]


def take_direct_batch(
    conn: Conn, limit: int = 1000, max_keys: int | None = MAX_KEYS
) -> tuple[Changes, int]:
    """As :func:`take_direct`, with the number of noted statements taken: ``limit`` of
    them means more may be waiting (take again)."""
    rows = conn.execute(_sql("take_direct_changes"), {"limit": limit}).fetchall()
    changes, taken = _decode_taken(rows)
    return capped(changes, max_keys), taken


def _decode_taken(rows: Iterable[Any]) -> tuple[Changes, int]:
    decoders: dict[str, Callable[[list[str]], Key]] = {}
    listed: dict[str, set[Key]] = {}
    taken = 0
    for counter, parts, key_types, rows_taken in rows:
        taken = int(rows_taken)
        decode = decoders.get(counter)
        if decode is None:
            decode = decoders[counter] = _decoder(list(key_types))
        listed.setdefault(counter, set()).add(decode(list(parts)))
    changes: Changes = dict(listed)
    return changes, taken
