"""Read-only models over pgcounters' own tables, for the admin pages.

The tables belong to the pgcounters schema (created by the app's schema
migrations, the same SQL as ``pgcounters install``): every model here is
unmanaged, so Django never creates, alters or drops them, and nothing in
pgcounters writes through these models.
"""

from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.db import models


class Counter(models.Model):
    """A declared counter (``pgcounters.targets``): named, or a column of a table."""

    id = models.IntegerField(primary_key=True)
    name = models.TextField(unique=True)
    key_types = ArrayField(models.TextField())
    mode = models.TextField()
    target_schema = models.TextField(null=True)
    target_table = models.TextField(null=True)
    target_column = models.TextField(null=True)
    target_key_column = models.TextField(null=True)
    created_at = models.DateTimeField()
    # a sum of decimals: its values are kept in units of 10^-scale (None: integers)
    scale = models.IntegerField(null=True)

    class Meta:
        managed = False
        db_table = '"pgcounters"."targets"'
        ordering = ("name",)
        default_permissions = ("view",)

    def __str__(self) -> str:
        return self.name

    @property
    def is_named(self) -> bool:
        """Values in ``pgcounters.counters`` (else in a column of ``target_table``)."""
        return self.target_table is None

    @property
    def where(self) -> str:
        if self.target_table is None:
            return "named"
        return f"{self.target_schema}.{self.target_table}.{self.target_column}"


class CounterValue(models.Model):
    """The stored value of a named counter under one key (``pgcounters.counters``).

    The table's primary key is ``(target_id, key)``. Django's admin needs one
    primary-key column, so ``key`` stands in for it: this model is read-only,
    and its rows are listed, never fetched, saved or deleted by primary key.
    """

    counter = models.ForeignKey(
        Counter,
        on_delete=models.DO_NOTHING,
        db_column="target_id",
        db_constraint=False,
        related_name="values",
    )
    key = ArrayField(models.TextField(), primary_key=True)
    value = models.BigIntegerField()

    class Meta:
        managed = False
        db_table = '"pgcounters"."counters"'
        default_permissions = ("view",)
        verbose_name = "counter value"

    def __str__(self) -> str:
        return f"{self.counter_id} {','.join(self.key) or '-'}"


class _Delta(models.Model):
    """A delta waiting in a queue."""

    id = models.BigIntegerField(primary_key=True)
    counter = models.ForeignKey(
        Counter,
        on_delete=models.DO_NOTHING,
        db_column="target_id",
        db_constraint=False,
        related_name="+",
    )
    key = models.TextField(help_text="the key as its array's text, such as {42}")
    delta = models.BigIntegerField()
    created_at = models.DateTimeField()

    class Meta:
        abstract = True


class PendingDelta(_Delta):
    """A delta in the durable queue (``pgcounters.queue``)."""

    class Meta:
        managed = False
        db_table = '"pgcounters"."queue"'
        default_permissions = ("view",)


class UnloggedPendingDelta(_Delta):
    """A delta in the unlogged queue (``pgcounters.queue_unlogged``)."""

    class Meta:
        managed = False
        db_table = '"pgcounters"."queue_unlogged"'
        default_permissions = ("view",)


class QueueStatus(PendingDelta):
    """The admin's queue status page (``pgcounters status``), under the queue's model."""

    class Meta:
        proxy = True
        verbose_name = "queue status"
        verbose_name_plural = "queue status"
        default_permissions = ("view",)
