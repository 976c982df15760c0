"""Django delivery of counters: the same triggers as ``pgcounters install``, names that need
quoting, and migrations that depend on the pgcounters schema by themselves."""

from __future__ import annotations

import re
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.db.models import Count, Q, Sum
from psycopg import sql

from django_support import assert_exact
from oddnames.models import Item, Owner
from pgcounters import Counters
from pgcounters.compiler import compile_spec
from pgcounters.connection import Conn
from pgcounters.contrib.django import declared_counters
from pgcounters.contrib.django.db import psycopg_connection
from pgcounters.contrib.django.migration_deps import adds_counter_trigger
from pgcounters.repair import verify
from pgcounters.specs import ColumnTarget
from pgcounters.triggers import drift, installed, record, uninstall

pytestmark = pytest.mark.django_db(transaction=True)


def _function_source(conn: Conn, trigger: str) -> str:
    row = conn.execute(
        "SELECT p.prosrc FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid WHERE t.tgname = %s",
        [trigger],
    ).fetchone()
    assert row is not None, trigger
    return str(row[0])


def test_django_delivers_the_triggers_the_compiler_emits() -> None:
    """Every declared counter: four triggers (seven with a counter column's three guards,
    five more per table of a path) with the compiler's own bodies, all current."""
    specs = [spec for _, spec in declared_counters()]
    assert {s.name for s in specs} >= {"blog.article.public_comments", "oddnames.owner.items_on"}
    with psycopg_connection() as conn:
        states = {d.name: d.state for d in drift(conn, specs)}
        assert states == {s.name: "installed" for s in specs}
        by_spec: dict[str, set[str]] = {}
        for t in installed(conn):
            by_spec.setdefault(t.spec_name, set()).add(t.trigger)
        for spec in specs:
            compiled = compile_spec(spec).triggers
            guards = 3 if isinstance(spec.target, ColumnTarget) else 0
            path = 5 * len(spec.via)
            assert len(by_spec[spec.name]) == len(compiled) == 4 + guards + path
            for trigger in compiled:
                [name] = [n for n in by_spec[spec.name] if trigger.name in n]
                assert trigger.body.strip() in _function_source(conn, name)


def test_plain_install_over_django_delivery_is_refused() -> None:
    """``pgcounters install`` of a counter Django delivered would count twice: refused, and
    nothing changes (the other counters of the same call are not installed either)."""
    from pgcounters.errors import CounterDeliveredElsewhere
    from pgcounters.triggers import install

    specs = [spec for _, spec in declared_counters()]
    with psycopg_connection() as conn:
        before = sorted((t.trigger, t.fingerprint) for t in installed(conn))
        with pytest.raises(CounterDeliveredElsewhere, match="count every row twice"):
            install(conn, specs)
        assert sorted((t.trigger, t.fingerprint) for t in installed(conn)) == before
        assert all(d.ok for d in drift(conn, specs))


def _truth() -> dict[int, tuple[int, int]]:
    rows = Owner.objects.annotate(
        on=Count("items", filter=Q(items__state="on")), size=Sum("items__size", default=0)
    ).values_list("id", "on", "size")
    return {pk: (on, size) for pk, on, size in rows}


def _stored() -> dict[int, tuple[int, int]]:
    return {
        pk: (on, size) for pk, on, size in Owner.objects.values_list("id", "items_on", "total_size")
    }


def test_names_that_need_quoting_are_counted() -> None:
    """Tables and columns with capitals, spaces, semicolons, dots, backslashes, SQL keywords and
    non-ASCII letters (Django itself cannot name a table with a double quote in it)."""
    owners = Owner.objects.bulk_create([Owner(name=f"o'{i}\"; --") for i in range(3)])
    item = Item.objects.create(owner=owners[0], state="on", size=5)
    item.state = "off"
    item.save()  # a flip
    item.state, item.owner = "on", owners[1]
    item.save()  # a flip and a move
    Item.objects.bulk_create(
        [Item(owner=owners[i % 3], state="on" if i % 2 else "off", size=i) for i in range(20)]
    )
    Item.objects.filter(size__lt=4).update(state="off")
    Item.objects.filter(size__gt=15).delete()
    Item.objects.filter(size=7).update(owner=None)
    with psycopg_connection() as conn:
        table = sql.Identifier(Item._meta.db_table)
        cols = sql.SQL(", ").join(sql.Identifier(c) for c in ("Owner-Id", "Select", "Größe"))
        conn.execute(
            sql.SQL("INSERT INTO {} ({}) VALUES (%s, 'on', 100)").format(table, cols),
            [owners[2].pk],
        )
        with (
            conn.cursor() as cur,
            cur.copy(sql.SQL("COPY {} ({}) FROM STDIN").format(table, cols)) as copy,
        ):
            for i in range(4):
                copy.write_row((owners[0].pk, "on", i))
        Counters(conn).drain()
        assert_exact(stored=True)  # every declared counter against the ORM's aggregates
        for _, spec in declared_counters():
            assert verify(conn, spec).mismatches == [], spec.name
        by_state = dict(
            Item.objects.values("state").annotate(n=Count("id")).values_list("state", "n")
        )
        counters = Counters(conn)
        assert {s: counters.get("oddnames.items.by_state", s) for s in by_state} == by_state
    assert _stored() == _truth()
    assert Owner.objects.order_by("-items_on").first() is not None


def test_makemigrations_has_nothing_to_add_for_any_app() -> None:
    out = StringIO()
    call_command("makemigrations", "--check", "--dry-run", stdout=out)
    assert "No changes detected" in out.getvalue()


def test_new_counter_migrations_depend_on_the_schema(settings: Any) -> None:
    """Written from scratch, a migration adding counter triggers depends on pgcounters."""
    settings.MIGRATION_MODULES = {"oddnames": "oddnames.scratch_migrations"}
    out = StringIO()
    call_command("makemigrations", "oddnames", "--dry-run", "-v", "3", stdout=out)
    text = out.getvalue()
    assert "AddTrigger" in text
    deps = re.search(r"dependencies = \[(.*?)\]", text, re.S)
    assert deps is not None
    # the app's latest migration (the schema, or the admin's unmanaged models after it)
    assert re.search(r"\(['\"]pgcounters['\"], ['\"]\d{4}_\w+['\"]\)", deps.group(1))


def test_only_counter_triggers_need_the_schema() -> None:
    import pgtrigger
    import pgtrigger.migrations
    from django.db import migrations

    from pgcounters.contrib.django.pgtrigger_delivery import triggers_for

    spec = next(spec for _, spec in declared_counters())
    ours = triggers_for(spec)[0]
    other = pgtrigger.Protect(name="protect_deletes", operation=pgtrigger.Delete)
    assert adds_counter_trigger(pgtrigger.migrations.AddTrigger("item", ours))
    assert adds_counter_trigger(
        pgtrigger.migrations.AddTrigger("item", ours.compile(Item))  # type: ignore[arg-type]
    )
    assert not adds_counter_trigger(pgtrigger.migrations.AddTrigger("item", other))
    assert not adds_counter_trigger(migrations.RunSQL("SELECT 1"))


def test_uninstalled_counter_is_reported_missing() -> None:
    """Drift is read from the catalog whatever delivered the triggers."""
    specs = [spec for _, spec in declared_counters()]
    try:
        with psycopg_connection() as conn:
            assert uninstall(conn, "oddnames.owner.items_on")
            states = {d.name: d.state for d in drift(conn, specs)}
            assert states["oddnames.owner.items_on"] == "missing"
            assert states["oddnames.owner.total_size"] == "installed"
    finally:  # the database outlives the test: django-pgtrigger puts the triggers back
        call_command("pgtrigger", "install")
        with psycopg_connection() as conn:
            for spec in specs:
                record(conn, spec)
    with psycopg_connection() as conn:
        assert all(d.ok for d in drift(conn))
