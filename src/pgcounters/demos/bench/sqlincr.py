"""``sql-increment``: the SQL increment against the INSERT it performs, with pgbench.

Seed 004's hot counters, sent from SQL by separate client processes (pgbench, 10
clients x N transactions, prepared statements, one increment a transaction) over 10
keys:

* ``update (reference)``: the textbook ``UPDATE counters SET value = value + 1``;
* ``reference queue`` / ``reference unlogged queue``: the reference technique's INSERT into
  its own queues;
* ``INSERT queued`` / ``INSERT unlogged``: the INSERT that ``pgcounters.incr`` performs,
  written by hand (the counter's id known, the key in canonical form);
* ``function INSERT queued`` / ``function INSERT unlogged``: the same INSERT from inside
  a PL/pgSQL function called with ``SELECT``, the counter's id given: what any SQL function
  that queues an increment costs at the least, before it looks anything up;
* ``incr queued`` / ``incr unlogged``: ``SELECT pgcounters.incr(name, key, 1)``.

Target: each ``incr`` within 5% of its INSERT (ratio >= 0.95). The ``function INSERT``
variants show, in the same run, how much of that 5% the call alone takes. Each run starts
from empty queues and zeroed values (not timed); afterwards the rows written are checked
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
    "function INSERT queued",
    "incr queued",
    "INSERT unlogged",
    "function INSERT unlogged",
    "incr unlogged",
)
COMPARISONS: tuple[Comparison, ...] = (
    ("incr queued", "INSERT queued", 0.95),
    ("incr unlogged", "INSERT unlogged", 0.95),
    ("function INSERT queued", "INSERT queued", None),
    ("function INSERT unlogged", "INSERT unlogged", None),
    ("incr queued", "function INSERT queued", None),
    ("incr unlogged", "function INSERT unlogged", None),
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
    per_client = 200 if quick else 5000
    scenario = Scenario(
        "sql-increment",
        f"Seed 004's hot counters from SQL: pgbench, {CLIENTS} client processes x "
        f"{per_client} transactions (prepared statements), one increment each, {KEYS} keys. "
        "The SQL increment (pgcounters.incr) against the INSERT it performs "
        "(target: within 5%, ratio >= 0.95) and against that INSERT made by a PL/pgSQL "
        "function given the counter's id (the cost of the call alone), beside the reference "
        "UPDATE and queues.",
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
        conn.execute(_q("enqueue_function"))
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
        conn.execute(_q("drop_enqueue_function"))
    scenario.compare(COMPARISONS)
    scenario.headline = ("incr queued", "INSERT queued")
    return scenario
