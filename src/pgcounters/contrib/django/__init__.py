"""pgcounters for Django: counters declared on models, kept by statement-level triggers.

Add ``"pgtrigger"`` and ``"pgcounters.contrib.django"`` to ``INSTALLED_APPS``.
"""

from pgcounters.contrib.django.declarations import (
    CounterColumn,
    CountField,
    DecimalSumField,
    NamedCounter,
    SumField,
    declared_counters,
    register_counter,
)
from pgcounters.contrib.django.expressions import Exact

__all__ = [
    "CountField",
    "CounterColumn",
    "DecimalSumField",
    "Exact",
    "NamedCounter",
    "SumField",
    "declared_counters",
    "register_counter",
]
