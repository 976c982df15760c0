"""``sql-increment``: the SQL increment against the INSERT it performs, with pgbench.

Seed 004's hot counters, sent from SQL by separate client processes (pgbench, 10
clients x N transactions, prepared statements, one increment a transaction) over 10
keys:

* ``update (reference)``: the textbook ``UPDATE counters SET value = value + 1``;
* ``reference queue`` / ``reference unlogged queue``: the reference technique's INSERT into
  its own queues;
* ``INSERT queued`` / ``INSERT unlogged``: the INSERT that ``pgcounters.incr`` performs,
  written by hand (the counter's id known, the key in canonical form);
* ``incr queued`` / ``incr unlogged``: ``SELECT pgcounters.incr(name, key, 1)``.

Target: each ``incr`` within 5% of its INSERT (ratio >= 0.95). Each run starts from
empty queues and zeroed values (not timed); afterwards the rows written are checked
against the transactions pgbench reports.
"""

from __future__ import annotations

from psycopg import sql

from pgcounters.client import Counters
from pgcounters.config import connect
from pgcounters.connection import Conn
from pgcounters.demos import sqlfiles, workloads
from pgcounters.demos.bench import pgbench
from pgcounters.demos.bench.report import Comparison, Measurement, Scenario

CLIENTS = 10
KEYS = 10
VARIANTS = (
    "update (reference)",
    "reference queue",
    "reference unlogged queue",
    "INSERT queued",
    "incr queued",
    "INSERT unlogged",
    "incr unlogged",
)
COMPARISONS: tuple[Comparison, ...] = (
    ("incr queued", "INSERT queued", 0.95),
    ("incr unlogged", "INSERT unlogged", 0.95),
    ("incr queued", "update (reference)", None),
    ("incr unlogged", "update (reference)", None),
    ("reference queue", "update (reference)", None),
    ("reference unlogged queue", "update (reference)", None),
)


def _q(name: str) -> str:
    return sqlfiles.named("bench_writes.sql")[name]


def _script(variant: str) -> str:
    name = "pgbench_" + variant.removesuffix(" (reference)").replace(" ", "_").lower()
    return _q(name) + ";\n"


def _written(conn: Conn, variant: str, ids: dict[str, int]) -> int:
    """The increments the variant's run left behind (rows, or the sum of the values)."""
    query: sql.Composable
    params: dict[str, int] = {}
    if variant == "update (reference)":
        query = sql.SQL(_q("updated"))
    elif variant.startswith("reference"):
        table = "reference_queue" if variant == "reference queue" else "reference_queue_unlogged"
        query = sql.SQL(_q("reference_queued")).format(table=sql.Identifier(table))
    else:
        mode = variant.split()[-1]
        queue = "queue" if mode == "queued" else "queue_unlogged"
        query = sql.SQL(_q("queued")).format(table=sql.Identifier("pgcounters", queue))
        params = {"target": ids[mode]}
    row = conn.execute(query, params).fetchone()
    return int(row[0]) if row else 0


def sql_increment(dsn: str, repeat: int, quick: bool) -> Scenario:
    per_client = 200 if quick else 1000
    scenario = Scenario(
        "sql-increment",
        f"Seed 004's hot counters from SQL: pgbench, {CLIENTS} client processes x "
        f"{per_client} transactions (prepared statements), one increment each, {KEYS} keys. "
        "The SQL increment (pgcounters.incr) against the INSERT it performs "
        "(target: within 5%, ratio >= 0.95), beside the reference UPDATE and queues.",
        unit="increments",
    )
    binary = pgbench.find()
    if binary is None:
        scenario.description += " " + pgbench.MISSING
        return scenario
    workloads.prepare(dsn, KEYS)
    with connect(dsn) as conn:
        pc = Counters(conn)
        ids = {mode: pc.counter(f"bench.{mode}").id for mode in ("queued", "unlogged")}
        for _ in range(repeat):
            for variant in VARIANTS:
                conn.execute(_q("reset_increments"))
                result = pgbench.run(
                    binary,
                    dsn,
                    _script(variant),
                    clients=CLIENTS,
                    transactions=per_client,
                    defines={k: str(v) for k, v in ids.items()},
                )
                written = _written(conn, variant, ids)
                scenario.add(
                    variant,
                    Measurement(
                        result.seconds,
                        result.transactions,
                        exact=written == result.transactions == CLIENTS * per_client,
                    ),
                )
        conn.execute(_q("reset_increments"))
    scenario.compare(COMPARISONS)
    scenario.headline = ("incr queued", "INSERT queued")
    return scenario
