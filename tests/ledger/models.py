"""Invoices summing the decimal amounts of their lines, exactly, in every mode."""

from __future__ import annotations

import datetime as dt

from django.db import models

from pgcounters.contrib.django import CountField, SumField, register_counter


class Invoice(models.Model):
    label = models.CharField(max_length=40, default="")
    total = SumField("lines", "amount", decimal_places=2, max_digits=14)
    total_unlogged = SumField("lines", "amount", decimal_places=2, max_digits=14, mode="unlogged")
    total_direct = SumField("lines", "amount", decimal_places=2, max_digits=14, mode="direct")
    lines_count = SumField("lines", "quantity")
    # lines written by a logical replication apply (replica mode) are counted too
    replicated_lines = CountField("lines", replica_writes="count")


class Line(models.Model):
    invoice = models.ForeignKey(Invoice, related_name="lines", on_delete=models.CASCADE)
    amount = models.DecimalField(max_digits=10, decimal_places=2, null=True)
    quantity = models.IntegerField(default=1)
    day = models.DateField(default=dt.date(2026, 11, 21))


# the amount of every line per day: a named counter, read as a Decimal
amount_per_day = register_counter("ledger.amount_per_day", Line, keys=("day",), sum="amount")
