from __future__ import annotations

from typing import TYPE_CHECKING

from django.contrib import admin

from ledger.models import Invoice

if TYPE_CHECKING:
    _InvoiceAdmin = admin.ModelAdmin[Invoice]
else:
    _InvoiceAdmin = admin.ModelAdmin


@admin.register(Invoice)
class InvoiceAdmin(_InvoiceAdmin):
    list_display = ("id", "label", "total")
