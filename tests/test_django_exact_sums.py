"""Exact sums of a DecimalField on Django models (the ledger test app): a SumField with
decimal_places is a DecimalField column kept exactly in queued, unlogged and direct mode,
whatever writes the lines (the ORM, bulk operations, raw SQL), equal to the ORM's own Sum."""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Iterator
from decimal import Decimal

import psycopg
import pytest
from asgiref.sync import async_to_sync
from django.core.management import call_command
from django.db import connection
from django.db.models import Sum
from django.test import Client

import truth
from ledger.models import Invoice, Line, amount_per_day
from pgcounters import Counters, triggers
from pgcounters.connection import Conn
from pgcounters.contrib.django import CountField, DecimalSumField, Exact, SumField
from pgcounters.contrib.django.db import dsn
from pgcounters.contrib.django.declarations import _summed_column
from pgcounters.errors import InvalidCounterDefinition
from pgcounters.repair import recount, verify
from support import tamper

pytestmark = pytest.mark.django_db(transaction=True)

COLUMNS = ("total", "total_unlogged", "total_direct")
NAMES = [f"ledger.invoice.{c}" for c in COLUMNS]
PER_DAY = "ledger.amount_per_day"


@pytest.fixture
def worker() -> Iterator[Conn]:
    with psycopg.connect(dsn(), autocommit=True) as conn:
        yield conn


def _truth_of(column: str) -> truth.Truth:
    def count(_: Conn) -> truth.Values:
        rows = Invoice.objects.annotate(s=Sum("lines__amount", default=Decimal(0)))
        return {(i.pk,): i.s for i in rows}

    def stored(_: Conn) -> truth.Values:
        return {(pk,): v for pk, v in Invoice.objects.values_list("pk", column)}

    return truth.from_rows(f"ledger.invoice.{column}", count, stored)


def _per_day(_: Conn) -> truth.Values:
    rows = Line.objects.order_by().values("day").annotate(s=Sum("amount"))
    return {(r["day"],): r["s"] or 0 for r in rows}


TRUTHS = [*(_truth_of(c) for c in COLUMNS), truth.from_rows(PER_DAY, _per_day)]


def _exact(invoice: Invoice) -> tuple[Decimal, ...]:
    row = Invoice.objects.annotate(**{f"x_{c}": Exact(c) for c in COLUMNS}).get(pk=invoice.pk)
    return tuple(getattr(row, f"x_{c}") for c in COLUMNS)


def test_the_field_is_a_decimal_column_and_deconstructs_as_one() -> None:
    field = Invoice._meta.get_field("total")
    assert isinstance(field, DecimalSumField)
    _name, path, _, kwargs = field.deconstruct()
    assert path == "django.db.models.DecimalField"
    assert (kwargs["max_digits"], kwargs["decimal_places"]) == (14, 2)
    assert isinstance(Invoice._meta.get_field("lines_count"), SumField)
    assert field.spec().scale == 2
    assert amount_per_day.spec().scale == 2


def test_ten_lines_of_0_4_sum_to_4(worker: Conn) -> None:
    invoice = Invoice.objects.create(label="a")
    for _ in range(10):
        Line.objects.create(invoice=invoice, amount=Decimal("0.4"))
    assert _exact(invoice) == (Decimal("4.00"),) * 3
    assert all(isinstance(v, Decimal) and str(v) == "4.00" for v in _exact(invoice))
    invoice.refresh_from_db()
    assert invoice.total_direct == Decimal("4.00")  # direct: in the writing statement
    assert amount_per_day.get_decimal(dt.date(2026, 11, 21)) == Decimal("4.00")
    assert async_to_sync(amount_per_day.aget_decimal)(dt.date(2026, 11, 21)) == Decimal("4.00")
    Counters(worker).drain()
    invoice.refresh_from_db()
    assert (invoice.total, invoice.total_unlogged) == (Decimal("4.00"), Decimal("4.00"))
    truth.assert_exact(worker, TRUTHS)


def test_orm_bulk_and_raw_sql_writes_equal_the_orms_sum(worker: Conn) -> None:
    rnd = random.Random("ledger")

    def amount() -> Decimal:
        return Decimal(rnd.randint(-50_000, 50_000)).scaleb(-2)

    invoices = [Invoice.objects.create(label=str(i)) for i in range(4)]
    for step in range(40):
        choice = rnd.random()
        if choice < 0.3:
            Line.objects.bulk_create(
                [
                    Line(
                        invoice=rnd.choice(invoices),
                        amount=amount(),
                        day=dt.date(2026, 11, 20 + step % 3),
                    )
                    for _ in range(rnd.randint(1, 15))
                ]
            )
        elif choice < 0.45:
            line = Line.objects.create(invoice=rnd.choice(invoices), amount=amount())
            line.amount = amount()
            line.save()
        elif choice < 0.6:
            Line.objects.filter(pk__gt=rnd.randint(0, 200)).update(amount=amount())
        elif choice < 0.7:
            lines = list(Line.objects.order_by("?")[:5])
            for line in lines:
                line.amount = None if rnd.random() < 0.3 else amount()
                line.invoice = rnd.choice(invoices)
            Line.objects.bulk_update(lines, ["amount", "invoice"])
        elif choice < 0.85:
            with connection.cursor() as cur:
                cur.execute(
                    "UPDATE ledger_line SET amount = amount + %s WHERE id %% 3 = %s",
                    [amount(), step % 3],
                )
        else:
            Line.objects.filter(
                pk__in=list(Line.objects.order_by("?").values_list("pk", flat=True)[:4])
            ).delete()
        if step % 15 == 14:
            Counters(worker).drain()
    assert Line.objects.exists()
    truth.assert_exact(worker, TRUTHS)
    truth.assert_drained(worker, TRUTHS)
    for name in [*NAMES, PER_DAY]:
        assert verify(worker, name).mismatches == []


def test_recount_repairs_a_broken_decimal_column(worker: Conn) -> None:
    invoice = Invoice.objects.create()
    Line.objects.bulk_create([Line(invoice=invoice, amount=Decimal("0.35")) for _ in range(3)])
    Counters(worker).drain()
    tamper(worker, "UPDATE ledger_invoice SET total = 99.99")
    (wrong,) = verify(worker, "ledger.invoice.total").mismatches
    assert (wrong.expected, wrong.actual) == (Decimal("1.05"), Decimal("99.99"))
    assert recount(worker, "ledger.invoice.total").keys_fixed == 1
    invoice.refresh_from_db()
    assert invoice.total == Decimal("1.05")
    truth.assert_stored(worker, TRUTHS)


def test_the_admin_shows_the_decimal(admin_client: Client, worker: Conn) -> None:
    invoice = Invoice.objects.create(label="shown")
    Line.objects.bulk_create([Line(invoice=invoice, amount=Decimal("0.4")) for _ in range(10)])
    Counters(worker).drain()
    html = admin_client.get("/admin/ledger/invoice/").content.decode()
    assert "shown" in html
    assert "4.00" in html


def test_the_admin_values_page_shows_a_named_sum_of_decimals_as_decimals(
    admin_client: Client, worker: Conn
) -> None:
    invoice = Invoice.objects.create(label="per day")
    day = dt.date(2026, 11, 23)
    Line.objects.bulk_create(
        [Line(invoice=invoice, amount=Decimal("0.4"), quantity=1, day=day) for _ in range(10)]
    )
    Counters(worker).drain()
    Line.objects.create(invoice=invoice, amount=Decimal("0.25"), quantity=1, day=day)  # pending
    target = worker.execute(
        "SELECT id FROM pgcounters.targets WHERE name = %s", (amount_per_day.name,)
    ).fetchone()
    assert target is not None
    response = admin_client.get(f"/admin/pgcounters/countervalue/?counter__id__exact={target[0]}")
    rows = list(response.context["cl"].result_list)
    assert [",".join(r.key) for r in rows] == ["2026-11-23"]
    admin = response.context["cl"].model_admin
    # stored 4.00, pending 0.25, exact 4.25: decimals, never the units (400, 25, 425)
    assert admin.stored(rows[0]) == Decimal("4.00")
    assert admin.pending(rows[0]) == Decimal("0.25")
    assert admin.exact(rows[0]) == Decimal("4.25")
    html = response.content.decode()
    assert "4.25" in html
    assert ">425<" not in html


def test_sums_of_decimals_need_their_decimal_places() -> None:
    with pytest.raises(InvalidCounterDefinition, match="decimal_places=2, max_digits=N"):
        _summed_column(Line, "amount")
    with pytest.raises(InvalidCounterDefinition, match="has 2 decimal places, its sum 3"):
        _summed_column(Line, "amount", 3)
    with pytest.raises(InvalidCounterDefinition, match="integer field: its sum is an integer"):
        _summed_column(Line, "quantity", 2)
    assert _summed_column(Line, "amount", 2) == ("amount", 2)


def test_replica_writes_count_is_a_field_option_applied_by_migrate(worker: Conn) -> None:
    counting = "ledger.invoice.replicated_lines"
    invoice = Invoice.objects.create()
    with psycopg.connect(dsn(), autocommit=True) as replica:
        replica.execute("SET session_replication_role = replica")
        replica.execute(
            "INSERT INTO ledger_line (invoice_id, amount, quantity, day)"
            " VALUES (%s, 1.5, 1, '2026-11-21'), (%s, 2.5, 1, '2026-11-21')",
            (invoice.pk, invoice.pk),
        )
    states = {d.name: d.state for d in triggers.drift(worker)}
    assert states[counting] == "installed"
    assert states["ledger.invoice.total"] == "stale"  # the default: flagged, not counted
    assert Invoice.objects.annotate(n=Exact("replicated_lines")).get(pk=invoice.pk).n == 2
    # a choice changed by hand is put back by migrate
    triggers.set_replica_writes(worker, counting, "flag")
    call_command("migrate", verbosity=0)
    row = worker.execute(
        "SELECT replica_writes FROM pgcounters.specs WHERE name = %s", (counting,)
    ).fetchone()
    assert row == ("count",)
    for name, state in states.items():  # the counters that missed the rows catch up
        if state == "stale":
            recount(worker, name)
    assert {d.state for d in triggers.drift(worker)} == {"installed"}
    truth.assert_exact(worker, TRUTHS)


def test_replica_writes_takes_flag_or_count() -> None:
    with pytest.raises(InvalidCounterDefinition, match="'flag' or 'count'"):
        CountField("lines", replica_writes="always")  # type: ignore[arg-type]
