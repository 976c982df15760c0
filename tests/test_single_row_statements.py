"""A statement that writes one row queues that row's delta as it is, without grouping the
statement's rows by key: the same deltas as the grouped statement, for every kind of queued
counter (counts, sums, decimal sums, conditions, keys of several parts, NULL parts, both
queues), and no hash table built for it."""

from __future__ import annotations

import json
from collections import defaultdict
from decimal import Decimal
from typing import Any

import psycopg
import pytest

from pgcounters import Counters, triggers
from pgcounters.connection import Conn
from pgcounters.specs import CounterSpec, Fragment, NamedTarget

DDL = """
CREATE TABLE item (
    id bigserial PRIMARY KEY,
    shelf integer,
    tag text,
    qty integer NOT NULL DEFAULT 0,
    price numeric(10, 2) NOT NULL DEFAULT 0,
    hidden boolean NOT NULL DEFAULT false
);
"""

# (shelf, tag, qty, price, hidden): rows that count, rows that do not (hidden, a NULL key
# part), rows whose summed value is zero or negative
ROWS: list[tuple[int | None, str | None, int, Decimal, bool]] = [
    (1, "a", 3, Decimal("1.25"), False),
    (1, "a", 0, Decimal("0.00"), False),
    (2, "b,{c}", -4, Decimal("-7.10"), False),
    (2, None, 5, Decimal("2.00"), False),
    (None, "a", 6, Decimal("0.01"), False),
    (3, "c", 7, Decimal("9.99"), True),
    (1, "a", 2, Decimal("0.75"), False),
]


def specs() -> list[CounterSpec]:
    visible = Fragment("NOT hidden")
    return [
        CounterSpec(
            name="items.by_shelf", source="item", keys=("shelf",),
            target=NamedTarget(("bigint",)), where=visible,
        ),
        CounterSpec(
            name="items.qty_by_shelf_tag", source="item", keys=("shelf", "tag"),
            target=NamedTarget(("bigint", "text")), sum="qty",
        ),
        CounterSpec(
            name="items.price", source="item", target=NamedTarget(), sum="price", scale=2,
            where=visible,
        ),
        CounterSpec(
            name="items.by_tag_unlogged", source="item", keys=("tag",),
            target=NamedTarget(("text",)), mode="unlogged",
        ),
    ]  # fmt: skip


def _contributions(row: tuple[Any, ...]) -> list[tuple[str, tuple[Any, ...], int]]:
    """What one row adds to each counter, in the units the queues count in."""
    shelf, tag, qty, price, hidden = row
    out: list[tuple[str, tuple[Any, ...], int]] = []
    if not hidden and shelf is not None:
        out.append(("items.by_shelf", (str(shelf),), 1))
    if shelf is not None and tag is not None and qty != 0:
        out.append(("items.qty_by_shelf_tag", (str(shelf), tag), qty))
    if not hidden and price != 0:
        out.append(("items.price", (), int(price * 100)))
    if tag is not None:
        out.append(("items.by_tag_unlogged", (tag,), 1))
    return out


def _take_queued(conn: Conn) -> list[tuple[str, tuple[Any, ...], int]]:
    """The deltas both queues hold, one entry a queue row, and empty them."""
    rows = conn.execute(
        """
        WITH q AS (DELETE FROM pgcounters.queue RETURNING target_id, key, delta),
             u AS (DELETE FROM pgcounters.queue_unlogged RETURNING target_id, key, delta)
        SELECT t.name, q.key::text[], q.delta
          FROM (SELECT * FROM q UNION ALL SELECT * FROM u) AS q
          JOIN pgcounters.targets AS t ON t.id = q.target_id
        """
    ).fetchall()
    return sorted((name, tuple(key), delta) for name, key, delta in rows)


def _install(conn: Conn) -> None:
    conn.execute(DDL)
    triggers.install(conn, specs())
    _take_queued(conn)


def test_a_single_row_statement_queues_that_rows_deltas(conn: Conn) -> None:
    _install(conn)
    ids: list[int] = []
    for row in ROWS:
        found = conn.execute(
            "INSERT INTO item (shelf, tag, qty, price, hidden) VALUES (%s, %s, %s, %s, %s)"
            " RETURNING id",
            row,
        ).fetchone()
        assert found is not None
        ids.append(found[0])
        assert _take_queued(conn) == sorted(_contributions(row)), row
    for row_id, row in zip(ids, ROWS, strict=True):
        conn.execute("DELETE FROM item WHERE id = %s", (row_id,))
        expected = sorted((n, k, -d) for n, k, d in _contributions(row))
        assert _take_queued(conn) == expected, row


def _net(rows: list[tuple[tuple[Any, ...], int]]) -> list[tuple[str, tuple[Any, ...], int]]:
    """The deltas a statement of these rows (each with its sign) queues: one a counter
    and key, none of zero."""
    totals: dict[tuple[str, tuple[Any, ...]], int] = defaultdict(int)
    for row, sign in rows:
        for name, key, delta in _contributions(row):
            totals[(name, key)] += sign * delta
    return sorted((n, k, d) for (n, k), d in totals.items() if d != 0)


def _grouped(rows: list[tuple[Any, ...]], sign: int = 1) -> list[tuple[str, tuple[Any, ...], int]]:
    """What a statement of these rows queues: one delta a counter and key, none of zero."""
    return _net([(row, sign) for row in rows])


def test_a_statement_of_several_rows_queues_one_delta_a_key(conn: Conn) -> None:
    _install(conn)
    with conn.cursor() as cur:
        cur.executemany(  # one statement a row
            "INSERT INTO item (shelf, tag, qty, price, hidden) VALUES (%s, %s, %s, %s, %s)",
            ROWS,
        )
    assert _take_queued(conn) == sorted(d for row in ROWS for d in _contributions(row))
    conn.execute(
        "INSERT INTO item (shelf, tag, qty, price, hidden)"
        " SELECT shelf, tag, qty, price, hidden FROM item"
    )
    assert _take_queued(conn) == _grouped(ROWS)
    conn.execute("DELETE FROM item")
    assert _take_queued(conn) == _grouped(ROWS + ROWS, sign=-1)


# (before, after) of single-row UPDATEs: the key kept (a save() that changes nothing
# counted), the key moved, the condition flipped, a NULL key part filled, a summed value
# changed or kept
UPDATES: list[tuple[tuple[Any, ...], tuple[Any, ...]]] = [
    ((1, "a", 3, Decimal("1.25"), False), (1, "a", 3, Decimal("1.25"), False)),
    ((1, "a", 3, Decimal("1.25"), False), (2, "a", 3, Decimal("1.25"), False)),
    ((1, "a", 3, Decimal("1.25"), False), (1, "a", 3, Decimal("1.25"), True)),
    ((1, "a", 3, Decimal("1.25"), True), (1, "a", 3, Decimal("1.25"), False)),
    ((1, None, 3, Decimal("1.25"), False), (1, "b", 3, Decimal("1.25"), False)),
    ((None, "a", 3, Decimal("1.25"), False), (4, "a", 8, Decimal("1.30"), False)),
    ((1, "a", 3, Decimal("1.25"), False), (1, "a", 0, Decimal("0.00"), False)),
    ((1, "a", 3, Decimal("1.25"), False), (1, "a", -3, Decimal("-1.25"), False)),
    ((2, "b,{c}", 5, Decimal("0.10"), False), (3, "c", 5, Decimal("0.10"), True)),
]


def _change(
    before: tuple[Any, ...], after: tuple[Any, ...]
) -> list[tuple[str, tuple[Any, ...], int]]:
    """What an UPDATE of one row from ``before`` to ``after`` queues: the net change a key."""
    return _net([(before, -1), (after, 1)])


def test_a_single_row_update_queues_the_change_of_that_row(conn: Conn) -> None:
    _install(conn)
    update = "UPDATE item SET shelf = %s, tag = %s, qty = %s, price = %s, hidden = %s WHERE id = %s"
    for before, after in UPDATES:
        found = conn.execute(
            "INSERT INTO item (shelf, tag, qty, price, hidden) VALUES (%s, %s, %s, %s, %s)"
            " RETURNING id",
            before,
        ).fetchone()
        assert found is not None
        _take_queued(conn)
        conn.execute(update, (*after, found[0]))
        assert _take_queued(conn) == _change(before, after), (before, after)
    # an UPDATE of no row queues nothing
    conn.execute(update, (*UPDATES[1][1], -1))
    assert _take_queued(conn) == []


def test_an_update_of_several_rows_queues_one_delta_a_key(conn: Conn) -> None:
    _install(conn)
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO item (id, shelf, tag, qty, price, hidden) VALUES (%s, %s, %s, %s, %s, %s)",
            [(i, *before) for i, (before, _) in enumerate(UPDATES)],
        )
    _take_queued(conn)
    conn.execute(
        "UPDATE item SET shelf = u.shelf, tag = u.tag, qty = u.qty, price = u.price,"
        " hidden = u.hidden FROM jsonb_to_recordset(%s::jsonb)"
        " AS u (id bigint, shelf integer, tag text, qty integer, price numeric, hidden boolean)"
        " WHERE item.id = u.id",
        (
            json.dumps(
                [
                    dict(
                        zip(
                            ("id", "shelf", "tag", "qty", "price", "hidden"),
                            (i, *after),
                            strict=True,
                        )
                    )
                    for i, (_, after) in enumerate(UPDATES)
                ],
                default=str,
            ),
        ),
    )
    assert _take_queued(conn) == _net(
        [(after, 1) for _, after in UPDATES] + [(before, -1) for before, _ in UPDATES]
    )


def _nested_plans(conn: Conn, statement: str) -> str:
    """The plans of the statements the triggers ran for ``statement`` (auto_explain)."""
    notices: list[str] = []

    def keep(diag: psycopg.errors.Diagnostic) -> None:
        notices.append(diag.message_primary or "")

    conn.add_notice_handler(keep)
    try:
        conn.execute(statement)
    finally:
        conn.remove_notice_handler(keep)
    return "\n".join(notices)


def test_a_single_row_statement_groups_nothing(conn: Conn) -> None:
    _install(conn)
    try:
        conn.execute("LOAD 'auto_explain'")
    except psycopg.Error as exc:  # a server without the contrib module, or not a superuser
        pytest.skip(f"auto_explain cannot be loaded here: {exc}")
    for setting, value in (
        ("auto_explain.log_min_duration", "0"),
        ("auto_explain.log_nested_statements", "on"),
        ("auto_explain.log_level", "notice"),
    ):
        conn.execute("SELECT set_config(%s, %s, false)", (setting, value))
    one = _nested_plans(conn, "INSERT INTO item (shelf, tag, qty, price) VALUES (1, 'a', 2, 1.50)")
    assert 'Insert on "queue"' in one or "Insert on queue" in one
    assert "Insert on queue_unlogged" in one
    assert "Aggregate" not in one
    two = _nested_plans(
        conn, "INSERT INTO item (shelf, tag, qty, price) VALUES (1, 'a', 2, 1.50), (2, 'b', 1, 1)"
    )
    assert "HashAggregate" in two or "GroupAggregate" in two
    plans = _nested_plans(conn, "UPDATE item SET shelf = 3 WHERE shelf = 2")
    assert "Aggregate" not in plans
    assert _nested_plans(conn, "UPDATE item SET qty = qty + 1").count("HashAggregate") >= 3
    plans = _nested_plans(conn, "DELETE FROM item WHERE shelf = 3")
    assert "Aggregate" not in plans
    first = (1, "a", 2, Decimal("1.50"), False)
    second = (2, "b", 1, Decimal("1.00"), False)
    moved = (3, "b", 1, Decimal("1.00"), False)
    more = [(r[0], r[1], r[2] + 1, r[3], r[4]) for r in (first, first, moved)]
    assert _take_queued(conn) == sorted(
        _contributions(first)
        + _grouped([first, second])
        + _change(second, moved)
        + _net([(r, 1) for r in more] + [(r, -1) for r in (first, first, moved)])
        + _grouped([more[2]], sign=-1)
    )
    # a row that three of the counters do not count (hidden, nothing summed) and a
    # statement of no row take the single-row statement too, not the grouped one
    plans = _nested_plans(
        conn, "INSERT INTO item (shelf, tag, qty, price, hidden) VALUES (1, 'a', 0, 0, true)"
    )
    plans += _nested_plans(conn, "INSERT INTO item (shelf) SELECT 1 WHERE false")
    assert plans.count("Insert on queue") == 8  # one a counter and statement
    assert "Aggregate" not in plans
    assert _take_queued(conn) == [("items.by_tag_unlogged", ("a",), 1)]


def test_triggers_compiled_by_an_earlier_version_read_as_outdated(conn: Conn) -> None:
    _install(conn)
    assert {d.state for d in triggers.drift(conn)} == {"installed"}
    row = conn.execute(
        "SELECT pg_get_functiondef(t.tgfoid) FROM pg_trigger AS t"
        " WHERE t.tgrelid = 'item'::regclass AND t.tgname LIKE 'pgc_items_by_shelf_%_ins'"
    ).fetchone()
    assert row is not None
    # the same counter as the release before compiled it: every statement grouped
    earlier = row[0].replace('IF EXISTS (SELECT FROM "pgc_new" OFFSET 1) THEN', "IF true THEN")
    assert earlier != row[0]
    conn.execute(earlier)
    found = {d.name: d for d in triggers.drift(conn)}
    assert found["items.by_shelf"].state == "outdated"
    assert "earlier version" in found["items.by_shelf"].detail
    assert {d.state for n, d in found.items() if n != "items.by_shelf"} == {"installed"}
    triggers.install(conn, specs())
    assert {d.state for d in triggers.drift(conn)} == {"installed"}


def test_installing_again_counts_again_a_counter_whose_trigger_was_disabled(conn: Conn) -> None:
    from psycopg import sql

    from pgcounters import verify

    _install(conn)
    conn.execute("INSERT INTO item (shelf, tag) VALUES (1, 'a')")
    row = conn.execute(
        "SELECT t.tgname, pg_get_functiondef(t.tgfoid) FROM pg_trigger AS t"
        " WHERE t.tgrelid = 'item'::regclass AND t.tgname LIKE 'pgc_items_by_shelf_%_ins'"
    ).fetchone()
    assert row is not None
    name, source = row
    conn.execute(sql.SQL("ALTER TABLE item DISABLE TRIGGER {}").format(sql.Identifier(name)))
    conn.execute("INSERT INTO item (shelf, tag) VALUES (1, 'a')")  # not counted
    # compiled by an earlier version too: what drift says first is that it is disabled
    conn.execute(source.replace("RETURN NULL;", "RETURN NULL; -- earlier", 1))
    found = {d.name: d for d in triggers.drift(conn)}
    assert found["items.by_shelf"].state == "disabled"
    pc = Counters(conn)
    assert pc.get("items.by_shelf", 1) == 1  # the row written while disabled is missing
    assert not verify(conn, "items.by_shelf").ok
    triggers.install(conn, specs())
    assert {d.state for d in triggers.drift(conn)} == {"installed"}
    assert pc.get("items.by_shelf", 1) == 2  # both rows, counted again
    pc.drain()
    stored = conn.execute(
        "SELECT c.key, c.value FROM pgcounters.counters AS c"
        " JOIN pgcounters.targets AS t ON t.id = c.target_id WHERE t.name = 'items.by_shelf'"
    ).fetchall()
    assert stored == [(["1"], 2)]
    assert verify(conn, "items.by_shelf").ok
