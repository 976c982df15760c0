"""Models whose table and column names need quoting: counters must still work."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from pgcounters.contrib.django import CountField, SumField, register_counter


class Owner(models.Model):
    name = models.CharField(max_length=100, db_column="Name; DROP TABLE x --")
    items_on = CountField("items", filter=Q(state="on"), db_column="Items On")
    total_size = SumField("items", "size", db_column="Größe total")

    class Meta:
        db_table = "Odd Owner; Table"


class Item(models.Model):
    owner = models.ForeignKey(
        Owner, related_name="items", on_delete=models.CASCADE, null=True, db_column="Owner-Id"
    )
    state = models.CharField(max_length=10, default="off", db_column="Select")
    size = models.IntegerField(default=0, db_column="Größe")

    class Meta:
        db_table = "odd.item\\table"


# a named counter keyed by a column whose name needs quoting
register_counter("oddnames.items.by_state", Item, keys=("state",))
