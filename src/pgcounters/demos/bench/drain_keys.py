"""How the drain's rate follows the number of distinct keys, and top-N of a named counter.

``drain-keys``: N deltas of 1 (500k; 50k with ``--quick``) are queued over K
distinct keys (not timed), then drained to the end, one transaction a batch
(timed), for K from 10 to 500k. Variants, interleaved, each on the same queue
contents:

* ``pgcounters``: :meth:`Counters.drain` of a named counter, as the worker drains
  (batches of 10k, a queue holding more taken in one batch of up to
  ``MAX_BATCH_SIZE``);
* ``fixed batches``: the same drain in batches of 10k only (``max_batch_size``
  10k): what the larger batch of a backlog gives, side by side;
* ``value index``: the drain before: fixed batches of 10k, and an index on
  ``(target_id, value DESC)`` created on ``pgcounters.counters`` for the run (how
  named counters were stored before rank bands: every update of a value is then a
  new entry in both indexes);
* ``between-claim``: the reference ``id BETWEEN`` claim on pgcounters' queue with a
  plain sum and upsert (``reference_between_drain_batch``): the textbook drain on the
  same queue, unsafe beside a second drainer;
* ``reference-between``: depesz's function as published, on the reference tables
  (``counter_name text``); its UPDATE-only merge needs every counter's row to
  exist, so the rows are created before the run (not timed);
* ``pgcounters column``: :meth:`Counters.drain` of a counter column of a parent
  table with K rows (as ``pgcounters``);
* ``column fixed batches``: the same in batches of 10k only;
* ``textbook column``: the ``BETWEEN`` claim, a sum per key and one UPDATE of the
  parent rows (``reference_between_drain_column``): it waits on any row an
  application holds, pgcounters' column drain never does.

The textbook drains run in batches of 10k, as the reference technique does.

Every run checks every total (each key holds N / K).

``top-named``: the 10 greatest of a named counter with 1M keys (values drawn
from a skewed distribution): ``rank bands`` (:meth:`Counters.top`), against the
same ranking ``ORDER BY value DESC, key`` through an index on the value
(``value index``: how it was ranked before) and without one (``full sort``: what
ranking costs with no structure at all). Each run checks the result against
the full sort.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from pgcounters.client import MAX_BATCH_SIZE, Counters
from pgcounters.config import connect
from pgcounters.connection import Conn
from pgcounters.demos import sqlfiles
from pgcounters.demos.bench.report import Comparison, Measurement, Scenario
from pgcounters.schema import install

BATCH = 10_000
NAMED = ("pgcounters", "fixed batches", "value index", "between-claim", "reference-between")
COLUMN = ("pgcounters column", "column fixed batches", "textbook column")
VARIANTS = NAMED + COLUMN
COUNTER = "bench.keys"
COLUMN_COUNTER = "bench.keys_column"
VALUE_INDEX = "bench_counters_value"


def _label(keys: int) -> str:
    if keys >= 1000 and keys % 1000 == 0:
        return f"{keys // 1000}k keys"
    return f"{keys} keys"


def _size(quick: bool) -> tuple[int, tuple[int, ...]]:
    if quick:
        return 50_000, (10, 10_000, 50_000)
    return 500_000, (10, 10_000, 100_000, 500_000)


def _prepare(conn: Conn) -> None:
    install(conn)
    conn.execute(sqlfiles.read("reference_queue.sql").encode())
    conn.execute(sqlfiles.read("reference_drain.sql").encode())
    conn.execute(sqlfiles.read("reference_drain_keys.sql").encode())


def _queue(conn: Conn, target: int, n: int, keys: int) -> None:
    conn.execute("TRUNCATE pgcounters.queue")
    conn.execute(
        "INSERT INTO pgcounters.queue (target_id, key, delta)"
        " SELECT %s, ARRAY[(g %% %s)::text], 1 FROM generate_series(1, %s) AS g",
        (target, keys, n),
    )


def _fill(conn: Conn, variant: str, n: int, keys: int) -> int:
    """Queue ``n`` deltas of 1 over ``keys`` keys for ``variant``; returns its counter id."""
    pc = Counters(conn)
    pc.drop_counter(COUNTER)
    pc.drop_counter(COLUMN_COUNTER)
    conn.execute(
        "TRUNCATE reference_queue, reference_counters, bench_keys_parent, pgcounters.queue"
    )
    conn.execute(f"DROP INDEX IF EXISTS pgcounters.{VALUE_INDEX}")
    target = 0
    if variant == "reference-between":
        conn.execute(
            "INSERT INTO reference_counters (counter_name)"
            " SELECT g::text FROM generate_series(0, %s) g",
            (keys - 1,),
        )
        conn.execute(
            "INSERT INTO reference_queue (counter_name, value_change)"
            " SELECT (g %% %s)::text, 1 FROM generate_series(1, %s) g",
            (keys, n),
        )
    elif variant in COLUMN:
        conn.execute(
            "INSERT INTO bench_keys_parent (id) SELECT generate_series(0, %s)", (keys - 1,)
        )
        target = pc.create_column_counter(COLUMN_COUNTER, "bench_keys_parent", "n").id
        _queue(conn, target, n, keys)
    else:
        if variant == "value index":
            conn.execute(
                f"CREATE INDEX {VALUE_INDEX} ON pgcounters.counters (target_id, value DESC)"
            )
        target = pc.create_counter(COUNTER, key=int).id
        _queue(conn, target, n, keys)
    conn.execute(
        "VACUUM ANALYZE reference_queue, reference_counters, bench_keys_parent, pgcounters.queue,"
        " pgcounters.counters"
    )
    conn.execute("CHECKPOINT")
    return target


def _loop(conn: Conn, statement: str, empty: str) -> int:
    """Run ``statement`` (one batch) in its own transaction until ``empty`` finds no row."""
    batches = 0
    while True:
        with conn.transaction():
            conn.execute(statement, (BATCH,))
        batches += 1
        if conn.execute(empty).fetchone() == (None,):
            return batches


def _drain(conn: Conn, variant: str) -> int:
    """Drain to the end; returns the batches run."""
    if variant == "reference-between":
        # the reference range is inclusive: p_limit + 1 ids
        return _loop(
            conn,
            "SELECT reference_apply_counter_queue(%s - 1)",
            "SELECT min(id) FROM reference_queue",
        )
    if variant == "between-claim":
        return _loop(
            conn, "SELECT reference_between_drain_batch(%s)", "SELECT min(id) FROM pgcounters.queue"
        )
    if variant == "textbook column":
        return _loop(
            conn,
            "SELECT reference_between_drain_column(%s)",
            "SELECT min(id) FROM pgcounters.queue",
        )
    if variant in ("fixed batches", "value index", "column fixed batches"):
        return Counters(conn).drain(BATCH, max_batch_size=BATCH).batches
    return Counters(conn).drain(BATCH).batches


def _totals(conn: Conn, variant: str, target: int) -> tuple[int, ...]:
    """(rows, min, max, sum) of the counter's values."""
    if variant == "reference-between":
        statement = "SELECT count(*), min(current_value), max(current_value), sum(current_value)"
        row = conn.execute(statement + " FROM reference_counters").fetchone()
    elif variant in COLUMN:
        row = conn.execute(
            "SELECT count(*), min(n), max(n), sum(n) FROM bench_keys_parent"
        ).fetchone()
    else:
        row = conn.execute(
            "SELECT count(*), min(value), max(value), sum(value) FROM pgcounters.counters"
            " WHERE target_id = %s",
            (target,),
        ).fetchone()
    assert row is not None
    return tuple(int(x or 0) for x in row)


def _hot_updates(conn: Conn, table: str) -> tuple[int, int]:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT coalesce(sum(n_tup_upd), 0), coalesce(sum(n_tup_hot_upd), 0)"
        " FROM pg_stat_user_tables WHERE relid = %s::regclass",
        (table,),
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def _table_of(variant: str) -> str:
    if variant == "reference-between":
        return "reference_counters"
    return "bench_keys_parent" if variant in COLUMN else "pgcounters.counters"


def _run(conn: Conn, variant: str, n: int, keys: int) -> Measurement:
    target = _fill(conn, variant, n, keys)
    table = _table_of(variant)
    conn.execute("SELECT pg_stat_force_next_flush()")
    updated, hot = _hot_updates(conn, table)
    started = time.perf_counter()
    batches = _drain(conn, variant)
    seconds = time.perf_counter() - started
    exact = _totals(conn, variant, target) == (keys, n // keys, n // keys, n)
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT 1")  # a transaction end: the statistics are flushed
    updated_after, hot_after = _hot_updates(conn, table)
    share = (hot_after - hot) / max(updated_after - updated, 1)
    return Measurement(
        seconds, n, exact, {"batches": float(batches), "heap-only updates %": round(100 * share)}
    )


def drain_keys(dsn: str, repeat: int, quick: bool) -> Scenario:
    n, key_counts = _size(quick)
    scenario = Scenario(
        "drain-keys",
        f"Drain {n:,} queued deltas of 1 over K distinct keys to the end, one transaction a "
        "batch; named counters and a counter column (a parent table of K rows). pgcounters: "
        f"batches of {BATCH:,}, a backlog in one batch of up to {MAX_BATCH_SIZE:,} (as the "
        f"worker drains). fixed batches: the same in batches of {BATCH:,}. value index: the "
        f"drain before (batches of {BATCH:,}, an index on the value, as named counters were "
        "stored before rank bands). column fixed batches: the column drain in batches of "
        f"{BATCH:,}. between-claim / textbook column: the textbook BETWEEN drain on the same "
        f"queue, batches of {BATCH:,}. Every total checked. Targets: at 100k keys >= 3x the "
        "drain in fixed batches (value index; column fixed batches), at 100k keys and more "
        ">= 1x the textbook drain.",
        unit="deltas",
        extra_aggregate="median",
    )
    with connect(dsn) as conn:
        _prepare(conn)
        for keys in key_counts:
            for i in range(repeat):
                # the order rotates from one repeat to the next
                order = VARIANTS[i % len(VARIANTS) :] + VARIANTS[: i % len(VARIANTS)]
                for variant in order:
                    scenario.add(f"{variant} {_label(keys)}", _run(conn, variant, n, keys))
        Counters(conn).drop_counter(COUNTER)
        Counters(conn).drop_counter(COLUMN_COUNTER)
        conn.execute(f"DROP INDEX IF EXISTS pgcounters.{VALUE_INDEX}")
        conn.execute("TRUNCATE reference_queue, reference_counters, pgcounters.queue")
        conn.execute("DROP TABLE bench_keys_parent CASCADE")
    comparisons: list[Comparison] = []
    for keys in key_counts:
        k = _label(keys)
        many = keys >= 100_000
        # 500,000 deltas over 100k keys: five deltas a key that one batch can sum (over
        # 500k keys each key has one delta, and no batch size writes fewer rows)
        backlog = keys == 100_000
        comparisons += [
            (f"pgcounters {k}", f"value index {k}", 3.0 if backlog else None),
            (f"pgcounters {k}", f"fixed batches {k}", None),
            (f"pgcounters {k}", f"between-claim {k}", 1.0 if many else None),
            (f"pgcounters {k}", f"reference-between {k}", None),
            (f"pgcounters column {k}", f"column fixed batches {k}", 3.0 if backlog else None),
            (f"pgcounters column {k}", f"textbook column {k}", 1.0 if many else None),
        ]
    scenario.compare(comparisons)
    headline = _label(100_000 if 100_000 in key_counts else key_counts[-1])
    scenario.headline = (f"pgcounters {headline}", f"value index {headline}")
    return scenario


# -- top-N of a named counter --------------------------------------------------------

TOP_VARIANTS = ("rank bands", "value index", "full sort")


def _top_fill(conn: Conn, keys: int) -> int:
    pc = Counters(conn)
    pc.drop_counter("bench.top")
    target = pc.create_counter("bench.top", key=int).id
    # a skewed distribution: value ~ 10^6 / rank, shuffled over the keys, with ties
    conn.execute(
        "INSERT INTO pgcounters.counters (target_id, key, value)"
        " SELECT %s, ARRAY[g::text], (1000000 / (1 + (g::bigint * 7919) %% %s))::bigint"
        "   FROM generate_series(1, %s) AS g",
        (target, keys, keys),
    )
    conn.execute("VACUUM ANALYZE pgcounters.counters")
    return target


def _timed(call: Callable[[], object], times: int) -> float:
    started = time.perf_counter()
    for _ in range(times):
        call()
    return time.perf_counter() - started


def top_named(dsn: str, repeat: int, quick: bool) -> Scenario:
    keys = 100_000 if quick else 1_000_000
    fast, slow = 300, 3
    scenario = Scenario(
        "top-named",
        f"Top 10 of a named counter with {keys:,} keys (skewed values, ties): rank bands "
        "(Counters.top) against ORDER BY value DESC, key through an index on the value (how "
        f"it was ranked before) and with no index ({fast} and {slow} queries a run). "
        "Target: >= 100x the full sort.",
        unit="queries",
    )
    with connect(dsn) as conn:
        install(conn)
        conn.execute(sqlfiles.read("reference_drain_keys.sql").encode())
        conn.execute(f"DROP INDEX IF EXISTS pgcounters.{VALUE_INDEX}")
        target = _top_fill(conn, keys)
        pc = Counters(conn)
        truth = [
            (int(k[0]), int(v))
            for k, v in conn.execute("SELECT * FROM reference_top_by_value(%s, 10)", (target,))
        ]

        def bands() -> list[tuple[int, int]]:
            return [(int(str(k[0])), v) for k, v in pc.top("bench.top", 10)]

        def by_value() -> list[tuple[int, int]]:
            rows = conn.execute(
                "SELECT * FROM reference_top_by_value(%s, 10)", (target,)
            ).fetchall()
            return [(int(k[0]), int(v)) for k, v in rows]

        for i in range(repeat):
            order = TOP_VARIANTS if i % 2 == 0 else TOP_VARIANTS[::-1]
            for variant in order:
                if variant == "value index":
                    conn.execute(
                        f"CREATE INDEX {VALUE_INDEX} ON pgcounters.counters (target_id, value DESC)"
                    )
                    conn.execute("ANALYZE pgcounters.counters")
                call = bands if variant == "rank bands" else by_value
                times = slow if variant == "full sort" else fast
                seconds = _timed(call, times)
                scenario.add(variant, Measurement(seconds, times, call() == truth))
                if variant == "value index":
                    conn.execute(f"DROP INDEX pgcounters.{VALUE_INDEX}")
        pc.drop_counter("bench.top")
        conn.execute("DROP TABLE bench_keys_parent CASCADE")
    scenario.compare([("rank bands", "full sort", 100.0), ("rank bands", "value index", None)])
    return scenario
