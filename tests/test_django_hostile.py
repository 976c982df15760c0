"""Django models, fields and columns whose names need quoting, counted by declared counters.

Models are defined in an isolated app registry, so they never join the blog
example's declared counters; their tables are created and dropped here.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection, models
from django.db.models import Count, Q, Sum
from django.test.utils import isolate_apps

import truth
from pgcounters import Counters, triggers
from pgcounters.contrib.django import CountField, SumField
from pgcounters.contrib.django.db import psycopg_connection
from pgcounters.errors import InvalidCounterDefinition, PgCountersError
from pgcounters.repair import verify

pytestmark = pytest.mark.django_db(transaction=True)

HOSTILE_KIND = 'it\'s; \\ "ok" -- é'


@isolate_apps("blog")
def test_names_that_need_quoting_are_counted() -> None:
    class Parent(models.Model):
        hits = CountField("children", filter=Q(kind=HOSTILE_KIND), db_column="Hïts n; --")
        points = SumField("children", "score", db_column="sum\\mé")
        objects: models.Manager[Parent] = models.Manager()

        class Meta:
            app_label = "blog"
            # no double quote: Django's quote_name does not double it (PostgreSQL would)
            db_table = "Pärent table; DROP TABLE blog_article; --"

    class Child(models.Model):
        parent = models.ForeignKey(
            Parent, related_name="children", on_delete=models.CASCADE, db_column="pärent id"
        )
        kind = models.TextField(db_column="ki;nd")
        score = models.IntegerField(db_column="Score", null=True)
        objects: models.Manager[Child] = models.Manager()

        class Meta:
            app_label = "blog"
            # 63 bytes, PostgreSQL's limit (ASCII: Django sizes the names of the indexes it
            # derives in characters, so a multi-byte name this long makes it collide)
            db_table = "c" * 63

    specs = [Parent._meta.get_field(f).spec() for f in ("hits", "points")]  # type: ignore[union-attr]

    def per_parent(aggregate: Any) -> truth.Reader:
        def read(conn: Any) -> truth.Values:
            rows = Parent.objects.annotate(truth=aggregate).values_list("pk", "truth")
            return {(pk,): int(value or 0) for pk, value in rows}

        return read

    def stored(field: str) -> truth.Reader:
        def read(conn: Any) -> truth.Values:
            return {(pk,): int(v) for pk, v in Parent.objects.values_list("pk", field)}

        return read

    # the truth by the ORM's own aggregates
    hand = [
        truth.from_rows(
            specs[0].name,
            per_parent(Count("children", filter=Q(children__kind=HOSTILE_KIND))),
            stored("hits"),
        ),
        truth.from_rows(specs[1].name, per_parent(Sum("children__score")), stored("points")),
    ]
    with connection.schema_editor() as editor:
        editor.create_model(Parent)
        editor.create_model(Child)
    try:
        with psycopg_connection() as conn:
            triggers.install(conn, specs)
        parents = [Parent.objects.create() for _ in range(3)]
        Child.objects.bulk_create(
            [
                Child(parent=parents[i % 3], kind=HOSTILE_KIND if i % 2 else "other", score=i)
                for i in range(20)
            ]
        )
        Child.objects.filter(score__lt=5).update(kind=HOSTILE_KIND)
        Child.objects.filter(score__gt=15).delete()
        with psycopg_connection() as conn:
            Counters(conn).drain()
            truth.assert_exact(conn, hand)
            truth.assert_stored(conn, hand)
            for spec in specs:
                assert verify(conn, spec).mismatches == [], spec.name
        expected = Child.objects.filter(parent=parents[0], kind=HOSTILE_KIND).count()
        assert expected > 0
        assert Parent.objects.get(pk=parents[0].pk).hits == expected
        total = sum(Child.objects.filter(parent=parents[1]).values_list("score", flat=True))
        assert Parent.objects.get(pk=parents[1].pk).points == total
    finally:
        with psycopg_connection() as conn:
            for spec in specs:
                triggers.uninstall(conn, spec.name, drop_values=True)
        with connection.schema_editor() as editor:
            editor.delete_model(Child)
            editor.delete_model(Parent)


@isolate_apps("blog")
def test_names_too_long_or_not_a_counter_name_are_clear_errors() -> None:
    class Långbord(models.Model):  # a model name that is not a valid counter name
        n = CountField("items")

        class Meta:
            app_label = "blog"
            db_table = "é" * 32  # 64 bytes: over PostgreSQL's limit

    class Item(models.Model):
        owner = models.ForeignKey(Långbord, related_name="items", on_delete=models.CASCADE)

        class Meta:
            app_label = "blog"

    field: Any = Långbord._meta.get_field("n")
    with pytest.raises(PgCountersError) as caught:
        field.spec()
    assert str(caught.value)


@isolate_apps("blog")
def test_a_sum_of_a_decimal_or_float_field_is_a_clear_error() -> None:
    class Order(models.Model):
        total = SumField("lines", "price")
        weight = SumField("lines", "grams")
        quantity = SumField("lines", "quantity")
        exact = SumField("lines", "price", decimal_places=2, max_digits=12)
        finer = SumField("lines", "price", decimal_places=3, max_digits=12)

        class Meta:
            app_label = "blog"

    class Line(models.Model):
        order = models.ForeignKey(Order, related_name="lines", on_delete=models.CASCADE)
        price = models.DecimalField(max_digits=10, decimal_places=2)
        grams = models.FloatField()
        quantity = models.PositiveIntegerField()

        class Meta:
            app_label = "blog"

    for name, message in (
        (
            "total",
            r"is a DecimalField with 2 decimal places: sum it exactly with "
            r"SumField\(\.\.\., decimal_places=2",
        ),
        ("weight", "is a FloatField: floating-point values are not exact"),
        ("finer", "has 2 decimal places, its sum 3"),
    ):
        field: Any = Order._meta.get_field(name)
        with pytest.raises(InvalidCounterDefinition, match=message):
            field.spec()
    exact: Any = Order._meta.get_field("exact")
    assert exact.spec().scale == 2
    assert exact.get_internal_type() == "DecimalField"
    quantity: Any = Order._meta.get_field("quantity")
    assert quantity.spec().sum == "quantity"
