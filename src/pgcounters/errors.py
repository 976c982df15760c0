"""The exception hierarchy of pgcounters.

Every error the library raises on purpose is a :class:`PgCountersError`. The
docstring of each class is its default message. Errors caused by the database
keep the driver's exception as ``__cause__``.

The classes are grouped by family, each family under its own heading below:

- setup: configuration, connection, the embedded server, the installed schema,
  the database role's privileges;
- arguments: a value passed to a call is not acceptable (:class:`InvalidArgument`,
  also a ``ValueError``);
- definitions: a counter declaration is invalid, conflicts or is unknown;
- counter states: the counter cannot take this operation now (backfilling,
  broken by a schema change, a guarded column, an overflow);
- concurrency and retries: PostgreSQL cancelled or aborted the work; nothing of
  it was written, and it may be retried;
- hot standbys: the server takes no writes, or has not caught up;
- increment buffers: a batching or Redis buffer refused or could not write;
- quotas and rate limits;
- sharding.

:class:`CounterError` and :class:`QuotaError` cut across the families: every
refused counter operation is a ``CounterError``, every refused quota operation a
``QuotaError``, whatever its family.
"""

from __future__ import annotations

from psycopg import errors as _pg


class PgCountersError(Exception):
    """pgcounters failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class CounterError(PgCountersError):
    """A counter operation was refused."""


class QuotaError(PgCountersError):
    """A quota operation was refused."""


# -- setup: configuration, connection, schema, privileges --------------------------


class ConfigurationError(PgCountersError):
    """pgcounters is not configured correctly."""


class ConnectionFailed(PgCountersError):
    """Could not connect to PostgreSQL."""


class EmbeddedPostgresError(PgCountersError):
    """The embedded PostgreSQL server could not be started or stopped."""


class SchemaError(PgCountersError):
    """The pgcounters schema is not usable."""


class SchemaNotInstalled(SchemaError):
    """The pgcounters schema is not installed in this database: run `pgcounters install`."""


class SchemaVersionMismatch(SchemaError):
    """The installed pgcounters schema is not the version this code expects."""


class UnsupportedServer(SchemaError):
    """This PostgreSQL is older than the oldest version pgcounters is tested on."""


# Errors of PostgreSQL that pgcounters explains but whose SQLSTATE callers may
# rely on (here and in the concurrency and hot-standby families): they subclass
# both PgCountersError and psycopg's own class, so `except
# psycopg.errors.QueryCanceled` (or a check of `.sqlstate`) still works.


class PermissionDenied(PgCountersError, _pg.InsufficientPrivilege):
    """This database role may not do that: see `pgcounters grant` and docs/security.md."""


# -- arguments: a value passed to a call is not acceptable --------------------------


class InvalidArgument(PgCountersError, ValueError):
    """Invalid argument: a value passed to pgcounters is not acceptable (a batch size, a
    limit, a sample size, a key of the wrong type...). Also a ``ValueError``."""


class InvalidCounterName(CounterError, InvalidArgument):
    """Invalid counter name."""


class InvalidKey(CounterError, InvalidArgument):
    """The key does not match the counter's key types."""


class InvalidDelta(CounterError, InvalidArgument):
    """A delta must be an integer within the range of a PostgreSQL bigint."""


class InvalidText(InvalidArgument):
    """PostgreSQL text cannot hold this string: it contains a NUL character or an unpaired
    surrogate."""


# -- definitions: a counter declaration is invalid, conflicts or is unknown ----------


class InvalidCounterDefinition(CounterError):
    """Invalid counter definition."""


class CounterDefinitionConflict(CounterError):
    """A counter with this name already exists with another definition."""


class CounterDeliveredElsewhere(InvalidCounterDefinition):
    """The counter is already kept by triggers delivered another way (for example by Django
    migrations); installing it again would count every row twice."""


class UnknownCounter(CounterError):
    """No counter with this name is declared."""


# -- counter states: the counter cannot take this operation now -----------------------


class CounterBackfilling(CounterError):
    """The counter is being backfilled: its exact values are ready when the backfill ends."""


class CounterBroken(CounterError):
    """A schema change broke a declared counter (a column it reads was renamed, dropped or
    changed type): install the counter again to match the table, or undo the change."""


class CounterColumnWrite(CounterError):
    """A counter column is kept by pgcounters: only the rows it counts change it."""


class CounterOverflow(CounterError):
    """A counter value would leave the range of a PostgreSQL bigint."""


# -- concurrency and retries: cancelled or aborted, nothing written ------------------


class StatementTimeout(PgCountersError, _pg.QueryCanceled):
    """The statement was cancelled (statement_timeout or a cancel request): nothing of it was
    written, its transaction is aborted; roll back and retry."""


class LockTimeout(PgCountersError, _pg.LockNotAvailable):
    """A lock was not granted within lock_timeout: nothing of the statement was written, its
    transaction is aborted; roll back and retry."""


class BatchAborted(PgCountersError):
    """PostgreSQL aborted a batch again and again (deadlock, serialization failure, lock or
    statement timeout) and pgcounters stopped retrying it; nothing of that batch was
    written."""


class DrainError(PgCountersError):
    """Draining the queue failed."""


class WorkerError(PgCountersError):
    """The worker stopped on an error it cannot recover from."""


# -- hot standbys -------------------------------------------------------------------


class ReplicaError(PgCountersError):
    """This server is a read-only hot standby: writes, and exact reads of unlogged counters,
    go to the primary."""


class ReplicaNotCaughtUp(ReplicaError):
    """The standby did not replay the primary's position within the time allowed."""


class ReadOnlyServer(ReplicaError, _pg.ReadOnlySqlTransaction):
    """This server takes no writes (a hot standby, or a read-only transaction): send writes to
    the primary. Also a ``psycopg.errors.ReadOnlySqlTransaction``, for code that catches that."""


# -- increment buffers ----------------------------------------------------------------


class IncrementBufferError(PgCountersError):
    """An increment buffer failed."""


class BufferFlushFailed(IncrementBufferError):
    """Writing buffered increments to PostgreSQL failed; they are kept and will be written later."""


class BufferFull(IncrementBufferError):
    """The increment buffer is full because its writes keep failing; the increment was refused."""


class BufferClosed(IncrementBufferError):
    """The increment buffer is closed; the increment was refused."""


class RedisUnavailable(IncrementBufferError):
    """Redis cannot be reached; the operation was not done."""


# -- quotas and rate limits -------------------------------------------------------------


class UnknownQuota(QuotaError):
    """No quota with this name is defined."""


class InvalidQuotaDefinition(QuotaError):
    """Invalid quota definition."""


class QuotaDefinitionConflict(QuotaError):
    """A quota with this name already exists with another window."""


class InvalidQuotaLimit(QuotaError):
    """A quota limit must be a positive number of calls over a non-empty time range."""


class OverlappingQuotaLimits(InvalidQuotaLimit):
    """The limit overlaps another limit of the same quota and subject."""


class InvalidSubject(QuotaError, InvalidArgument):
    """A quota subject must be a non-blank string of at most 1000 characters."""


class InvalidCost(QuotaError, InvalidArgument):
    """The cost of a call must be a positive integer within the range of a bigint."""


class InvalidBucketWidth(InvalidQuotaDefinition, InvalidArgument):
    """Invalid bucket width of a sliding window: not a positive duration, not dividing the
    window, or making more than 1000 buckets. Also an ``InvalidArgument``."""


class InvalidQuotaArgument(QuotaError, InvalidArgument):
    """Invalid argument to a quota operation."""


# -- sharding -------------------------------------------------------------------------


class ShardingError(PgCountersError):
    """The operation would span shards, and a transaction cannot: see docs/scale-out.md."""
