"""pgcounters: exact, fast, deadlock-free counters for PostgreSQL."""

from pgcounters.client import Counter, Counters, DrainResult, Mode
from pgcounters.errors import (
    BatchAborted,
    ConfigurationError,
    ConnectionFailed,
    CounterDefinitionConflict,
    CounterError,
    CounterOverflow,
    DrainError,
    EmbeddedPostgresError,
    InvalidCounterDefinition,
    InvalidCounterName,
    InvalidDelta,
    InvalidKey,
    PgCountersError,
    SchemaError,
    SchemaNotInstalled,
    SchemaVersionMismatch,
    UnknownCounter,
)
from pgcounters.schema import install, upgrade

__version__ = "0.1.0"

__all__ = [
    "BatchAborted",
    "ConfigurationError",
    "ConnectionFailed",
    "Counter",
    "CounterDefinitionConflict",
    "CounterError",
    "CounterOverflow",
    "Counters",
    "DrainError",
    "DrainResult",
    "EmbeddedPostgresError",
    "InvalidCounterDefinition",
    "InvalidCounterName",
    "InvalidDelta",
    "InvalidKey",
    "Mode",
    "PgCountersError",
    "SchemaError",
    "SchemaNotInstalled",
    "SchemaVersionMismatch",
    "UnknownCounter",
    "__version__",
    "install",
    "upgrade",
]

# quotas and rate limits
from pgcounters.errors import (
    InvalidCost,
    InvalidQuotaArgument,
    InvalidQuotaDefinition,
    InvalidQuotaLimit,
    InvalidSubject,
    OverlappingQuotaLimits,
    QuotaDefinitionConflict,
    QuotaError,
    UnknownQuota,
)
from pgcounters.quotas import CallResult, Quota, QuotaLimit, Quotas

__all__ += [
    "CallResult",
    "InvalidCost",
    "InvalidQuotaArgument",
    "InvalidQuotaDefinition",
    "InvalidQuotaLimit",
    "InvalidSubject",
    "OverlappingQuotaLimits",
    "Quota",
    "QuotaDefinitionConflict",
    "QuotaError",
    "QuotaLimit",
    "Quotas",
    "UnknownQuota",
]
