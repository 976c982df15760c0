"""Counters through a path: the cost of counting rows of a grandchild per ancestor.

``path-insert``: one bulk INSERT of comments (two in three public) over articles
of authors, with no counters, and with pgcounters' counter of public comments of
published articles per author (``Author <- Article <- Comment``, two levels, queued
mode): the comments' statement-level trigger joins the new rows with the articles
and writes one delta per author. The tables have the indexes and foreign keys
Django creates. Target: at most 1.5x the insert with no counters.
"""

from __future__ import annotations

import time

from psycopg import sql

from pgcounters import triggers
from pgcounters.client import Counters
from pgcounters.config import connect
from pgcounters.connection import Conn
from pgcounters.demos.bench.report import Comparison, Measurement, Scenario
from pgcounters.schema import install
from pgcounters.specs import ColumnTarget, CounterSpec, Fragment, Table, Via

SCHEMA = "bench_paths"
NAME = "bench.paths.author.public_comments"
VARIANTS = ("no counters", "two-level path")
COMPARISONS: tuple[Comparison, ...] = (
    # "costs at most 1.5x": time ratio >= 1 / 1.5
    ("two-level path", "no counters", 0.667),
)


def spec() -> CounterSpec:
    return CounterSpec(
        name=NAME,
        source=Table("comment", SCHEMA),
        keys=("author_id",),
        via=(
            Via(Table("article", SCHEMA), link="article_id", where=Fragment('"article".published')),
        ),
        target=ColumnTarget(Table("author", SCHEMA), "public_comments"),
        where=Fragment('"comment".publish_status = %s', ("public",)),
    )


def cleanup(conn: Conn) -> None:
    triggers.uninstall(conn, NAME, drop_values=True)
    conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(SCHEMA)))


def prepare(conn: Conn, authors: int, articles: int) -> None:
    install(conn)
    cleanup(conn)
    s = sql.Identifier(SCHEMA)
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(s))
    conn.execute(
        sql.SQL(
            "CREATE TABLE {}.author (id bigint PRIMARY KEY,"
            " public_comments bigint NOT NULL DEFAULT 0)"
        ).format(s)
    )
    conn.execute(
        sql.SQL(
            "CREATE TABLE {s}.article (id bigint PRIMARY KEY,"
            " author_id bigint REFERENCES {s}.author DEFERRABLE INITIALLY DEFERRED,"
            " published boolean NOT NULL)"
        ).format(s=s)
    )
    conn.execute(sql.SQL("CREATE INDEX ON {}.article (author_id)").format(s))
    for table in ("comment", "comment_plain"):
        t = sql.Identifier(table)
        conn.execute(
            sql.SQL(
                "CREATE TABLE {s}.{t} (id bigserial PRIMARY KEY,"
                " article_id bigint REFERENCES {s}.article DEFERRABLE INITIALLY DEFERRED,"
                " publish_status text NOT NULL)"
            ).format(s=s, t=t)
        )
        conn.execute(sql.SQL("CREATE INDEX ON {}.{} (article_id)").format(s, t))
    conn.execute(
        sql.SQL("INSERT INTO {}.author (id) SELECT g FROM generate_series(1, %s) g").format(s),
        (authors,),
    )
    conn.execute(
        sql.SQL(
            "INSERT INTO {}.article SELECT g, 1 + g %% %s, g %% 4 <> 0"
            " FROM generate_series(1, %s) g"
        ).format(s),
        (authors, articles),
    )
    triggers.install(conn, [spec()])
    conn.execute(sql.SQL("VACUUM ANALYZE {}.author").format(s))
    conn.execute(sql.SQL("VACUUM ANALYZE {}.article").format(s))


def _mismatches(conn: Conn) -> int:
    row = conn.execute(
        sql.SQL(
            "SELECT count(*) FROM {s}.author u LEFT JOIN (SELECT a.author_id, count(*) AS n"
            " FROM {s}.comment c JOIN {s}.article a ON a.id = c.article_id"
            " WHERE c.publish_status = 'public' AND a.published GROUP BY a.author_id) t"
            " ON t.author_id = u.id WHERE u.public_comments <> coalesce(t.n, 0)"
        ).format(s=sql.Identifier(SCHEMA))
    ).fetchone()
    return int(row[0]) if row else -1


def run(conn: Conn, variant: str, rows: int, articles: int) -> Measurement:
    """One INSERT of ``rows`` comments in one transaction (its foreign keys checked at the
    commit, inside the measure), into the counted table or the one without counters."""
    s = sql.Identifier(SCHEMA)
    table = sql.Identifier("comment" if variant == "two-level path" else "comment_plain")
    conn.execute(sql.SQL("TRUNCATE {}.{}").format(s, table))
    Counters(conn).drain()
    conn.execute(sql.SQL("VACUUM ANALYZE {}.{}").format(s, table))
    statement = sql.SQL(
        "INSERT INTO {}.{} (article_id, publish_status)"
        " SELECT 1 + g %% %s, CASE WHEN g %% 3 = 0 THEN 'private' ELSE 'public' END"
        " FROM generate_series(1, %s) g"
    ).format(s, table)
    started = time.perf_counter()
    with conn.transaction():
        conn.execute(statement, (articles, rows))
    seconds = time.perf_counter() - started
    exact = True
    if variant == "two-level path":
        Counters(conn).drain()
        exact = _mismatches(conn) == 0
    return Measurement(seconds, rows, exact)


def path_insert(
    dsn: str, repeat: int, quick: bool, *, rows: int | None = None, articles: int = 10_000
) -> Scenario:
    rows = rows or 100_000
    authors = max(articles // 10, 1)
    scenario = Scenario(
        "path-insert",
        f"One bulk INSERT of {rows:,} comments (two in three public) over {articles:,} "
        f"articles of {authors:,} authors, with no counters, and with a counter of the public "
        "comments of published articles per author, kept through the two-level path "
        "author <- article <- comment (queued mode; the trigger joins the new comments with "
        "their articles and writes one delta per author). Target: at most 1.5x the insert "
        "with no counters.",
        unit="rows",
    )
    scenario.headline = ("two-level path", "no counters")
    with connect(dsn) as conn:
        prepare(conn, authors, articles)
        for i in range(repeat):
            for variant in VARIANTS[i % 2 :] + VARIANTS[: i % 2]:
                scenario.add(variant, run(conn, variant, rows, articles))
        cleanup(conn)
    scenario.compare(COMPARISONS)
    return scenario
