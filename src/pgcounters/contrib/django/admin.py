"""Admin pages: declared counters, the values of named counters, and the queue status.

All read-only. The values page shows, per counter and key, the stored value,
the pending deltas (both queues) and the exact value, computed in one
statement (one snapshot) like :meth:`pgcounters.Counters.get`. The queue
status page renders :func:`pgcounters.status.get_status` (what ``pgcounters
status`` prints) and is listed on the admin index as "Queue status".
"""

from __future__ import annotations

from decimal import Decimal
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db import router
from django.db.models import (
    BigIntegerField,
    Count,
    F,
    Model,
    OuterRef,
    QuerySet,
    Subquery,
    Sum,
    TextField,
)
from django.db.models.expressions import RawSQL
from django.db.models.functions import Cast, Coalesce
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from pgcounters import status
from pgcounters.client import value_of
from pgcounters.contrib.django.db import psycopg_connection
from pgcounters.contrib.django.models import (
    Counter,
    CounterValue,
    PendingDelta,
    QueueStatus,
    UnloggedPendingDelta,
)
from pgcounters.errors import PgCountersError
from pgcounters.sqlfiles import named

if TYPE_CHECKING:
    _CounterAdmin = admin.ModelAdmin[Counter]
    _ValueAdmin = admin.ModelAdmin[CounterValue]
    _StatusAdmin = admin.ModelAdmin[QueueStatus]
else:
    _CounterAdmin = _ValueAdmin = _StatusAdmin = admin.ModelAdmin


class ReadOnly:
    """No adding, changing or deleting (each admin below also sets ``actions = None``)."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def _pending(model: type[PendingDelta] | type[UnloggedPendingDelta]) -> Coalesce:
    """The sum of the pending deltas of the outer row's counter and key, 0 when none."""
    deltas = (
        # the queues keep a key as its array's text (schema version 7)
        model.objects.filter(
            counter_id=OuterRef("counter_id"), key=Cast(OuterRef("key"), TextField())
        )
        .order_by()
        .values("counter_id")
        .annotate(total=Sum("delta"))
        .values("total")[:1]
    )
    return Coalesce(Cast(Subquery(deltas), BigIntegerField()), 0, output_field=BigIntegerField())


def _queued(model: type[PendingDelta] | type[UnloggedPendingDelta]) -> Coalesce:
    """How many deltas of the outer counter wait in one queue."""
    rows = (
        model.objects.filter(counter_id=OuterRef("id"))
        .order_by()
        .values("counter_id")
        .annotate(n=Count("*"))
        .values("n")[:1]
    )
    return Coalesce(Subquery(rows), 0, output_field=BigIntegerField())


def _annotation(obj: Model, name: str) -> int:
    """A value the admin's queryset annotated the row with."""
    return int(obj.__dict__[name])


@admin.register(Counter)
class CounterAdmin(ReadOnly, _CounterAdmin):
    """Every declared counter: where its values live, its key, its mode, its queue."""

    actions = None

    list_display = ("name", "kept_in", "key", "mode", "queued", "state", "values_link")
    list_display_links = None
    list_filter = ("mode",)
    search_fields = ("name",)
    ordering = ("name",)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Counter]:
        return (
            super()
            .get_queryset(request)
            .annotate(
                queued=_queued(PendingDelta) + _queued(UnloggedPendingDelta),
                backfilled=RawSQL(named("django.sql")["backfill_progress"], ()),
            )
        )

    @admin.display(description="state")
    def state(self, obj: Counter) -> str:
        done = getattr(obj, "backfilled", None)
        return "ready" if done is None else f"backfilling ({done} keys done)"

    @admin.display(description="values in")
    def kept_in(self, obj: Counter) -> str:
        return obj.where

    @admin.display(description="key")
    def key(self, obj: Counter) -> str:
        return ", ".join(obj.key_types) or "(global)"

    @admin.display(description="pending deltas", ordering="queued")
    def queued(self, obj: Counter) -> int:
        return _annotation(obj, "queued")

    @admin.display(description="values")
    def values_link(self, obj: Counter) -> SafeString | str:
        if not obj.is_named:
            return "-"
        url = reverse("admin:pgcounters_countervalue_changelist")
        return format_html('<a href="{}?counter__id__exact={}">values</a>', url, obj.id)


@admin.register(CounterValue)
class CounterValueAdmin(ReadOnly, _ValueAdmin):
    """Values of named counters: stored, pending and exact (stored + pending), per key."""

    actions = None

    list_display = ("counter", "key_text", "stored", "pending", "exact")
    list_display_links = None
    list_filter = (("counter", admin.RelatedOnlyFieldListFilter), "counter__mode")
    search_fields = ("counter__name", "key")
    ordering = ("counter__name", "key")
    list_select_related = ("counter",)

    def get_queryset(self, request: HttpRequest) -> QuerySet[CounterValue]:
        return (
            super()
            .get_queryset(request)
            .annotate(pending=_pending(PendingDelta) + _pending(UnloggedPendingDelta))
            .annotate(exact=F("value") + F("pending"))
        )

    @admin.display(description="key", ordering="key")
    def key_text(self, obj: CounterValue) -> str:
        return ", ".join(obj.key) or "(global)"

    @admin.display(description="value", ordering="value")
    def stored(self, obj: CounterValue) -> int | Decimal:
        return _shown(obj, obj.value)

    @admin.display(description="pending", ordering="pending")
    def pending(self, obj: CounterValue) -> int | Decimal:
        return _shown(obj, _annotation(obj, "pending"))

    @admin.display(description="exact", ordering="exact")
    def exact(self, obj: CounterValue) -> int | Decimal:
        return _shown(obj, _annotation(obj, "exact"))


def _shown(obj: CounterValue, units: int) -> int | Decimal:
    """A value as its counter reads it: a sum of decimals in units of 10^-scale as a Decimal."""
    scale = obj.counter.scale
    return units if scale is None else value_of(scale, units)


@admin.register(QueueStatus)
class QueueStatusAdmin(ReadOnly, _StatusAdmin):
    """``pgcounters status`` as a page: queues, apply rates, pending counters, tables, drift."""

    actions = None

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> TemplateResponse:
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        context: dict[str, Any] = {
            **self.admin_site.each_context(request),
            "title": "Queue status",
            "opts": self.model._meta,
            **(extra_context or {}),
        }
        alias = router.db_for_read(self.model)
        try:
            with psycopg_connection(alias) as conn:
                snapshot = status.get_status(conn)
        except PgCountersError as exc:
            context["error"] = str(exc)
        else:
            context.update(status_context(snapshot))
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/pgcounters/queue_status.html", context)


def status_context(s: status.Status) -> dict[str, Any]:
    """The snapshot, formatted for the template."""
    drain = {d.queue: d for d in s.drain}
    queues = []
    for q in s.queues:
        d = drain.get(q.queue)
        queues.append(
            {
                "name": q.queue,
                "depth": q.depth,
                "oldest": status.format_age(q.oldest_age),
                "rates": [
                    (f"{m} min", f"{d.rates.get(m, 0):,.0f}" if d else "-")
                    for m in status.WINDOWS_MINUTES
                ],
                "applied": d.deltas_total if d else None,
                "batches": d.batches_total if d else None,
            }
        )
    tables = [
        {
            "name": t.qualified,
            "role": t.role,
            "unlogged": t.unlogged,
            "size": status.format_size(t.total_bytes),
            "live": t.live_tuples,
            "dead": t.dead_tuples,
            "dead_ratio": f"{t.dead_ratio:.0%}",
            "last_vacuum": t.last_vacuum,
        }
        for t in s.tables
    ]
    triggers = next((x for x in s.sections if isinstance(x, status.TriggersSection)), None)
    others = [x for x in s.sections if not isinstance(x, status.TriggersSection)]
    return {
        "status": s,
        "lag": status.format_age(s.lag if s.depth else None),
        "queues": queues,
        "windows": [f"{m} min" for m in status.WINDOWS_MINUTES],
        "pending_counters": [
            {
                "name": c.counter,
                "pending": c.pending,
                "logged": c.pending_logged,
                "unlogged": c.pending_unlogged,
                "oldest": status.format_age(c.oldest_age),
            }
            for c in s.counters
            if c.pending
        ],
        "tables": tables,
        "triggers": triggers,
        "other_sections": [(x.name, "\n".join(x.lines())) for x in others],
    }
