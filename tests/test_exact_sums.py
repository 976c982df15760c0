"""Exact sums of decimal columns: a sum of a numeric(p, s) column is kept in units of 10^-s,
so ten rows of 0.4 sum to 4.0 in every mode, through every write path, and reads, verify and
recount give and compare Decimals. Float and unconstrained numeric sums are refused."""

from __future__ import annotations

import json
import random
from decimal import Decimal
from typing import Any

import psycopg
import pytest

import truth
from pgcounters import Counters, backfill, cli, triggers
from pgcounters.batching import BatchingCounters
from pgcounters.connection import Conn
from pgcounters.errors import (
    CounterDefinitionConflict,
    InvalidCounterDefinition,
    InvalidDelta,
)
from pgcounters.repair import recount, verify
from pgcounters.specs import ColumnTarget, CounterSpec, Fragment, NamedTarget
from support import tamper

DDL = """
CREATE TABLE shop_order (id bigserial PRIMARY KEY, total numeric(16, 2) NOT NULL DEFAULT 0);
CREATE TABLE shop_line (
    id bigserial PRIMARY KEY,
    order_id bigint REFERENCES shop_order ON DELETE CASCADE,
    day date NOT NULL DEFAULT '2026-11-21',
    amount numeric(10, 2),
    weight double precision,
    loose numeric
);
INSERT INTO shop_order (id) SELECT g FROM generate_series(1, 5) AS g;
"""

TOTAL = "shop.order.total"
PER_DAY = "shop.amount_per_day"
ALL = "shop.amount"
MODES = ("queued", "unlogged", "direct")


def specs(mode: Any = "queued") -> list[CounterSpec]:
    return [
        CounterSpec(
            name=TOTAL,
            source="shop_line",
            keys=("order_id",),
            target=ColumnTarget("shop_order", "total"),
            sum="amount",
            scale=2,
            mode=mode,
        ),
        CounterSpec(
            name=PER_DAY,
            source="shop_line",
            keys=("day",),
            target=NamedTarget(("date",)),
            sum="amount",
            scale=2,
            mode=mode,
        ),
        CounterSpec(
            name=ALL,
            source="shop_line",
            target=NamedTarget(),
            sum="amount",
            scale=2,
            mode=mode,
        ),
    ]


TRUTHS = [
    truth.from_sql(
        TOTAL,
        "SELECT o.id, coalesce(sum(l.amount), 0) FROM shop_order AS o"
        " LEFT JOIN shop_line AS l ON l.order_id = o.id GROUP BY o.id",
        stored="SELECT id, total FROM shop_order",
    ),
    truth.from_sql(PER_DAY, "SELECT day, sum(amount) FROM shop_line GROUP BY day"),
    truth.from_sql(ALL, "SELECT sum(amount) FROM shop_line HAVING count(*) > 0"),
]


def _shop(conn: Conn, mode: str = "queued") -> Counters:
    conn.execute(DDL)
    triggers.install(conn, specs(mode))
    return Counters(conn)


@pytest.mark.parametrize("mode", MODES)
def test_ten_rows_of_0_4_sum_to_4(conn: Conn, mode: str) -> None:
    pc = _shop(conn, mode)
    for _ in range(10):  # one statement each: one delta each
        conn.execute("INSERT INTO shop_line (order_id, amount) VALUES (1, 0.4)")
    assert pc.get_decimal(TOTAL, 1) == Decimal("4.0")
    assert str(pc.get_decimal(TOTAL, 1)) == "4.00"
    assert pc.get_decimal(ALL) == Decimal("4.0")
    conn.execute("UPDATE shop_line SET amount = amount + 0.01 WHERE id <= 3")
    conn.execute("DELETE FROM shop_line WHERE id = 10")
    assert pc.get_decimal(TOTAL, 1) == Decimal("3.63")
    truth.assert_exact(conn, TRUTHS)
    truth.assert_drained(conn, TRUTHS)
    row = conn.execute("SELECT total FROM shop_order WHERE id = 1").fetchone()
    assert row == (Decimal("3.63"),)
    assert verify(conn, TOTAL).mismatches == []
    assert verify(conn, PER_DAY).mismatches == []


@pytest.mark.parametrize("mode", MODES)
def test_random_decimal_writes_equal_the_truth(conn: Conn, mode: str) -> None:
    pc = _shop(conn, mode)
    rnd = random.Random(f"exact-sums-{mode}")

    def amount() -> Decimal:
        return Decimal(rnd.randint(-99_999, 99_999)).scaleb(-2)

    for step in range(60):
        choice = rnd.random()
        if choice < 0.45:  # a bulk insert of several orders and days
            rows = [
                (rnd.randint(1, 5), f"2026-11-{rnd.randint(20, 23)}", amount())
                for _ in range(rnd.randint(1, 20))
            ]
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO shop_line (order_id, day, amount) VALUES (%s, %s, %s)", rows
                )
        elif choice < 0.6:  # COPY
            with (
                conn.cursor() as cur,
                cur.copy("COPY shop_line (order_id, day, amount) FROM STDIN") as copy,
            ):
                for _ in range(rnd.randint(1, 10)):
                    copy.write_row((rnd.randint(1, 5), "2026-11-21", amount()))
        elif choice < 0.8:  # values, parents and days change together
            conn.execute(
                "UPDATE shop_line SET amount = amount + %s, order_id = %s WHERE id %% 7 = %s",
                (amount(), rnd.randint(1, 5), rnd.randint(0, 6)),
            )
        elif choice < 0.9:
            conn.execute("UPDATE shop_line SET amount = NULL WHERE id %% 11 = %s", (step % 11,))
        else:
            conn.execute("DELETE FROM shop_line WHERE id %% 5 = %s", (rnd.randint(0, 4),))
        if step % 20 == 19:
            pc.drain()
    assert conn.execute("SELECT count(*) FROM shop_line").fetchone() != (0,)
    truth.assert_exact(conn, TRUTHS)
    truth.assert_drained(conn, TRUTHS)
    for name in (TOTAL, PER_DAY, ALL):
        assert verify(conn, name).mismatches == []


def test_reads_return_decimals_and_integer_reads_refuse(conn: Conn) -> None:
    pc = _shop(conn)
    conn.execute(
        "INSERT INTO shop_line (order_id, day, amount) VALUES"
        " (1, '2026-11-21', 1.25), (2, '2026-11-21', 2.5), (2, '2026-11-22', 0.05)"
    )
    assert pc.get_many_decimal(TOTAL, [1, 2, 3]) == [Decimal("1.25"), Decimal("2.55"), 0]
    with pytest.raises(InvalidCounterDefinition, match="get_decimal"):
        pc.get(TOTAL, 1)
    with pytest.raises(InvalidCounterDefinition, match="get_decimal"):
        pc.get_many(PER_DAY, ["2026-11-21"])
    with pytest.raises(InvalidCounterDefinition, match="top_decimal"):
        pc.top(PER_DAY)
    pc.drain()
    top = pc.top_decimal(PER_DAY)
    assert [(str(k[0]), str(v)) for k, v in top] == [("2026-11-21", "3.75"), ("2026-11-22", "0.05")]
    assert [str(v) for _, v in pc.top_decimal(TOTAL, 2)] == ["2.55", "1.25"]
    # from SQL: get refuses, get_decimal reads (an integer counter's value too)
    with pytest.raises(psycopg.Error, match="get_decimal"):
        conn.execute("SELECT pgcounters.get(%s, ARRAY['1'])", (TOTAL,))
    row = conn.execute("SELECT pgcounters.get_decimal(%s, ARRAY['2026-11-21'])", (PER_DAY,))
    assert row.fetchone() == (Decimal("3.75"),)


@pytest.mark.parametrize("mode", MODES)
def test_incr_decimal_adds_exactly_and_refuses_more_places(conn: Conn, mode: str) -> None:
    pc = _shop(conn, mode)
    conn.execute("INSERT INTO shop_line (order_id, amount) VALUES (1, 1.10)")
    pc.incr_decimal(TOTAL, 1, Decimal("0.05"))
    pc.incr_many([(TOTAL, 1, Decimal("0.10")), (ALL, None, 2)])
    conn.execute("SELECT pgcounters.incr_decimal(%s, ARRAY['1'], 0.20)", (TOTAL,))
    assert pc.get_decimal(TOTAL, 1) == Decimal("1.45")
    assert pc.get_decimal(ALL) == Decimal("3.10")
    with pytest.raises(InvalidDelta, match="2 decimal places"):
        pc.incr_decimal(TOTAL, 1, Decimal("0.001"))
    with pytest.raises(InvalidDelta, match="int or a Decimal"):
        pc.incr_decimal(TOTAL, 1, 0.1)  # type: ignore[arg-type]
    with pytest.raises(InvalidCounterDefinition, match="incr_decimal"):
        pc.incr(ALL, None, 1)
    with pytest.raises(psycopg.Error, match="incr_decimal"):
        conn.execute("SELECT pgcounters.incr(%s, '{}', 1)", (ALL,))
    with pytest.raises(psycopg.Error, match="has more"):
        conn.execute("SELECT pgcounters.incr_decimal(%s, '{}', 0.001)", (ALL,))
    assert pc.get_decimal(ALL) == Decimal("3.10")
    pc.drain()
    assert pc.get_decimal(TOTAL, 1) == Decimal("1.45")


def test_verify_finds_and_recount_repairs_a_broken_decimal_value(conn: Conn) -> None:
    pc = _shop(conn)
    conn.execute(
        "INSERT INTO shop_line (order_id, amount)"
        " SELECT 1 + g % 3, 0.4 FROM generate_series(1, 30) AS g"
    )
    pc.drain()
    tamper(conn, "UPDATE shop_order SET total = total + 0.01 WHERE id = 2")
    conn.execute(
        "UPDATE pgcounters.counters SET value = value - 7"
        " WHERE target_id = (SELECT id FROM pgcounters.targets WHERE name = %s)",
        (ALL,),
    )
    found = verify(conn, TOTAL).mismatches
    assert [(m.key, m.expected, m.actual) for m in found] == [
        ((2,), Decimal("4.00"), Decimal("4.01"))
    ]
    assert str(found[0].actual) == "4.01"
    (wrong,) = verify(conn, ALL).mismatches
    assert (wrong.expected, wrong.actual) == (Decimal("12.00"), Decimal("11.93"))
    assert recount(conn, TOTAL).keys_fixed == 1
    assert recount(conn, ALL).keys_fixed == 1
    truth.assert_stored(conn, TRUTHS)
    assert verify(conn, TOTAL).mismatches == []
    assert verify(conn, ALL).mismatches == []


def test_a_counter_installed_over_existing_rows_is_backfilled_exactly(conn: Conn) -> None:
    conn.execute(DDL)
    conn.execute(
        "INSERT INTO shop_line (order_id, amount)"
        " SELECT 1 + g % 5, 0.01 * g FROM generate_series(1, 200) AS g"
    )
    triggers.install(conn, specs(), backfill=False)
    conn.execute("INSERT INTO shop_line (order_id, amount) VALUES (1, 0.4)")
    backfill.run(conn)
    truth.assert_exact(conn, TRUTHS)
    truth.assert_drained(conn, TRUTHS)


def _spec(sum_: str | Fragment, scale: int | None) -> CounterSpec:
    return CounterSpec(
        name="shop.x", source="shop_line", target=NamedTarget(), sum=sum_, scale=scale
    )


@pytest.mark.parametrize(
    ("column", "scale", "message"),
    [
        ("amount", None, r"numeric\(10,2\)\) is a decimal: declare the counter with scale=2"),
        ("loose", None, r"has no scale.*give the column a scale"),
        ("loose", 2, r"has no scale.*give the column a scale"),
        ("weight", None, r"floating-point: its values are not exact"),
        ("weight", 2, r"floating-point: its values are not exact"),
        ("amount", 3, r"numeric\(10,2\), not numeric with 3 decimal places"),
        ("id", 2, r"bigint, not numeric with 2 decimal places"),
    ],
)
def test_sums_that_cannot_be_exact_are_refused_at_install(
    conn: Conn, column: str, scale: int | None, message: str
) -> None:
    conn.execute(DDL)
    with pytest.raises(InvalidCounterDefinition, match=message):
        triggers.install(conn, [_spec(column, scale)])
    assert triggers.installed(conn) == []


def test_a_scale_is_checked_by_the_spec() -> None:
    with pytest.raises(InvalidCounterDefinition, match="0 to 18"):
        _spec("amount", 19)
    with pytest.raises(InvalidCounterDefinition, match="counts rows"):
        CounterSpec(name="shop.x", source="shop_line", target=NamedTarget(), scale=2)
    # an integer sum keeps its recorded definition (and fingerprint) unchanged
    assert "scale" not in _spec("amount", None).to_json()
    assert CounterSpec.from_json(_spec("amount", 2).to_json()).scale == 2


def test_an_expression_with_more_places_than_the_scale_fails_the_write(conn: Conn) -> None:
    conn.execute(DDL)
    triggers.install(conn, [_spec(Fragment("amount / 3"), 2)])
    conn.execute("INSERT INTO shop_line (amount) VALUES (0.3)")  # 0.1 exactly
    with pytest.raises(psycopg.Error, match=r"counter shop\.x sums values with 2 decimal places"):
        conn.execute("INSERT INTO shop_line (amount) VALUES (1)")
    assert Counters(conn).get_decimal("shop.x") == Decimal("0.10")


def test_changing_the_summed_columns_scale_is_refused_and_widening_allowed(conn: Conn) -> None:
    pc = _shop(conn)
    conn.execute("INSERT INTO shop_line (order_id, amount) VALUES (1, 0.4)")
    for ddl in (
        "ALTER TABLE shop_line ALTER COLUMN amount TYPE numeric(10, 3)",
        "ALTER TABLE shop_line ALTER COLUMN amount TYPE numeric(10, 1)",
        "ALTER TABLE shop_line ALTER COLUMN amount TYPE numeric",
        "ALTER TABLE shop_line ALTER COLUMN amount TYPE double precision",
        "ALTER TABLE shop_line ALTER COLUMN amount TYPE bigint",
    ):
        with pytest.raises(psycopg.Error, match=r"breaks counter shop\.") as caught:
            conn.execute(ddl)
        assert caught.value.sqlstate == "PC020"
    conn.execute("ALTER TABLE shop_line ALTER COLUMN amount TYPE numeric(14, 2)")  # wider: exact
    conn.execute("INSERT INTO shop_line (order_id, amount) VALUES (1, 123456789.01)")
    assert pc.get_decimal(TOTAL, 1) == Decimal("123456789.41")
    assert {d.name: d.state for d in triggers.drift(conn)}[TOTAL] == "installed"
    truth.assert_drained(conn, TRUTHS)


def test_a_counter_declared_again_with_another_scale_is_counted_again(conn: Conn) -> None:
    """Its values are in other units: the install drops them and counts the rows again in
    the new ones (it was refused; under Django the migration had installed the new
    triggers by then, and every write to the table failed)."""
    pc = _shop(conn)
    conn.execute("INSERT INTO shop_line (order_id, amount) VALUES (1, 0.4)")
    assert pc.get_decimal(ALL) == Decimal("0.40")
    conn.execute("ALTER TABLE shop_line ADD COLUMN cents bigint")
    conn.execute("UPDATE shop_line SET cents = 40")
    again = CounterSpec(name=ALL, source="shop_line", target=NamedTarget(), sum="cents")
    triggers.install(conn, [again])
    conn.execute("INSERT INTO shop_line (order_id, amount, cents) VALUES (1, 0.1, 10)")
    pc = Counters(conn)
    assert pc.get(ALL) == 50
    # a counter made by hand, never declared, is still refused rather than dropped
    pc.create_counter("by_hand.sum", None)
    refused = CounterSpec(
        name="by_hand.sum", source="shop_line", target=NamedTarget(), sum="amount", scale=2
    )
    with pytest.raises(CounterDefinitionConflict):
        triggers.install(conn, [refused])


def test_changing_the_decimal_counter_columns_type_is_refused(conn: Conn) -> None:
    """PostgreSQL itself refuses it: the column's guard trigger names it in its condition."""
    _shop(conn)
    for ddl in (
        "ALTER TABLE shop_order ALTER COLUMN total TYPE numeric(16, 1)",
        "ALTER TABLE shop_order ALTER COLUMN total TYPE numeric(18, 2)",
    ):
        with pytest.raises(psycopg.errors.FeatureNotSupported, match="used in a trigger"):
            conn.execute(ddl)


def test_a_counter_column_of_another_scale_is_refused_at_install(conn: Conn) -> None:
    conn.execute(DDL)
    conn.execute("ALTER TABLE shop_order ADD COLUMN whole bigint NOT NULL DEFAULT 0")
    spec = CounterSpec(
        name="shop.order.whole",
        source="shop_line",
        keys=("order_id",),
        target=ColumnTarget("shop_order", "whole"),
        sum="amount",
        scale=2,
    )
    with pytest.raises(InvalidCounterDefinition, match=r"its column must be numeric\(p, 2\)"):
        triggers.install(conn, [spec])
    assert triggers.installed(conn) == []


def test_event_counters_refuse_a_decimal_counter(conn: Conn, dsn: str) -> None:
    _shop(conn)
    with (
        BatchingCounters(dsn, interval=None) as batching,
        pytest.raises(InvalidCounterDefinition, match="incr_decimal"),
    ):
        batching.incr(ALL, None, 1)
    assert Counters(conn).get_decimal(ALL) == 0


def test_the_cli_reads_and_verifies_decimal_counters(
    conn: Conn, dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _shop(conn)
    conn.execute("INSERT INTO shop_line (order_id, amount) VALUES (1, 0.4), (1, 0.4), (2, 1.05)")
    Counters(conn).drain()
    assert cli.run(["--dsn", dsn, "get", TOTAL, "1"]) == 0
    assert capsys.readouterr().out == "0.80\n"
    assert cli.run(["--dsn", dsn, "top", ALL]) == 0
    assert capsys.readouterr().out == "-\t1.85\n"
    tamper(conn, "UPDATE shop_order SET total = total + 0.01 WHERE id = 2")
    assert cli.run(["--dsn", dsn, "verify", TOTAL]) == 5
    assert "key 2: stored + pending 1.06, truth 1.05 (+0.01)" in capsys.readouterr().out
    assert cli.run(["--dsn", dsn, "verify", TOTAL, "--json"]) == 5
    (counter,) = json.loads(capsys.readouterr().out)["counters"]
    assert counter["differences"] == [
        {"key": [2], "expected": "1.05", "actual": "1.06", "difference": "0.01"}
    ]
