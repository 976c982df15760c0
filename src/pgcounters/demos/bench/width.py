"""``counters-per-table``: what each declared counter costs the writes of a busy table.

One table (``bench_width.t<N>``) with N = 0, 1, 2, 5 and 10 declared counters (queued,
keyed by one of three integer columns), written two ways:

* ``single-row N``: pgbench, 4 client processes, one single-row INSERT a transaction
  (10,000 each; 500 with ``--quick``), the database's default durability;
* ``single-row N async``: the same with ``synchronous_commit = off``: a COMMIT does not
  wait for the disk, so the rate shows the CPU each counter costs (on a machine whose
  disk makes every COMMIT slow, the default durability hides it);
* ``bulk N``: one ``INSERT ... SELECT`` of 100k rows (20k with ``--quick``) and its COMMIT,
  the fastest of 5 each run;
* ``bulk N work_mem 64MB`` (N = 0 and 2): the same with ``work_mem`` set to 64 MB for the
  statement, which then holds its transition table in memory (with the default 4 MB,
  PostgreSQL writes the 100k rows to a temporary file that each counter reads back);
* ``single-row N floor`` (N = 1 and 5, both durabilities): the same single-row INSERTs into
  a table whose N statement triggers each queue the row's key for a counter whose id
  they are given: what N queued counters must add at the least (a trigger fired, the row
  read and a queue row written each), with no pause check, no lookup of the counter and no
  test of the statement's size;
* ``single-row 5 floor one trigger`` (both durabilities): one statement trigger that
  queues the row's five keys in one INSERT: the least that five queued counters add
  when one trigger serves every counter of the table;
* ``bulk 0 transition table``: the bulk INSERT into a table whose one statement trigger
  asks for the statement's rows and does nothing: the copy of the rows that PostgreSQL
  makes for every counter's trigger;
* ``bulk 2 floor``: the bulk INSERT into a table whose 2 statement triggers each group the
  rows by their counter's key and queue one delta a key, ids given: the least that 2
  queued counters add to a bulk statement.

Targets: single-row with 1 counter >= 0.85x the rate with none, with 5 >= 0.7x; bulk
with 2 counters costs at most 1.25x the insert with none (ratio >= 0.8). The floors show
what of that physics allows (with 5 counters and in bulk, the floor itself is at or past
the target), so each compiled variant has a second target: at least 0.85x its floor.
Each run starts from an empty table and queue (not timed); afterwards every counter must
have queued exactly one delta of +1 per row (single-row) or deltas summing to the rows
(bulk).
"""

from __future__ import annotations

import time
from typing import Literal

from psycopg import sql

from pgcounters import triggers
from pgcounters.client import Counters
from pgcounters.config import connect
from pgcounters.connection import Conn
from pgcounters.demos import sqlfiles
from pgcounters.demos.bench import pgbench
from pgcounters.demos.bench.report import Comparison, Measurement, Scenario
from pgcounters.schema import install
from pgcounters.specs import CounterSpec, NamedTarget, Table

SCHEMA = "bench_width"
WIDTHS = (0, 1, 2, 5, 10)
FLOORS = (1, 5)
ONE_TRIGGER = 5  # the width of the table whose one trigger queues every counter's row
BULK_FLOOR = 2  # the width of the table whose triggers each group the rows, ids given
Floor = Literal["each", "one", "grouped", "rows"] | None
CLIENTS = 4
FLOOR_TARGET = 0.85
COMPARISONS: tuple[Comparison, ...] = (
    ("single-row 1", "single-row 0", 0.85),
    ("single-row 2", "single-row 0", None),
    ("single-row 5", "single-row 0", 0.7),
    ("single-row 10", "single-row 0", None),
    ("single-row 1 floor", "single-row 0", None),
    ("single-row 5 floor", "single-row 0", None),
    # the counters' own logic (their ids, the pause check, the test that lets a bulk
    # statement queue one delta a key) adds at most 18% (1 / 0.85) to the time of the
    # floor's statement
    ("single-row 1", "single-row 1 floor", FLOOR_TARGET),
    ("single-row 5", "single-row 5 floor", FLOOR_TARGET),
    ("single-row 5 floor one trigger", "single-row 0", None),
    ("single-row 5 floor one trigger async", "single-row 0 async", None),
    ("single-row 1 async", "single-row 0 async", None),
    ("single-row 2 async", "single-row 0 async", None),
    ("single-row 5 async", "single-row 0 async", None),
    ("single-row 10 async", "single-row 0 async", None),
    ("single-row 1 floor async", "single-row 0 async", None),
    ("single-row 5 floor async", "single-row 0 async", None),
    ("bulk 0 transition table", "bulk 0", None),
    ("bulk 2 floor", "bulk 0", None),
    ("bulk 2", "bulk 2 floor", FLOOR_TARGET),
    ("bulk 1", "bulk 0", None),
    # "at most 1.25x the insert with no counters": time ratio >= 1 / 1.25
    ("bulk 2", "bulk 0", 0.8),
    ("bulk 2 work_mem 64MB", "bulk 0 work_mem 64MB", 0.8),
    ("bulk 5", "bulk 0", None),
    ("bulk 10", "bulk 0", None),
)


def _q(name: str, table: str) -> sql.Composed:
    text = sqlfiles.named("bench_writes.sql")[name]
    return sql.SQL(text).format(table=sql.Identifier(SCHEMA, table))


def _table(width: int, floor: Floor) -> str:
    return {None: "t", "each": "f", "one": "o", "grouped": "g", "rows": "r"}[floor] + str(width)


def names(width: int, *, floor: Floor = None) -> list[str]:
    return [f"bench.width.{_table(width, floor)}.c{i}" for i in range(width)]


def _key(i: int) -> str:
    """The column that the table's i-th counter is keyed by."""
    return ("a", "b", "c")[i % 3]


def specs(width: int) -> list[CounterSpec]:
    return [
        CounterSpec(
            name=name,
            source=Table(f"t{width}", SCHEMA),
            keys=(_key(i),),
            target=NamedTarget(("bigint",)),
        )
        for i, name in enumerate(names(width))
    ]


def _floors() -> list[tuple[int, Floor]]:
    """The tables of the single-row floors."""
    each: list[tuple[int, Floor]] = [(width, "each") for width in FLOORS]
    return [*each, (ONE_TRIGGER, "one")]


def _all_floors() -> list[tuple[int, Floor]]:
    """Every table whose triggers are written here: the floors, the transition table alone."""
    return [*_floors(), (BULK_FLOOR, "grouped"), (0, "rows")]


def cleanup(conn: Conn) -> None:
    for width in WIDTHS:
        for name in names(width):
            triggers.uninstall(conn, name, drop_values=True)
    pc = Counters(conn)
    for width, floor in _all_floors():
        for name in names(width, floor=floor):
            pc.drop_counter(name)
    conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(SCHEMA)))


def prepare(conn: Conn) -> None:
    install(conn)
    cleanup(conn)
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(SCHEMA)))
    for width in WIDTHS:
        conn.execute(_q("width_table", f"t{width}"))
        triggers.install(conn, specs(width))
    for width, floor in _all_floors():
        _floor_table(conn, width, floor)


def _floor_table(conn: Conn, width: int, floor: Floor) -> None:
    """A copy of the table whose statement triggers are written here, given their ids."""
    blocks = sqlfiles.named("bench_writes.sql")
    table = _table(width, floor)
    conn.execute(_q("width_table", table))
    pc = Counters(conn)
    ids = [pc.create_counter(name, key=int).id for name in names(width, floor=floor)]

    def trigger(suffix: str, block: str, targets: list[int], **parts: sql.Composable) -> None:
        function = sql.Identifier(SCHEMA, f"{table}_{suffix}")
        statement = sql.SQL(blocks[block]).format(**parts)
        conn.execute(
            sql.SQL(blocks["floor_function"]).format(function=function, statement=statement)
        )
        conn.execute(
            sql.SQL(blocks["floor_trigger"]).format(
                trigger=sql.Identifier(f"floor_{suffix}"),
                table=sql.Identifier(SCHEMA, table),
                function=function,
                targets=sql.SQL(", ").join(sql.Literal(str(id_)) for id_ in targets),
            )
        )

    if floor == "one":
        key = sql.SQL("(TG_ARGV[{}]::integer, ARRAY[(n.{})::bigint::text]::text[])")
        rows = [key.format(sql.Literal(i), sql.Identifier(_key(i))) for i in range(width)]
        trigger("all", "floor_rows", ids, rows=sql.SQL(", ").join(rows))
    elif floor == "rows":
        trigger("rows", "rows_only", [])
    else:
        block = "floor_grouped" if floor == "grouped" else "floor_row"
        for i, id_ in enumerate(ids):
            trigger(str(i), block, [id_], column=sql.Identifier(_key(i)))


def _empty(conn: Conn, width: int, *, floor: Floor = None) -> None:
    # TRUNCATE fires each counter's own reset: the queue and the stored values are empty
    conn.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier(SCHEMA, _table(width, floor))))
    if floor:  # the floor's triggers know no TRUNCATE: its counters' deltas go here
        conn.execute(
            sqlfiles.named("bench_writes.sql")["floor_empty"], {"names": names(width, floor=floor)}
        )


def exact(conn: Conn, width: int, rows: int, *, single_row: bool, floor: Floor = None) -> bool:
    """Every counter of the table queued deltas summing to ``rows`` (one a row: single-row)."""
    found = conn.execute(
        sqlfiles.named("bench_writes.sql")["width_queued"],
        {"names": names(width, floor=floor)},
    ).fetchall()
    if len(found) != width:
        return False
    return all(total == rows and (not single_row or count == rows) for _, count, total in found)


def _single_row(
    binary: str,
    dsn: str,
    conn: Conn,
    width: int,
    per_client: int,
    *,
    asynchronous: bool,
    floor: Floor = None,
) -> Measurement:
    _empty(conn, width, floor=floor)
    script = _q("pgbench_single_row", _table(width, floor)).as_string(conn) + ";\n"
    result = pgbench.run(
        binary,
        dsn,
        script,
        clients=CLIENTS,
        transactions=per_client,
        options="-c synchronous_commit=off" if asynchronous else None,
    )
    ok = result.transactions == CLIENTS * per_client and exact(
        conn, width, result.transactions, single_row=True, floor=floor
    )
    return Measurement(result.seconds, result.transactions, ok)


BULK_WORK_MEM = "64MB"
"""The work_mem of the ``bulk N work_mem`` variants: enough for 100k rows' transition table."""


BULK_TRIES = 5
"""Each run of a bulk variant is the fastest of this many inserts (one takes 0.1-0.2 s)."""


def _bulk(
    dsn: str,
    conn: Conn,
    width: int,
    rows: int,
    work_mem: str | None = None,
    floor: Floor = None,
) -> Measurement:
    fastest, ok = float("inf"), True
    for _ in range(BULK_TRIES):
        _empty(conn, width, floor=floor)
        with connect(dsn, autocommit=False) as writer:
            if work_mem is not None:
                writer.execute("SELECT set_config('work_mem', %s, false)", (work_mem,))
                writer.commit()
            started = time.perf_counter()
            writer.execute(_q("width_bulk", _table(width, floor)), {"n": rows})
            writer.commit()
            fastest = min(fastest, time.perf_counter() - started)
        ok = ok and exact(conn, width, rows, single_row=False, floor=floor)
    return Measurement(fastest, rows, ok)


def counters_per_table(dsn: str, repeat: int, quick: bool) -> Scenario:
    per_client, rows = (500, 20_000) if quick else (10_000, 100_000)
    scenario = Scenario(
        "counters-per-table",
        f"One table with 0, 1, 2, 5 or 10 declared counters (queued): single-row INSERTs, "
        f"one a transaction, from {CLIENTS} pgbench client processes x {per_client}, and one "
        f"bulk INSERT ... SELECT of {rows:,} rows (each run the fastest of {BULK_TRIES}); "
        "single-row again with synchronous_commit "
        "off (async: the CPU each counter costs, the disk's wait left out). Targets: "
        "single-row with 1 counter >= 0.85x the rate with none, with 5 >= 0.7x; bulk with "
        "2 counters at most 1.25x the time with none. Beside them, the floor of 1 and 5 "
        "queued counters: triggers that each queue the row's key, their counter's id "
        "given (the least a queued counter adds to a single-row statement), and of 5 "
        "counters served by one trigger that queues their 5 rows in one INSERT (each row's "
        "own keys). Bulk with 0 "
        f"and 2 counters again with work_mem {BULK_WORK_MEM}, which holds the statement's "
        "transition table in memory; bulk with a trigger that asks for the statement's rows "
        "and does nothing (the transition table alone), and the floor of 2 counters: two "
        "triggers that each group the rows by their counter's key and queue one delta a key. "
        "Where the floor itself is at or past a target, the target that matters: 1, 5 and "
        f"bulk 2 counters at least {FLOOR_TARGET}x their floor.",
        unit="rows",
    )
    binary = pgbench.find()
    if binary is None:
        scenario.description += " Single-row variants " + pgbench.MISSING
    with connect(dsn) as conn:
        prepare(conn)
        try:
            for _ in range(repeat):
                for asynchronous in (False, True) if binary is not None else ():
                    for width in WIDTHS:
                        assert binary is not None
                        m = _single_row(
                            binary, dsn, conn, width, per_client, asynchronous=asynchronous
                        )
                        suffix = " async" if asynchronous else ""
                        scenario.add(f"single-row {width}{suffix}", m)
                    for width, floor in _floors():
                        assert binary is not None
                        m = _single_row(
                            binary,
                            dsn,
                            conn,
                            width,
                            per_client,
                            asynchronous=asynchronous,
                            floor=floor,
                        )
                        suffix = (" one trigger" if floor == "one" else "") + (
                            " async" if asynchronous else ""
                        )
                        scenario.add(f"single-row {width} floor{suffix}", m)
                for width in WIDTHS:
                    scenario.add(f"bulk {width}", _bulk(dsn, conn, width, rows))
                for width in (0, 2):
                    m = _bulk(dsn, conn, width, rows, work_mem=BULK_WORK_MEM)
                    scenario.add(f"bulk {width} work_mem {BULK_WORK_MEM}", m)
                m = _bulk(dsn, conn, 0, rows, floor="rows")
                scenario.add("bulk 0 transition table", m)
                m = _bulk(dsn, conn, BULK_FLOOR, rows, floor="grouped")
                scenario.add(f"bulk {BULK_FLOOR} floor", m)
        finally:
            cleanup(conn)
    scenario.compare([c for c in COMPARISONS if c[0] in scenario.runs and c[1] in scenario.runs])
    scenario.headline = ("single-row 1", "single-row 0")
    return scenario
