"""Smoke runs of the write benchmarks with tiny sizes: every variant exact, ratios reported."""

from __future__ import annotations

from typing import Literal

import pytest
from psycopg import sql

from pgcounters.connection import Conn
from pgcounters.demos.bench import SCENARIOS, pgbench
from pgcounters.demos.bench.sqlincr import VARIANTS


def test_pgbench_is_found_and_its_rate_is_read(dsn: str) -> None:
    binary = pgbench.find()
    assert binary is not None  # the embedded PostgreSQL ships it
    result = pgbench.run(binary, dsn, "SELECT 1;\n", clients=2, transactions=5)
    assert result.transactions == 10
    assert result.tps > 0
    assert result.seconds > 0


def test_the_sql_increment_scenario_counts_every_increment(dsn: str) -> None:
    scenario = SCENARIOS["sql-increment"](dsn, 1, True)
    assert set(scenario.runs) == set(VARIANTS)
    assert all(m.exact and m.operations == 2000 for runs in scenario.runs.values() for m in runs)
    targets = {(c["variant"], c["baseline"]): c["target"] for c in scenario.comparisons}
    assert targets[("incr queued", "INSERT queued")] == 0.95
    assert targets[("incr unlogged", "INSERT unlogged")] == 0.95
    assert "| incr queued | INSERT queued |" in scenario.table()
    # the call alone, measured in the same run, beside the INSERT and the increment
    assert ("function INSERT unlogged", "INSERT unlogged") in targets
    assert ("incr unlogged", "function INSERT unlogged") in targets


def test_the_counters_per_table_scenario_checks_every_delta(dsn: str) -> None:
    from pgcounters.demos.bench import width

    scenario = SCENARIOS["counters-per-table"](dsn, 1, True)
    expected = {f"{shape} {n}{suffix}" for n in width.WIDTHS for shape, suffix in
                (("single-row", ""), ("single-row", " async"), ("bulk", ""))}  # fmt: skip
    expected |= {f"single-row {n} floor{suffix}" for n in width.FLOORS for suffix in ("", " async")}
    expected |= {f"single-row {width.ONE_TRIGGER} floor one trigger{s}" for s in ("", " async")}
    expected |= {f"bulk {n} work_mem {width.BULK_WORK_MEM}" for n in (0, 2)}
    expected |= {"bulk 0 transition table", f"bulk {width.BULK_FLOOR} floor"}
    assert set(scenario.runs) == expected
    assert all(m.exact for runs in scenario.runs.values() for m in runs)
    targets = {(c["variant"], c["baseline"]): c["target"] for c in scenario.comparisons}
    assert targets[("single-row 1", "single-row 0")] == 0.85
    assert targets[("single-row 5", "single-row 0")] == 0.7
    assert targets[("bulk 2", "bulk 0")] == 0.8
    assert targets[("bulk 2 work_mem 64MB", "bulk 0 work_mem 64MB")] == 0.8
    assert targets[("single-row 1", "single-row 1 floor")] == 0.85
    assert targets[("single-row 5", "single-row 5 floor")] == 0.85
    assert targets[("bulk 2", "bulk 2 floor")] == 0.85


def test_a_lost_delta_is_not_exact(conn: Conn) -> None:
    from pgcounters.demos.bench import width

    width.prepare(conn)
    try:
        # two rows with the same keys: one delta of +2 per counter
        conn.execute("INSERT INTO bench_width.t5 (a, b, c) VALUES (1, 2, 3), (1, 2, 3)")
        assert width.exact(conn, 5, 2, single_row=False)
        assert not width.exact(conn, 5, 2, single_row=True)  # one delta of +2, not one per row
        conn.execute(
            "DELETE FROM pgcounters.queue WHERE id = (SELECT max(id) FROM pgcounters.queue)"
        )
        assert not width.exact(conn, 5, 2, single_row=False)
    finally:
        width.cleanup(conn)


def _queued(conn: Conn, names: list[str]) -> list[tuple[list[str], list[int]]]:
    """The keys and deltas queued for each counter named, in queue order, by name."""
    rows = conn.execute(
        "SELECT t.name, array_agg(q.key ORDER BY q.id), array_agg(q.delta ORDER BY q.id)"
        " FROM pgcounters.queue AS q JOIN pgcounters.targets AS t ON t.id = q.target_id"
        " WHERE t.name = ANY (%s) GROUP BY t.name ORDER BY t.name",
        (names,),
    ).fetchall()
    return [(keys, deltas) for _, keys, deltas in rows]


@pytest.mark.parametrize("floor", ["each", "one"])
def test_the_floor_counts_each_single_row_statement_once_per_counter(
    conn: Conn, floor: Literal["each", "one"]
) -> None:
    from pgcounters.demos.bench import width

    width.prepare(conn)
    table = {"each": "f5", "one": "o5"}[floor]
    try:
        insert = sql.SQL("INSERT INTO {} (a, b, c) VALUES (%s, %s, %s)").format(
            sql.Identifier("bench_width", table)
        )
        conn.execute(insert, (1, 2, 3))
        conn.execute(insert, (4, 5, 6))
        assert width.exact(conn, 5, 2, single_row=True, floor=floor)
        # each counter queued the rows' own keys (a, b, c, a, b), as a declared counter does
        assert [keys for keys, _ in _queued(conn, width.names(5, floor=floor))] == [
            ["{1}", "{4}"],
            ["{2}", "{5}"],
            ["{3}", "{6}"],
            ["{1}", "{4}"],
            ["{2}", "{5}"],
        ]
        assert not width.exact(conn, 5, 3, single_row=True, floor=floor)
        width._empty(conn, 5, floor=floor)
        assert width.exact(conn, 5, 0, single_row=True, floor=floor)
    finally:
        width.cleanup(conn)
    assert not conn.execute(
        "SELECT 1 FROM pgcounters.targets WHERE name LIKE 'bench.width.%'"
    ).fetchall()


def test_the_bulk_floor_queues_one_delta_a_key_and_the_rows_alone_queue_nothing(
    conn: Conn,
) -> None:
    from pgcounters.demos.bench import width

    width.prepare(conn)
    try:
        before = conn.execute("SELECT count(*) FROM pgcounters.queue").fetchone()
        conn.execute(
            "INSERT INTO bench_width.r0 (a, b, c) SELECT g, g, g FROM generate_series(1, 50) g"
        )
        assert conn.execute("SELECT count(*) FROM pgcounters.queue").fetchone() == before
        assert conn.execute(
            "SELECT tgname FROM pg_trigger WHERE tgrelid = 'bench_width.r0'::regclass"
        ).fetchall() == [("floor_rows",)]
        # 100 rows over 10 values of a and 20 of b: one delta a key and counter
        conn.execute(
            "INSERT INTO bench_width.g2 (a, b, c)"
            " SELECT g % 10, g % 20, 0 FROM generate_series(1, 100) g"
        )
        assert width.exact(conn, 2, 100, single_row=False, floor="grouped")
        assert not width.exact(conn, 2, 101, single_row=False, floor="grouped")
        by_a, by_b = _queued(conn, width.names(2, floor="grouped"))
        assert sorted(by_a[0]) == sorted(f"{{{i}}}" for i in range(10))
        assert by_a[1] == [10] * 10
        assert sorted(by_b[0]) == sorted(f"{{{i}}}" for i in range(20))
        assert by_b[1] == [5] * 20
    finally:
        width.cleanup(conn)
