"""pgcounters for Django: counters declared on models, kept by statement-level triggers.

Add ``"pgtrigger"`` and ``"pgcounters.contrib.django"`` to ``INSTALLED_APPS``.
Everything a Django project uses is imported from here; the other modules of
``pgcounters.contrib.django`` are internal (the dotted paths Django settings name,
such as ``pgcounters.contrib.django.ratelimit.RateLimitMiddleware``, are kept).
"""

from pgcounters.contrib.django import counters
from pgcounters.contrib.django.db import psycopg_connection
from pgcounters.contrib.django.declarations import (
    CounterColumn,
    CountField,
    DecimalSumField,
    NamedCounter,
    SumField,
    declared_counters,
    register_counter,
)
from pgcounters.contrib.django.errors import SettingsError
from pgcounters.contrib.django.events import count_event, event_value
from pgcounters.contrib.django.expressions import Exact
from pgcounters.contrib.django.orm_truth import verify_orm
from pgcounters.contrib.django.pagination import EstimatedCountPaginator, estimated_count
from pgcounters.contrib.django.ratelimit import RateLimitMiddleware, ratelimit, ratelimit_headers
from pgcounters.contrib.django.signals import counters_changed

# grouped by use, as docs/django.md presents them
__all__ = [  # noqa: RUF022
    # -- counters declared on models
    "CountField",
    "CounterColumn",
    "DecimalSumField",
    "NamedCounter",
    "SumField",
    "declared_counters",
    "register_counter",
    # -- named counters read and written on Django's connection: the `counters` namespace
    #    (get, get_many, top, incr)
    "counters",
    # -- exact values in a queryset
    "Exact",
    # -- the counters checked against the ORM's own count
    "verify_orm",
    # -- event counters (page views, downloads) written through a buffer
    "count_event",
    "event_value",
    # -- estimated counts for the admin and other paginators
    "EstimatedCountPaginator",
    "estimated_count",
    # -- rate limits on views
    "RateLimitMiddleware",
    "ratelimit",
    "ratelimit_headers",
    # -- the psycopg connection of a Django database, for the pgcounters API
    "psycopg_connection",
    # -- the signal a worker run from Django sends after its batches change counters
    "counters_changed",
    # -- errors (the others are pgcounters' own: `from pgcounters import ...`)
    "SettingsError",
]
