"""The Redis write-behind buffer: increments go to Redis, a flusher moves them to PostgreSQL.

Layout in Redis (one slot of a buffer, all its keys under one hash tag)::

    PREFIX:{NAME}:pending        hash  field = JSON [counter, [key parts]] -> summed delta
    PREFIX:{NAME}:next           the id the next flush will take (created on first use)
    PREFIX:{NAME}:inflight       sorted set of flush ids taken and not yet acknowledged
    PREFIX:{NAME}:flush:<id>     the hash taken by flush <id>
    PREFIX:{NAME}:rejected       fields a flush could not apply (unknown counter, bad key)

A buffer has one slot by default (the tag ``{NAME}``). With ``slots=N`` (the
default on a Redis Cluster: 16) it has N, tagged ``{NAME#0}`` ... ``{NAME#N-1}``:
each hash tag is one cluster hash slot, so the buffer's load spreads over the
cluster's masters. A field always goes to the same slot (CRC-32 of the field),
and each slot is flushed on its own exactly as below: slots are independent
buffers that share a name.

``incr`` is one ``HINCRBY`` on the pending hash (in a Lua script that first
makes sure ``next`` exists). A flush:

1. recovers flushes left in flight by a flusher that died (step 3 and 4 for each);
2. **takes** the pending hash atomically (a Lua script: ``RENAME`` it to
   ``flush:<id>`` where ``<id>`` is the value of ``next``, store a fresh ``next``,
   add ``<id>`` to the in-flight set);
3. **applies** it in ONE PostgreSQL transaction that writes the netted deltas
   to the queue (COPY; ``Counters.incr_many`` for direct counters) and records ``<id>`` in
   ``pgcounters.buffer_flushes``; an id already recorded is not applied again;
4. **acknowledges** in Redis: deletes ``flush:<id>`` and removes ``<id>`` from
   the in-flight set (one ``MULTI``).

A flusher that dies between 3 and 4 leaves ``<id>`` in flight; the next flush
finds it recorded and only acknowledges it: never counted twice.

**Exact reads** run one Lua script (the ``next`` id, the pending value, the
value in every in-flight flush) and then ONE SQL statement (the exact database
value and which of those ids are recorded, from one snapshot). A flush
recorded in that snapshot is counted from the database, any other from Redis;
the pending value is counted from Redis unless the flush that takes it (the
``next`` id) is already recorded.

**Durability.** An increment acknowledged by ``incr`` lives in Redis until a
flush commits it. Lost are: what Redis loses (all of the pending and in-flight
hashes without persistence; what was written after the last save/fsync with
RDB/AOF), and, when Redis comes back from a snapshot older than the last flush
(its ``next`` id is already recorded), the increments made after the restart
until the first flush after it. That restored hash is skipped (logged as a
warning), never applied twice. See docs/event-counters.md.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import weakref
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from pgcounters.client import Increment
from pgcounters.config import redact
from pgcounters.connection import Conn
from pgcounters.errors import (
    BufferFlushFailed,
    ConfigurationError,
    IncrementBufferError,
    PgCountersError,
    RedisUnavailable,
    UnknownCounter,
)
from pgcounters.flushlog import (
    DbLink,
    EncodedIncrement,
    check_buffer_name,
    exact_with_flushes,
    new_flush_id,
    write_flush,
)
from pgcounters.keys import check_delta, check_name, decode_key, encode_key

log = logging.getLogger("pgcounters.redis_buffer")

REDIS_URL_VARIABLE = "PGCOUNTERS_REDIS_URL"
Fallback = Literal["raise", "database"]
AnyRedis: TypeAlias = "redis.Redis | RedisCluster"
CLUSTER_SLOTS = 16
"""Slots of a buffer on a Redis Cluster, unless ``slots`` says otherwise."""
MAX_SLOTS = 1024

_TAKE = """
-- KEYS: pending, next, inflight; ARGV: flush key prefix, id if none is set, the following id
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
local id = redis.call('GET', KEYS[2]) or ARGV[2]
redis.call('SET', KEYS[2], ARGV[3])
redis.call('RENAME', KEYS[1], ARGV[1] .. id)
redis.call('ZADD', KEYS[3], redis.call('TIME')[1], id)
return id
"""

_READ = """
-- KEYS: pending, next, inflight; ARGV: field, flush key prefix, id if none is set
local nxt = redis.call('GET', KEYS[2])
if not nxt then
  redis.call('SET', KEYS[2], ARGV[3])
  nxt = ARGV[3]
end
local out = {nxt, redis.call('HGET', KEYS[1], ARGV[1])}
for _, id in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
  local v = redis.call('HGET', ARGV[2] .. id, ARGV[1])
  if v then
    out[#out + 1] = id
    out[#out + 1] = v
  end
end
return out
"""

_INCR = """
-- KEYS: pending, next; ARGV: field, delta, id if none is set
-- The id of the flush that will take an increment exists before the increment:
-- a snapshot of Redis that holds the increment also holds that id.
redis.call('SET', KEYS[2], ARGV[3], 'NX')
return redis.call('HINCRBY', KEYS[1], ARGV[1], ARGV[2])
"""

_UNREACHABLE = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)
# a cluster whose slot has no master now: the command was not run
_CLUSTER_DOWN = (
    redis.exceptions.ClusterDownError,
    redis.exceptions.SlotNotCoveredError,
    redis.exceptions.RedisClusterException,
)


def redis_url(explicit: str | None = None) -> str:
    """The Redis URL: ``explicit``, else ``PGCOUNTERS_REDIS_URL``; else ConfigurationError."""
    url = explicit or os.environ.get(REDIS_URL_VARIABLE, "").strip()
    if not url:
        raise ConfigurationError(
            f"no Redis configured: pass a URL or set {REDIS_URL_VARIABLE} (redis://host:6379/0)"
        )
    return url


def connect_redis(url: str) -> AnyRedis:
    """A client for ``url`` that does not retry commands on its own.

    A retried ``HINCRBY`` whose first reply was lost would count twice; a
    failure is surfaced instead (as RedisUnavailable, or the database fallback).
    ``?cluster=yes`` in the URL gives a Redis Cluster client (any node of the
    cluster as the URL's host and port); it follows MOVED and ASK redirections
    (the command was not run) and never resends a command after a lost reply.
    """
    try:
        cluster, plain = _cluster_flag(url)
        if cluster:
            return RedisCluster.from_url(
                plain,
                retry=Retry(NoBackoff(), 0),
                socket_connect_timeout=2.0,
                socket_timeout=5.0,
            )
        return redis.Redis.from_url(
            plain,
            retry=Retry(NoBackoff(), 0),
            socket_connect_timeout=2.0,
            socket_timeout=5.0,
        )
    except ValueError as exc:
        raise ConfigurationError(f"invalid Redis URL {redact(url)!r}: {exc}") from exc
    except redis.exceptions.RedisClusterException as exc:
        raise RedisUnavailable(f"Redis Cluster at {redact(url)} is unreachable ({exc})") from exc
    except _UNREACHABLE as exc:
        raise RedisUnavailable(f"Redis Cluster at {redact(url)} is unreachable ({exc})") from exc


def _cluster_flag(url: str) -> tuple[bool, str]:
    """(``cluster=`` of the URL's query, the URL without it)."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    flags = [v.lower() for k, v in query if k == "cluster"]
    if not flags:
        return False, url
    if flags[-1] not in ("yes", "true", "1", "no", "false", "0"):
        raise ValueError(f"cluster= takes yes or no, not {flags[-1]!r}")
    rest = urlencode([(k, v) for k, v in query if k != "cluster"])
    return flags[-1] in ("yes", "true", "1"), urlunsplit(parts._replace(query=rest))


def _retries(client: AnyRedis) -> int:
    """How many times ``client`` resends a command whose connection failed."""
    retry = client.retry if isinstance(client, RedisCluster) else client.get_retry()
    return 0 if retry is None else int(retry.get_retries())


@dataclass(frozen=True)
class _Slot:
    """The keys of one slot of a buffer (one hash tag: one cluster hash slot)."""

    pending: str
    next: str
    inflight: str
    flush_prefix: str
    rejected: str

    @classmethod
    def of(cls, prefix: str, tag: str) -> _Slot:
        base = f"{prefix}:{{{tag}}}"
        return cls(base + ":pending", base + ":next", base + ":inflight", base + ":flush:",
                   base + ":rejected")  # fmt: skip


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class FlushResult:
    """What one :meth:`RedisBuffer.flush` did."""

    flushes: int = 0
    """flushes applied to PostgreSQL (taken now or recovered)"""
    recovered: int = 0
    """flushes left in flight by an earlier flusher, found and resolved"""
    skipped: int = 0
    """flushes found already recorded in PostgreSQL, acknowledged without applying"""
    keys: int = 0
    """(counter, key) pairs written"""
    total: int = 0
    """sum of the deltas written"""
    rejected: int = 0
    """fields moved to the rejected hash (unknown counter or bad key)"""
    seconds: float = 0.0
    unavailable: int = 0
    """slots that could not be reached (a cluster master down): flushed next time"""

    def __add__(self, other: FlushResult) -> FlushResult:
        return FlushResult(
            self.flushes + other.flushes,
            self.recovered + other.recovered,
            self.skipped + other.skipped,
            self.keys + other.keys,
            self.total + other.total,
            self.rejected + other.rejected,
            self.seconds + other.seconds,
            self.unavailable + other.unavailable,
        )


_LIVE: weakref.WeakSet[RedisBuffer] = weakref.WeakSet()


def _reset_after_fork() -> None:
    for buffer in list(_LIVE):
        buffer._link = DbLink.after_fork(buffer._link)
        buffer._flush_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def _field_text(name: str, encoded: list[str]) -> str:
    """The hash field of a counter's key in its canonical text form."""
    return json.dumps([name, encoded], separators=(",", ":"), ensure_ascii=False)


class RedisBuffer:
    """Increments buffered in Redis and flushed to PostgreSQL exactly once.

    Thread-safe. A forked child gets its own database connection (redis-py
    reconnects by itself after a fork).

    ``database``: a DSN (the buffer owns its connection) or a psycopg connection.
    ``redis_client``: a URL (``?cluster=yes`` for a Redis Cluster), a
    ``redis.Redis`` or ``redis.cluster.RedisCluster`` client that does not
    retry commands (see :func:`connect_redis`), or None for ``PGCOUNTERS_REDIS_URL``.
    ``fallback``: when Redis is unreachable, ``"raise"`` raises RedisUnavailable
    (the increment is not counted) and ``"database"`` writes the increment to
    the database queue instead (``Counters.incr``), logging a warning.
    ``slots``: how many hash slots the buffer is spread over (default 1, or
    16 on a Redis Cluster). Every writer and flusher of a buffer must use the
    same number: to change it, stop the writers and flush first.
    """

    def __init__(
        self,
        database: str | Conn,
        redis_client: str | AnyRedis | None = None,
        *,
        name: str = "default",
        prefix: str = "pgcounters",
        fallback: Fallback = "raise",
        slots: int | None = None,
    ) -> None:
        if fallback not in ("raise", "database"):
            raise ConfigurationError(f"fallback must be 'raise' or 'database', got {fallback!r}")
        self.name = check_buffer_name(name)
        self.prefix = check_buffer_name(prefix)
        self.fallback: Fallback = fallback
        self.redis: AnyRedis
        if isinstance(redis_client, redis.Redis | RedisCluster):
            if _retries(redis_client):
                raise ConfigurationError(
                    "the given Redis client resends a command after a connection failure, so an "
                    "increment whose reply was lost would count twice: build it with "
                    "retry=Retry(NoBackoff(), 0), or pass a URL (pgcounters.redis_buffer."
                    "connect_redis)"
                )
            self.redis = redis_client
            self._owns_redis = False
            self._where = "the given Redis client"
        else:
            url = redis_url(redis_client)
            self.redis = connect_redis(url)
            self._owns_redis = True
            self._where = f"Redis at {redact(url)}"
        clustered = isinstance(self.redis, RedisCluster)
        if slots is None:
            slots = CLUSTER_SLOTS if clustered else 1
        if isinstance(slots, bool) or not isinstance(slots, int) or not 1 <= slots <= MAX_SLOTS:
            raise ConfigurationError(f"slots must be an int from 1 to {MAX_SLOTS}, got {slots!r}")
        self._link = DbLink(database)
        self._flush_lock = threading.Lock()
        self._seen_inflight: dict[_Slot, list[str]] = {}
        self.slots: tuple[_Slot, ...] = (
            (_Slot.of(self.prefix, self.name),)
            if slots == 1
            else tuple(_Slot.of(self.prefix, f"{self.name}#{i}") for i in range(slots))
        )
        first = self.slots[0]
        # the keys of the first slot (the only one by default)
        self.pending_key = first.pending
        self.next_key = first.next
        self.inflight_key = first.inflight
        self.flush_prefix = first.flush_prefix
        self.rejected_key = first.rejected
        self._incr = self.redis.register_script(_INCR)
        self._take = self.redis.register_script(_TAKE)
        self._read = self.redis.register_script(_READ)
        _LIVE.add(self)
        self.after_commit: Callable[[str], object] | None = None
        """Called with the flush id between the database commit and the Redis
        acknowledgement (a seam for fault tests and instrumentation)."""

    # -- validation ---------------------------------------------------------

    def field(self, name: str, key: object = None) -> str:
        """The validated hash field of one counter and key."""
        counter = self._link.counter(name)
        return _field_text(name, encode_key(key, counter.key_types, name))

    def slot_of(self, field: str) -> _Slot:
        """The slot that holds ``field`` (the same in every process: CRC-32, not hash())."""
        if len(self.slots) == 1:
            return self.slots[0]
        return self.slots[zlib.crc32(field.encode()) % len(self.slots)]

    def _unavailable(self, exc: Exception, what: str) -> RedisUnavailable:
        return RedisUnavailable(f"{self._where} is unreachable ({exc}); {what}")

    # -- increments ---------------------------------------------------------

    def incr(self, name: str, key: object = None, delta: int = 1) -> None:
        """Add ``delta`` in Redis (one HINCRBY). Acknowledged when this returns."""
        field = self.field(name, key)
        check_delta(delta)
        slot = self.slot_of(field)
        try:
            self._incr(keys=[slot.pending, slot.next], args=[field, delta, new_flush_id()])
        except _UNREACHABLE as exc:
            self._fall_back(exc, [(name, key, delta)])
        except _CLUSTER_DOWN as exc:
            self._fall_back(exc, [(name, key, delta)])
        except redis.exceptions.ResponseError as exc:
            raise IncrementBufferError(f"Redis refused the increment of {name!r}: {exc}") from exc

    def incr_many(self, items: Iterable[Increment]) -> None:
        """Add many increments, each item validated first, in one MULTI per slot.

        With one slot (the default outside a cluster) that is all or none. With
        several, each slot's share is all or none; when Redis fails part-way,
        the error says how many were counted (with ``fallback="database"``, the
        ones not counted in Redis go to the database queue).
        """
        batch = list(items)
        by_slot: dict[_Slot, list[tuple[int, str, int]]] = defaultdict(list)
        for index, (name, key, delta) in enumerate(batch):
            field = self.field(name, key)
            by_slot[self.slot_of(field)].append((index, field, check_delta(delta)))
        done: list[int] = []
        for slot, entries in by_slot.items():
            try:
                with self.redis.pipeline(transaction=True) as pipe:
                    pipe.set(slot.next, new_flush_id(), nx=True)
                    for _, field, delta in entries:
                        pipe.hincrby(slot.pending, field, delta)
                    pipe.execute()
            except (*_UNREACHABLE, *_CLUSTER_DOWN) as exc:
                counted = set(done)
                rest = [item for i, item in enumerate(batch) if i not in counted]
                if done and self.fallback != "database":
                    raise self._unavailable(
                        exc,
                        f"{len(done)} of the {len(batch)} increments were counted, "
                        "the others were not",
                    ) from exc
                self._fall_back(exc, rest)
                return
            except redis.exceptions.ResponseError as exc:
                counted_note = f" ({len(done)} of {len(batch)} counted)" if done else ""
                raise IncrementBufferError(
                    f"Redis refused the increments{counted_note}: {exc}"
                ) from exc
            done.extend(index for index, _, _ in entries)

    def _fall_back(self, exc: Exception, items: Sequence[Increment]) -> None:
        if self.fallback != "database":
            raise self._unavailable(exc, "the increment was not counted") from exc
        log.warning(
            "%s is unreachable (%s): %d increments written to the database queue instead",
            self._where,
            exc,
            len(items),
        )
        self._link.run(lambda pc: pc._incr_many(items))

    # -- reads --------------------------------------------------------------

    def get(self, name: str, key: object = None) -> int:
        """Exact value: the database's exact value plus what is still in Redis."""
        field = self.field(name, key)
        counter = self._link.counter(name)
        encoded = encode_key(key, counter.key_types, name)
        slot = self.slot_of(field)
        try:
            raw = self._read(
                keys=[slot.pending, slot.next, slot.inflight],
                args=[field, slot.flush_prefix, new_flush_id()],
            )
        except (*_UNREACHABLE, *_CLUSTER_DOWN) as exc:
            raise self._unavailable(exc, "an exact read needs it") from exc
        next_id, pending = _text(raw[0]), int(raw[1] or 0)
        parts = [(_text(raw[i]), int(raw[i + 1])) for i in range(2, len(raw), 2)]
        with self._link.lock:
            value, recorded = exact_with_flushes(
                self._link.counters(), counter, encoded, [next_id, *(fid for fid, _ in parts)]
            )
        if next_id not in recorded:
            value += pending
        return value + sum(v for fid, v in parts if fid not in recorded)

    def pending(self) -> tuple[int, int]:
        """(keys waiting in the pending hashes, flushes in flight), over every slot."""
        keys = inflight = 0
        try:
            for slot in self.slots:
                with self.redis.pipeline(transaction=False) as pipe:
                    pipe.hlen(slot.pending)
                    pipe.zcard(slot.inflight)
                    waiting, taken = pipe.execute()
                keys += int(waiting)
                inflight += int(taken)
        except (*_UNREACHABLE, *_CLUSTER_DOWN) as exc:
            raise self._unavailable(exc, "cannot count what is pending") from exc
        return keys, inflight

    # -- flushing -----------------------------------------------------------

    def flush(self) -> FlushResult:
        """Recover flushes left in flight, then take and apply what is pending now, per slot.

        Raises RedisUnavailable when Redis cannot be reached (with several
        slots: when none can; the slots that can are flushed and the others
        counted in ``FlushResult.unavailable``), BufferFlushFailed when
        PostgreSQL refuses the write (the taken hash stays in flight in Redis
        and the next flush applies it).
        """
        started = time.perf_counter()
        result = FlushResult()
        failures: list[Exception] = []
        with self._flush_lock:
            # the flushes in flight in EVERY slot: a fresh flush prunes the records of the
            # buffer's name, whichever slot wrote them, and must spare all of these
            reachable: list[tuple[_Slot, list[str]]] = []
            for slot in self.slots:
                try:
                    ids = [_text(i) for i in self.redis.zrange(slot.inflight, 0, -1)]
                except (*_UNREACHABLE, *_CLUSTER_DOWN) as exc:
                    failures.append(exc)
                    continue
                self._seen_inflight[slot] = ids
                reachable.append((slot, ids))
            # an unreachable slot's: as last seen by this process
            keep = [fid for ids in self._seen_inflight.values() for fid in ids]
            for slot, ids in reachable:
                try:
                    result += self._flush_slot(slot, ids, keep)
                except (*_UNREACHABLE, *_CLUSTER_DOWN) as exc:
                    failures.append(exc)
        if failures and len(failures) == len(self.slots):
            raise self._unavailable(failures[0], "nothing was flushed now") from failures[0]
        if failures:
            log.warning(
                "buffer %r: %d of %d slots unreachable (%s); the others were flushed",
                self.name,
                len(failures),
                len(self.slots),
                failures[0],
            )
        return FlushResult(
            result.flushes,
            result.recovered,
            result.skipped,
            result.keys,
            result.total,
            result.rejected,
            time.perf_counter() - started,
            len(failures),
        )

    def _flush_slot(self, slot: _Slot, inflight: list[str], keep: list[str]) -> FlushResult:
        result = FlushResult()
        for flush_id in inflight:
            result += self._apply(slot, flush_id, keep, recovered=True)
        taken = self._take(
            keys=[slot.pending, slot.next, slot.inflight],
            args=[slot.flush_prefix, new_flush_id(), new_flush_id()],
        )
        if taken:
            flush_id = _text(taken)
            result += self._apply(slot, flush_id, [*keep, flush_id], recovered=False)
        return result

    def _parse(self, raw: dict[Any, Any]) -> tuple[list[EncodedIncrement], dict[str, int]]:
        items: list[EncodedIncrement] = []
        rejected: dict[str, int] = {}
        for raw_field, raw_value in raw.items():
            field, value = _text(raw_field), int(raw_value)
            try:
                name, parts = json.loads(field)
                counter = self._link.counter(check_name(name))
                key = decode_key(parts, counter.key_types)
                if len(parts) != len(counter.key_types) or encode_key(
                    key if len(key) != 1 else key[0], counter.key_types, name
                ) != list(parts):
                    raise ValueError("key is not in canonical form")
            except (ValueError, TypeError, PgCountersError) as exc:
                if not isinstance(exc, UnknownCounter):
                    log.error("buffer %r: rejected field %r: %s", self.name, field, exc)
                rejected[field] = value
                continue
            if value:
                items.append((counter, tuple(parts), value))
        return items, rejected

    def _apply(
        self, slot: _Slot, flush_id: str, in_doubt: list[str], *, recovered: bool
    ) -> FlushResult:
        flush_key = slot.flush_prefix + flush_id
        raw = self.redis.hgetall(flush_key)
        if not raw:
            # acknowledged by another flusher meanwhile
            self.redis.zrem(slot.inflight, flush_id)
            return FlushResult()
        items, rejected = self._parse(raw)
        with self._link.lock:
            try:
                fresh, held = write_flush(
                    self._link.counters(),
                    flush_id,
                    self.name,
                    items,
                    keep=in_doubt,
                    redeclared=self._link.redeclared,
                )
            except BaseException as exc:
                # the taken hash stays in flight in Redis: the next flush looks it up
                self._link.reset()
                if not isinstance(exc, psycopg.Error | PgCountersError):
                    raise
                raise BufferFlushFailed(
                    f"flush {flush_id} of Redis buffer {self.name!r} could not be written "
                    f"({exc}); it stays in Redis and the next flush applies it"
                ) from exc
        for counter, encoded, delta in held:  # dropped since they were read: set aside too
            field = _field_text(counter.name, list(encoded))
            rejected[field] = rejected.get(field, 0) + delta
        items = [item for item in items if item not in held]
        if self.after_commit is not None:
            self.after_commit(flush_id)
        with self.redis.pipeline(transaction=True) as pipe:
            for field, value in rejected.items():
                pipe.hincrby(slot.rejected, field, value)
            pipe.delete(flush_key)
            pipe.zrem(slot.inflight, flush_id)
            pipe.execute()
        if rejected:
            log.error(
                "buffer %r: %d fields of flush %s were not applied (unknown counter or bad key); "
                "they are kept in %s",
                self.name,
                len(rejected),
                flush_id,
                slot.rejected,
            )
        total = sum(delta for _, _, delta in items)
        if not fresh:
            if recovered:
                log.info(
                    "buffer %r: flush %s was already applied; acknowledged", self.name, flush_id
                )
            else:
                log.warning(
                    "buffer %r: flush %s was already applied: Redis came back from a snapshot "
                    "older than its last flush. The restored hash (%d keys, total %d) is skipped, "
                    "not counted twice; increments made since the restart are lost with it",
                    self.name,
                    flush_id,
                    len(items),
                    total,
                )
            return FlushResult(recovered=int(recovered), skipped=1, rejected=len(rejected))
        return FlushResult(
            flushes=1,
            recovered=int(recovered),
            keys=len(items),
            total=total,
            rejected=len(rejected),
        )

    def close(self) -> None:
        self._link.close()
        if self._owns_redis:
            self.redis.close()

    def __enter__(self) -> RedisBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_worker(
    buffer: RedisBuffer,
    stop: threading.Event,
    *,
    interval: float = 1.0,
    report: Callable[[str], object] = print,
) -> FlushResult:
    """Flush every ``interval`` seconds until ``stop`` is set; errors are reported and retried.

    A flush in progress when ``stop`` is set is finished first. Returns the sum
    of every flush.
    """
    total = FlushResult()
    backoff = 0.0
    while not stop.is_set():
        started = time.monotonic()
        try:
            result = buffer.flush()
        except (IncrementBufferError, PgCountersError) as exc:
            report(f"flush failed: {exc}")
            backoff = min(max(backoff * 2, interval), 30.0)
            stop.wait(backoff)
            continue
        backoff = 0.0
        total += result
        if result.flushes or result.skipped or result.rejected or result.unavailable:
            report(describe(result))
        stop.wait(max(0.0, interval - (time.monotonic() - started)))
    return total


def describe(r: FlushResult) -> str:
    """One line about a flush result."""
    if not (r.flushes or r.skipped or r.rejected or r.unavailable):
        return "nothing to flush"
    text = f"flushed {r.flushes} ({r.keys} keys, total {r.total}) in {r.seconds:.3f}s"
    if r.recovered:
        text += f"; {r.recovered} recovered from an interrupted flusher"
    if r.skipped:
        text += f"; {r.skipped} already applied, skipped"
    if r.rejected:
        text += f"; {r.rejected} fields rejected"
    if r.unavailable:
        text += f"; {r.unavailable} slots unreachable, left for the next flush"
    return text
