"""pgcounters: exact, fast counters for PostgreSQL; increments lock no counter row by default.

Everything an application uses is imported from here (and, for Django, from
``pgcounters.contrib.django``); the other modules of the package are internal.
The parts beyond the core (the worker, the increment buffers, Redis, PL/Proxy,
the embedded server) are imported on first use, so ``import pgcounters`` stays
light and needs no optional dependency.

``recount`` and ``verify`` are functions, defined in the internal module
``pgcounters.repair``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from pgcounters import security, triggers
from pgcounters.client import AsyncCounters, Counter, Counters, DrainResult, Mode
from pgcounters.errors import (
    BatchAborted,
    BufferClosed,
    BufferFlushFailed,
    BufferFull,
    ConfigurationError,
    ConnectionFailed,
    CounterBackfilling,
    CounterBroken,
    CounterColumnWrite,
    CounterDefinitionConflict,
    CounterDeliveredElsewhere,
    CounterError,
    CounterOverflow,
    DrainError,
    EmbeddedPostgresError,
    IncrementBufferError,
    InvalidArgument,
    InvalidBucketWidth,
    InvalidCost,
    InvalidCounterDefinition,
    InvalidCounterName,
    InvalidDelta,
    InvalidKey,
    InvalidQuotaArgument,
    InvalidQuotaDefinition,
    InvalidQuotaLimit,
    InvalidSubject,
    InvalidText,
    LockTimeout,
    OverlappingQuotaLimits,
    PermissionDenied,
    PgCountersError,
    QuotaDefinitionConflict,
    QuotaError,
    ReadOnlyServer,
    RedisUnavailable,
    ReplicaError,
    ReplicaNotCaughtUp,
    SchemaError,
    SchemaNotInstalled,
    SchemaVersionMismatch,
    ShardingError,
    StatementTimeout,
    UnknownCounter,
    UnknownQuota,
    UnsupportedServer,
    WorkerError,
)
from pgcounters.estimates import estimate_query, estimate_table
from pgcounters.quotas import AsyncQuotas, CallResult, Quota, QuotaLimit, Quotas
from pgcounters.repair import RecountResult, VerifyResult, recount, verify
from pgcounters.schema import install, upgrade
from pgcounters.specs import (
    Bucket,
    ColumnTarget,
    CounterSpec,
    Fragment,
    NamedTarget,
    Table,
    Via,
    generic_relation,
)

if TYPE_CHECKING:
    from pgcounters import notifications, status
    from pgcounters.async_worker import AsyncWorker
    from pgcounters.batching import AsyncBatchingCounters, BatchingCounters
    from pgcounters.config import connect, dsn_from_env
    from pgcounters.embedded import EmbeddedPostgres
    from pgcounters.redis_buffer import RedisBuffer
    from pgcounters.sharding import install_proxy
    from pgcounters.worker import Worker, WorkerSettings

    __version__: str

# grouped by family, as the documentation presents them
__all__ = [  # noqa: RUF022
    "__version__",
    # -- the schema: install it, upgrade it
    "install",
    "upgrade",
    # -- connecting: a DSN from the environment, an embedded server for development
    "EmbeddedPostgres",
    "connect",
    "dsn_from_env",
    # -- counters read and written by the application
    "Counter",
    "Counters",
    "DrainResult",
    "Mode",
    # -- the same clients in an event loop (psycopg's AsyncConnection, AsyncConnectionPool)
    "AsyncCounters",
    "AsyncQuotas",
    # -- counters declared over tables, kept by triggers (install, drift, pause, uninstall
    #    are functions of the `triggers` namespace), checked and repaired by recount
    "Bucket",
    "ColumnTarget",
    "CounterSpec",
    "Fragment",
    "NamedTarget",
    "RecountResult",
    "Table",
    "Via",
    "VerifyResult",
    "generic_relation",
    "recount",
    "triggers",
    "verify",
    # -- estimated counts, from the planner's statistics
    "estimate_query",
    "estimate_table",
    # -- increment buffers, in the process (or its event loop) or in Redis
    "AsyncBatchingCounters",
    "BatchingCounters",
    "RedisBuffer",
    # -- the worker that drains the queues
    "AsyncWorker",
    "Worker",
    "WorkerSettings",
    # -- change notifications of the worker's batches: the `notifications` namespace
    #    (CHANNEL, Changes, parse_payload)
    "notifications",
    # -- quotas and rate limits
    "CallResult",
    "Quota",
    "QuotaLimit",
    "Quotas",
    # -- what an operator watches: queues, lag, workers, tables (`pgcounters status`); the
    #    `status` namespace (get_status, then text, to_json, prometheus of the snapshot)
    "status",
    # -- database roles: the `security` namespace (grant_app, grant_worker, grant_pause,
    #    revoke)
    "security",
    # -- sharding through PL/Proxy
    "install_proxy",
    # -- errors: the root, and the two bases every counter / quota refusal has
    "PgCountersError",
    "CounterError",
    "QuotaError",
    # -- errors of setup: configuration, connection, schema, privileges
    "ConfigurationError",
    "ConnectionFailed",
    "EmbeddedPostgresError",
    "PermissionDenied",
    "SchemaError",
    "SchemaNotInstalled",
    "SchemaVersionMismatch",
    "UnsupportedServer",
    # -- errors of arguments (each also a ValueError)
    "InvalidArgument",
    "InvalidCounterName",
    "InvalidDelta",
    "InvalidKey",
    "InvalidText",
    # -- errors of counter definitions
    "CounterDefinitionConflict",
    "CounterDeliveredElsewhere",
    "InvalidCounterDefinition",
    "UnknownCounter",
    # -- errors of a counter's state
    "CounterBackfilling",
    "CounterBroken",
    "CounterColumnWrite",
    "CounterOverflow",
    # -- errors of concurrency: cancelled or aborted, nothing written, retry
    "BatchAborted",
    "DrainError",
    "LockTimeout",
    "StatementTimeout",
    "WorkerError",
    # -- errors of hot standbys
    "ReadOnlyServer",
    "ReplicaError",
    "ReplicaNotCaughtUp",
    # -- errors of increment buffers
    "BufferClosed",
    "BufferFlushFailed",
    "BufferFull",
    "IncrementBufferError",
    "RedisUnavailable",
    # -- errors of quotas
    "InvalidCost",
    "InvalidBucketWidth",
    "InvalidQuotaArgument",
    "InvalidQuotaDefinition",
    "InvalidQuotaLimit",
    "InvalidSubject",
    "OverlappingQuotaLimits",
    "QuotaDefinitionConflict",
    "UnknownQuota",
    # -- errors of sharding
    "ShardingError",
]

# The names loaded on first use (they need an optional dependency, or start threads and
# servers), and the module each comes from.
_LAZY = {
    "AsyncBatchingCounters": "pgcounters.batching",
    "AsyncWorker": "pgcounters.async_worker",
    "BatchingCounters": "pgcounters.batching",
    "EmbeddedPostgres": "pgcounters.embedded",
    "RedisBuffer": "pgcounters.redis_buffer",
    "Worker": "pgcounters.worker",
    "WorkerSettings": "pgcounters.worker",
    "connect": "pgcounters.config",
    "dsn_from_env": "pgcounters.config",
    "install_proxy": "pgcounters.sharding",
}


def __getattr__(name: str) -> object:
    if name == "__version__":
        from importlib.metadata import version

        value: object = version("pgcounters")
    elif name in ("status", "notifications"):
        value = importlib.import_module(f"pgcounters.{name}")
    elif name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    else:
        raise AttributeError(f"module 'pgcounters' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
