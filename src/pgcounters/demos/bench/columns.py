"""Counter columns: the cost of their guard, and the online backfill against a recount.

``column-guard``: UPDATEs of parent rows that do not change their counters, on
a table whose counter column is guarded (two row triggers, ``UPDATE OF`` the
column with a condition) and on the same table without the guards. Two
shapes: an UPDATE that does not name the column (never fires the guard), and
Django's ``save()`` shape, ``SET title = ..., counter = counter`` (the guard's
condition is evaluated, no function runs). Target: at most 5% slower.

``backfill``: a counter over comments that already exist (every stored value
0), brought to the truth by the online backfill and, for comparison, by
``recount``; a writer updates random parent rows meanwhile, and the longest
time one of its updates took is compared with the longest batch. Target: the
backfill at recount speed or better.
"""

from __future__ import annotations

import threading
import time

import psycopg
from psycopg import sql

from pgcounters import backfill, triggers
from pgcounters.client import Counters
from pgcounters.config import connect
from pgcounters.connection import Conn
from pgcounters.demos.bench.report import Comparison, Measurement, Scenario
from pgcounters.repair import recount
from pgcounters.schema import install
from pgcounters.specs import ColumnTarget, CounterSpec, Fragment, Table

SCHEMA = "bench_columns"
NAME = "bench.columns.article.public_comments"
GUARD_VARIANTS = ("no guard", "guard", "no guard, save() shape", "guard, save() shape")
DRAIN_VARIANTS = ("drain, no guard", "drain, guard")
GUARD_COMPARISONS: tuple[Comparison, ...] = (
    # "costs at most 5%": time ratio >= 1 / 1.05
    ("guard", "no guard", 0.952),
    ("guard, save() shape", "no guard, save() shape", 0.952),
    # what pgcounters' own writer pays: the guard's function runs for each parent row
    ("drain, guard", "drain, no guard", None),
)
BACKFILL_COMPARISONS: tuple[Comparison, ...] = (("backfill", "recount", 1.0),)


def spec() -> CounterSpec:
    return CounterSpec(
        name=NAME,
        source=Table("comment", SCHEMA),
        keys=("article_id",),
        target=ColumnTarget(Table("article", SCHEMA), "public_comments"),
        where=Fragment("publish_status = %s", ("public",)),
    )


def cleanup(conn: Conn) -> None:
    triggers.uninstall(conn, NAME, drop_values=True)
    conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(SCHEMA)))


def prepare(conn: Conn, articles: int, comments: int) -> None:
    """Articles and comments written before the counter exists (two in three public)."""
    install(conn)
    cleanup(conn)
    s = sql.Identifier(SCHEMA)
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(s))
    conn.execute(
        sql.SQL(
            "CREATE TABLE {}.article (id bigint PRIMARY KEY, title text NOT NULL,"
            " public_comments bigint NOT NULL DEFAULT 0) WITH (fillfactor = 70)"
        ).format(s)
    )
    conn.execute(sql.SQL("CREATE INDEX ON {}.article (public_comments)").format(s))
    conn.execute(
        sql.SQL(
            "CREATE TABLE {}.comment (id bigserial PRIMARY KEY, article_id bigint,"
            " publish_status text NOT NULL)"
        ).format(s)
    )
    conn.execute(
        sql.SQL(
            "INSERT INTO {}.article SELECT g, 'a' || g, 0 FROM generate_series(1, %s) g"
        ).format(s),
        (articles,),
    )
    conn.execute(
        sql.SQL(
            "INSERT INTO {}.comment (article_id, publish_status)"
            " SELECT 1 + g %% %s, CASE WHEN g %% 3 = 0 THEN 'private' ELSE 'public' END"
            " FROM generate_series(1, %s) g"
        ).format(s),
        (articles, comments),
    )
    conn.execute(sql.SQL("CREATE INDEX ON {}.comment (article_id)").format(s))
    conn.execute(sql.SQL("VACUUM ANALYZE {}.article").format(s))
    conn.execute(sql.SQL("VACUUM ANALYZE {}.comment").format(s))


def _mismatches(conn: Conn) -> int:
    row = conn.execute(
        sql.SQL(
            "SELECT count(*) FROM {s}.article a LEFT JOIN (SELECT article_id, count(*) AS n"
            " FROM {s}.comment WHERE publish_status = 'public' GROUP BY article_id) t"
            " ON t.article_id = a.id WHERE a.public_comments <> coalesce(t.n, 0)"
        ).format(s=sql.Identifier(SCHEMA))
    ).fetchone()
    return int(row[0]) if row else -1


def _zero(conn: Conn) -> None:
    """Every stored value back to 0, as for a counter just added over existing rows."""
    with conn.transaction():
        conn.execute("SELECT set_config('pgcounters.applying', 'on', true)")
        conn.execute(
            sql.SQL("UPDATE {}.article SET public_comments = 0 WHERE public_comments <> 0").format(
                sql.Identifier(SCHEMA)
            )
        )
    conn.execute(sql.SQL("VACUUM ANALYZE {}.article").format(sql.Identifier(SCHEMA)))


# -- column-guard ---------------------------------------------------------------


def _guards(conn: Conn, on: bool) -> None:
    """Install the counter (its guards included), or drop the two guard triggers.

    Dropped, not disabled: a disabled row trigger still makes every UPDATE of the
    table fetch and lock the old row for it.
    """
    if on:
        triggers.install(conn, [spec()])
        return
    for t in triggers.installed(conn):
        if t.spec_name == NAME and t.event.startswith("guard"):
            conn.execute(
                sql.SQL("DROP TRIGGER {} ON {}").format(
                    sql.Identifier(t.trigger), sql.Identifier(t.schema, t.table)
                )
            )


def guard_run(conn: Conn, variant: str, articles: int, round_: int) -> Measurement:
    """Single-row UPDATEs of every article in one transaction, then the check."""
    _guards(conn, variant.startswith("guard"))
    conn.execute(sql.SQL("VACUUM {}.article").format(sql.Identifier(SCHEMA)))
    title = f"t{round_}"
    if variant.endswith("save() shape"):
        stmt = sql.SQL(
            "UPDATE {}.article SET title = %s, public_comments = public_comments WHERE id = %s"
        )
    else:
        stmt = sql.SQL("UPDATE {}.article SET title = %s WHERE id = %s")
    statement = stmt.format(sql.Identifier(SCHEMA))
    rows = [(title, i) for i in range(1, articles + 1)]
    started = time.perf_counter()
    with conn.transaction(), conn.cursor() as cur:
        cur.executemany(statement, rows)
    seconds = time.perf_counter() - started
    exact = _mismatches(conn) == 0
    return Measurement(seconds, articles, exact)


def drain_run(conn: Conn, variant: str, articles: int) -> Measurement:
    """Queue five public comments per article, then drain them (one delta per comment)."""
    _guards(conn, variant.endswith(", guard"))
    s = sql.Identifier(SCHEMA)
    deltas = articles * 5
    conn.execute(
        sql.SQL(
            "INSERT INTO {}.comment (article_id, publish_status)"
            " SELECT 1 + g %% %s, 'public' FROM generate_series(1, %s) AS g"
        ).format(s),
        (articles, deltas),
    )
    conn.execute(sql.SQL("VACUUM {}.article").format(s))
    started = time.perf_counter()
    Counters(conn).drain(100_000)
    seconds = time.perf_counter() - started
    return Measurement(seconds, deltas, _mismatches(conn) == 0)


def column_guard(dsn: str, repeat: int, quick: bool, *, articles: int | None = None) -> Scenario:
    articles = articles or (5_000 if quick else 20_000)
    scenario = Scenario(
        "column-guard",
        f"Single-row UPDATEs of {articles:,} parent rows (one transaction, pipelined) that "
        "do not change their counter column, with the column's guard triggers and without "
        "them: an UPDATE of the title only, and Django's save() shape (title = ..., "
        "counter = counter); and a drain of five deltas per article (pgcounters' own "
        "writer, which runs the guard's function per parent row). Target: the guard costs "
        "at most 5% on the UPDATEs.",
        unit="updates",
    )
    scenario.headline = ("guard, save() shape", "no guard, save() shape")
    with connect(dsn) as conn:
        prepare(conn, articles, articles * 3)
        triggers.install(conn, [spec()])
        for i in range(repeat):
            order = GUARD_VARIANTS[i % 4 :] + GUARD_VARIANTS[: i % 4]
            for variant in order:
                scenario.add(variant, guard_run(conn, variant, articles, i))
            for variant in DRAIN_VARIANTS[i % 2 :] + DRAIN_VARIANTS[: i % 2]:
                scenario.add(variant, drain_run(conn, variant, articles))
        cleanup(conn)
    scenario.compare(GUARD_COMPARISONS)
    return scenario


# -- backfill -------------------------------------------------------------------


class _Writer(threading.Thread):
    """Updates random articles' titles (autocommit) until stopped; keeps the longest wait."""

    def __init__(self, dsn: str, articles: int) -> None:
        super().__init__(daemon=True)
        self.dsn, self.articles = dsn, articles
        self.stop = threading.Event()
        self.longest = 0.0
        self.updates = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        import random

        rng = random.Random(7)
        statement = sql.SQL("UPDATE {}.article SET title = title WHERE id = %s").format(
            sql.Identifier(SCHEMA)
        )
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                while not self.stop.is_set():
                    started = time.perf_counter()
                    conn.execute(statement, (rng.randint(1, self.articles),))
                    self.longest = max(self.longest, time.perf_counter() - started)
                    self.updates += 1
        except BaseException as exc:  # reported by the run
            self.error = exc


def backfill_run(conn: Conn, dsn: str, variant: str, articles: int, batch: int) -> Measurement:
    _zero(conn)
    with conn.transaction():
        backfill.request(conn, spec())
    batches: list[float] = []
    last = [time.perf_counter()]

    def tick(*_: object) -> None:
        now = time.perf_counter()
        batches.append(now - last[0])
        last[0] = now

    writer = _Writer(dsn, articles)
    writer.start()
    started = time.perf_counter()
    last[0] = started
    if variant == "backfill":
        backfill.run(conn, [NAME], batch_size=batch, progress=tick)
    else:
        with conn.transaction():
            backfill.cancel(conn, NAME)
        recount(conn, spec(), batch_size=batch, resume=False, progress=tick)
    seconds = time.perf_counter() - started
    writer.stop.set()
    writer.join()
    if writer.error is not None:
        raise writer.error
    exact = _mismatches(conn) == 0 and not backfill.pending(conn)
    return Measurement(
        seconds,
        articles,
        exact,
        {
            "longest batch ms": max(batches, default=0.0) * 1000,
            "longest writer update ms": writer.longest * 1000,
            "writer updates": float(writer.updates),
        },
    )


def backfill_scenario(
    dsn: str,
    repeat: int,
    quick: bool,
    *,
    comments: int | None = None,
    batch: int = 1000,
) -> Scenario:
    comments = comments or (100_000 if quick else 1_000_000)
    articles = max(comments // 50, 1)
    scenario = Scenario(
        "backfill",
        f"A counter added over {comments:,} existing comments on {articles:,} articles "
        f"(every stored value 0), brought to the truth in batches of {batch} keys by the "
        "online backfill and by recount, while a writer updates random articles. Target: "
        "the backfill at recount speed or better; no writer update waits longer than "
        "about one batch.",
        unit="keys",
        extra_aggregate="median",
    )
    scenario.headline = ("backfill", "recount")
    with connect(dsn) as conn:
        prepare(conn, articles, comments)
        triggers.install(conn, [spec()], backfill=False)
        with conn.transaction():
            backfill.cancel(conn, NAME)
        for i in range(repeat):
            for variant in ("backfill", "recount") if i % 2 == 0 else ("recount", "backfill"):
                scenario.add(variant, backfill_run(conn, dsn, variant, articles, batch))
        cleanup(conn)
    scenario.compare(BACKFILL_COMPARISONS)
    return scenario
