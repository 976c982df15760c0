"""Translating database errors into the pgcounters exception hierarchy."""

from __future__ import annotations

from contextlib import AbstractContextManager
from types import TracebackType
from typing import Literal

import psycopg
from psycopg import errors as pg

from pgcounters import errors

# SQLSTATEs raised by the functions in sql/migrations (class "PC": pgcounters)
_OWN_CODES: dict[str, type[errors.PgCountersError]] = {
    "PC001": errors.CounterDefinitionConflict,
    "PC002": errors.InvalidCounterDefinition,
    "PC003": errors.UnknownCounter,
    "PC004": errors.InvalidKey,
    "PC005": errors.DrainError,
    # a counter name that is not one (create_counter, create_column_counter)
    "PC007": errors.InvalidCounterName,
    # a direct counter's value would leave the bigint range (the message names it)
    "PC008": errors.CounterOverflow,
    # a large batch refused the careful path (the drain takes smaller batches)
    "PC022": errors.DrainError,
    # a PostgreSQL older than the oldest pgcounters is tested on
    "PC023": errors.UnsupportedServer,
    # quotas (subclass Q)
    "PCQ01": errors.UnknownQuota,
    "PCQ02": errors.InvalidQuotaDefinition,
    "PCQ03": errors.QuotaDefinitionConflict,
    "PCQ04": errors.InvalidQuotaLimit,
    "PCQ05": errors.OverlappingQuotaLimits,
    "PCQ06": errors.InvalidSubject,
    "PCQ07": errors.InvalidCost,
    "PCQ08": errors.InvalidQuotaArgument,
    "PC006": errors.ConfigurationError,
    "PCC01": errors.CounterColumnWrite,
    "PCB01": errors.CounterBackfilling,
    "PC020": errors.CounterBroken,
    # a decimal with more decimal places than its counter's, or out of its range
    "PC021": errors.InvalidDelta,
    # a range of periods that is not one (counters per period)
    "PCT01": errors.InvalidArgument,
    # hot standbys (subclass R)
    "PCR01": errors.ReplicaError,
    # sharding through PL/Proxy (subclass S)
    "PCS01": errors.ShardingError,
}

_CONSTRAINTS: dict[str, type[errors.PgCountersError]] = {
    "targets_name_format": errors.InvalidCounterName,
    "targets_key_types_known": errors.InvalidCounterDefinition,
    "targets_mode_known": errors.InvalidCounterDefinition,
    "targets_column_target_complete": errors.InvalidCounterDefinition,
    # quotas: direct writes to the tables from SQL meet these
    "quotas_name_format": errors.InvalidQuotaDefinition,
    "quotas_period_known": errors.InvalidQuotaDefinition,
    "quotas_window_complete": errors.InvalidQuotaDefinition,
    "quotas_default_limit_positive": errors.InvalidQuotaLimit,
    "quota_limits_subject_format": errors.InvalidSubject,
    "quota_limits_calls_positive": errors.InvalidQuotaLimit,
    "quota_limits_valid_not_empty": errors.InvalidQuotaLimit,
    "quota_limits_no_overlap": errors.OverlappingQuotaLimits,
}


def translate(exc: psycopg.Error) -> errors.PgCountersError | None:
    """The pgcounters error for a driver error, or None if it is not ours to explain."""
    diag = exc.diag
    message = diag.message_primary or str(exc)
    sqlstate = exc.sqlstate or ""
    if sqlstate in _OWN_CODES:
        return _OWN_CODES[sqlstate](message)
    if isinstance(exc, pg.NumericValueOutOfRange):
        return errors.CounterOverflow(f"{errors.CounterOverflow.__doc__} ({message})")
    if isinstance(exc, pg.ExclusionViolation) and diag.constraint_name == "quota_limits_no_overlap":
        return errors.OverlappingQuotaLimits(message)
    if isinstance(exc, pg.CheckViolation) and diag.constraint_name in _CONSTRAINTS:
        return _CONSTRAINTS[diag.constraint_name](message)
    if isinstance(exc, pg.InvalidSchemaName | pg.UndefinedTable | pg.UndefinedFunction) and (
        "pgcounters" in message
    ):
        return errors.SchemaNotInstalled()
    if isinstance(exc, pg.UndefinedTable):
        return errors.InvalidCounterDefinition(message)
    if exc.sqlstate is None and isinstance(exc, psycopg.DataError) and "NUL" in str(exc):
        # raised by the driver before sending: text parameters cannot hold NUL
        return errors.InvalidText(f"{errors.InvalidText.__doc__} ({exc})")
    if isinstance(exc, pg.ReadOnlySqlTransaction):
        return errors.ReadOnlyServer(
            f"{message}: a hot standby (or a read-only transaction) takes no writes; "
            "send writes to the primary"
        )
    if isinstance(exc, pg.FeatureNotSupported) and "during recovery" in message:
        # a statement naming an unlogged table, planned on a hot standby
        return errors.ReplicaError(
            f"{message}: unlogged counters and the unlogged queue are read on the primary"
        )
    if isinstance(exc, pg.QueryCanceled):
        return errors.StatementTimeout(f"{message}: nothing was written; roll back and retry")
    if isinstance(exc, pg.LockNotAvailable):
        return errors.LockTimeout(f"{message}: nothing was written; roll back and retry")
    if isinstance(exc, pg.InsufficientPrivilege):
        return errors.PermissionDenied(
            f"{message}: this database role lacks the right (see `pgcounters grant` "
            "and docs/security.md)"
        )
    return None


class _Translated:
    """The context manager of :func:`translated`: a plain class, not a generator, because
    it wraps every increment and quota call (a generator-based one costs more per use)."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Literal[False]:
        if isinstance(exc, psycopg.Error):
            mapped = translate(exc)
            if mapped is not None:
                raise mapped from exc
        elif isinstance(exc, UnicodeEncodeError):
            # a parameter that UTF-8 cannot encode (an unpaired surrogate)
            raise errors.InvalidText(f"{errors.InvalidText.__doc__} ({exc})") from exc
        return False


_TRANSLATED = _Translated()


def translated() -> AbstractContextManager[None]:
    """Re-raise driver errors that pgcounters can explain as PgCountersError subclasses."""
    return _TRANSLATED
