"""The reference blog: trigger overhead, top-N by a counter, exact reads.

All three run on the reference blog (``sql/reference_blog.sql``, schema ``reference_blog``):
users, articles and comments with a ``publish_status``, as Django creates the
tables. Two counters are declared the pgcounters way, as :class:`CounterSpec`
objects installed with :func:`pgcounters.triggers.install`: public comments per
article and per user, kept in the ``total_public_comments`` column of each.

``trigger-overhead``: one bulk ``INSERT ... SELECT`` of N comments (100k; 20k
with ``--quick``), two in three public, into a comment table (the indexes
Django creates; then again with its deferred foreign keys, variants ``+fk``) with

* ``no counters`` (``blog_comment_plain``);
* ``row trigger (reference)``: the reference row-level trigger, two queue INSERTs per
  public comment (``blog_comment``);
* ``pgcounters``: pgcounters' statement-level triggers for the two counters,
  queued mode (``blog_comment_pgc``): one delta per article and per user.

Each run starts from empty tables and zeroed counters (not timed); the timed
part is the INSERT and its COMMIT. Afterwards both queues are drained (not
timed) and every article's and user's count is compared with the comments.

``top-n``: N comments (1M; 100k with ``--quick``) skewed over 10,000 articles,
counted by pgcounters and drained; then the top 10 articles by public comments
the Django ``annotate(Count(..., filter=Q(...)))`` way (its SQL, see
``sql/bench_blog.sql``) against the counter column with an index. Both must
return the same ten articles with the same counts.

``exact-read``: articles with stored counts, then P pending deltas (100k; 10k
with ``--quick``) over 10 hot articles. Reads of the hot articles' counts:
stored only, exact (stored + pending, one statement), through
:meth:`Counters.get` (the counter column) and :meth:`Counters.get_many` (the
same count in a named counter, 10 keys a statement), and the naive
``count(*)`` of the comments. Every value read is checked.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence

from psycopg import sql

from pgcounters import triggers
from pgcounters.client import Counters
from pgcounters.config import connect
from pgcounters.connection import Conn
from pgcounters.demos import sqlfiles
from pgcounters.demos.bench.report import Comparison, Measurement, Scenario
from pgcounters.schema import install
from pgcounters.specs import ColumnTarget, CounterSpec, Fragment, NamedTarget, Table

SCHEMA = "reference_blog"
PLAIN, REFERENCE, PGC = "blog_comment_plain", "blog_comment", "blog_comment_pgc"
ARTICLE_COUNTER = "bench.blog.article.public_comments"
USER_COUNTER = "bench.blog.user.public_comments"
NAMED_COUNTER = "bench.blog.article.public_named"
PUBLIC = Fragment("publish_status = %s", ("public",))

TRIGGER_VARIANTS = ("no counters", "row trigger (reference)", "pgcounters")
TRIGGER_TABLES = dict(zip(TRIGGER_VARIANTS, (PLAIN, REFERENCE, PGC), strict=True))
FK = " +fk"  # suffix of the variants run with Django's foreign key constraints
TRIGGER_COMPARISONS: tuple[Comparison, ...] = tuple(
    c
    for shape in ("", FK)
    for c in (
        (f"pgcounters{shape}", f"row trigger (reference){shape}", 3.0),
        # "costs at most 1.25x the insert with no counters": time ratio >= 1 / 1.25
        (f"pgcounters{shape}", f"no counters{shape}", 0.8),
        (f"row trigger (reference){shape}", f"no counters{shape}", None),
    )
)
TOP_VARIANTS = ("annotate(Count) (reference)", "counter column")
TOP_COMPARISONS: tuple[Comparison, ...] = (
    ("counter column", "annotate(Count) (reference)", 100.0),
)
READ_VARIANTS = ("stored", "exact", "stored get_many", "exact get_many", "count(*) (reference)")
READ_COMPARISONS: tuple[Comparison, ...] = (
    # "exact read ... <= 2x a stored-only read": time ratio >= 0.5
    ("exact", "stored", 0.5),
    ("exact get_many", "stored get_many", 0.5),
    ("exact", "count(*) (reference)", None),
    ("stored", "count(*) (reference)", None),
)


def q(name: str, comments: str | None = None) -> sql.Composed:
    """A statement of ``sql/bench_blog.sql``, its ``{comments}`` table filled in."""
    text = sqlfiles.named("bench_blog.sql")[name]
    table = sql.Identifier(SCHEMA, comments or PGC)
    return sql.SQL(text).format(comments=table)


def specs(named: bool = False) -> list[CounterSpec]:
    """The two counters of the reference blog, declared on the pgcounters comment table."""
    source = Table(PGC, SCHEMA)
    out = [
        CounterSpec(
            name=ARTICLE_COUNTER,
            source=source,
            keys=("article_id",),
            target=ColumnTarget(Table("blog_article", SCHEMA), "total_public_comments"),
            where=PUBLIC,
        ),
        CounterSpec(
            name=USER_COUNTER,
            source=source,
            keys=("creator_id",),
            target=ColumnTarget(Table("blog_user", SCHEMA), "total_public_comments"),
            where=PUBLIC,
        ),
    ]
    if named:
        out.append(
            CounterSpec(
                name=NAMED_COUNTER,
                source=source,
                keys=("article_id",),
                target=NamedTarget(("bigint",)),
                where=PUBLIC,
            )
        )
    return out


def cleanup(conn: Conn) -> None:
    """Remove the benchmark's counters and the reference blog schema."""
    for name in (ARTICLE_COUNTER, USER_COUNTER, NAMED_COUNTER):
        triggers.uninstall(conn, name, drop_values=True)
    conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(SCHEMA)))


def prepare(conn: Conn, users: int, articles: int, *, named: bool = False) -> None:
    """The reference blog with ``users`` and ``articles``, pgcounters' triggers installed."""
    install(conn)
    cleanup(conn)
    conn.execute(sqlfiles.read("reference_blog.sql").encode())
    conn.execute(q("create_users"), {"n": users})
    conn.execute(q("create_articles"), {"n": articles})
    triggers.install(conn, specs(named))
    # the reference technique writes the same counter columns, which pgcounters now
    # guards: its statements run as one of pgcounters' writers (the guard's condition
    # is then false, and no function runs)
    conn.execute("SELECT set_config('pgcounters.applying', 'on', false)")


def mismatches(conn: Conn, comments: str) -> int:
    """Articles and users whose counter column differs from their public comments."""
    total = 0
    for name in ("article_mismatches", "user_mismatches"):
        row = conn.execute(q(name, comments)).fetchone()
        assert row is not None
        total += int(row[0])
    return total


def drain_reference(conn: Conn, limit: int = 10_000) -> None:
    """Run the reference queue function until its queue is empty."""
    while conn.execute(q("reference_pending_tasks")).fetchone() != (0,):
        conn.execute(q("reference_process_tasks"), {"limit": limit})


def _vacuum(conn: Conn, *tables: str) -> None:
    for table in tables:
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(SCHEMA, table)))
    conn.execute("VACUUM ANALYZE pgcounters.queue")


# -- trigger-overhead ---------------------------------------------------------------


def _reset_trigger_run(conn: Conn) -> None:
    # TRUNCATE of the pgcounters table resets its counters (its truncate trigger)
    conn.execute(
        sql.SQL("TRUNCATE {}").format(
            sql.SQL(", ").join(
                sql.Identifier(SCHEMA, t) for t in (PLAIN, REFERENCE, PGC, "counting_task")
            )
        )
    )
    conn.execute(q("reset_article_counts"))
    conn.execute(q("reset_user_counts"))
    _vacuum(conn, "blog_article", "blog_user", PLAIN, REFERENCE, PGC, "counting_task")
    conn.execute("CHECKPOINT")


def trigger_run(conn: Conn, variant: str, rows: int, users: int, articles: int) -> Measurement:
    """One bulk insert of ``rows`` comments into the variant's table, then the check."""
    table = TRIGGER_TABLES[variant.removesuffix(FK)]
    _reset_trigger_run(conn)
    params = {"users": users, "articles": articles, "first": 1, "last": rows}
    started = time.perf_counter()
    conn.execute(q("insert_comments", table), params)  # autocommit: INSERT and COMMIT
    seconds = time.perf_counter() - started
    queued = 0
    if table == REFERENCE:
        row = conn.execute(q("reference_pending_tasks")).fetchone()
        queued = int(row[0]) if row else 0
        drain_reference(conn)
    elif table == PGC:
        queued = Counters(conn).pending()[0]
        Counters(conn).drain(100_000)
    if table == PLAIN:  # nothing counted: every row is there
        exact = conn.execute(q("count_rows", table)).fetchone() == (rows,)
    else:
        exact = mismatches(conn, table) == 0
    return Measurement(seconds, rows, exact, {"queued deltas": float(queued)})


def trigger_overhead(dsn: str, repeat: int, quick: bool, *, rows: int | None = None) -> Scenario:
    rows = rows or (20_000 if quick else 100_000)
    users, articles = 1000, 1000
    scenario = Scenario(
        "trigger-overhead",
        f"The reference blog: one bulk INSERT of {rows:,} comments (two in three public, over "
        f"{articles:,} articles and {users:,} users) with no counters, with the reference "
        "row-level trigger, and with pgcounters' statement-level triggers for two counters "
        "(public comments per article and per user); the tables have the indexes Django "
        f"creates, then (variants '{FK.strip()}') also its deferred foreign key constraints. "
        "Targets: pgcounters <= 1.25x the insert with no counters, >= 3x faster "
        "than the row-level trigger.",
        unit="rows",
        extra_aggregate="median",
    )
    scenario.headline = ("pgcounters", "row trigger (reference)")
    with connect(dsn) as conn:
        prepare(conn, users, articles)
        for shape in ("", FK):
            if shape:
                for table in TRIGGER_TABLES.values():
                    conn.execute(q("add_foreign_keys", table))
            for i in range(repeat):
                # the order rotates from one repeat to the next
                order = TRIGGER_VARIANTS[i % 3 :] + TRIGGER_VARIANTS[: i % 3]
                for variant in order:
                    measured = trigger_run(conn, variant, rows, users, articles)
                    scenario.add(variant + shape, measured)
        cleanup(conn)
    scenario.compare(TRIGGER_COMPARISONS)
    return scenario


# -- top-n ------------------------------------------------------------------------


def _top(conn: Conn, name: str, n: int = 10) -> list[tuple[int, int]]:
    rows = conn.execute(q(name), {"n": n}).fetchall()
    return [(int(r[0]), int(r[-1])) for r in rows]


def _timed(call: Callable[[], object], times: int) -> float:
    started = time.perf_counter()
    for _ in range(times):
        call()
    return time.perf_counter() - started


def top_n(
    dsn: str, repeat: int, quick: bool, *, rows: int | None = None, articles: int = 10_000
) -> Scenario:
    rows = rows or (100_000 if quick else 1_000_000)
    slow_queries, fast_queries = 3, 300
    scenario = Scenario(
        "top-n",
        f"Top 10 of {articles:,} articles by public comments over {rows:,} comments: the SQL of "
        "Django's annotate(n=Count('comments', filter=Q(comments__publish_status='public')))"
        ".order_by('-n', 'pk')[:10] against the counter column kept by pgcounters, with an "
        f"index ({slow_queries} and {fast_queries} queries a run). Target: >= 100x.",
        unit="queries",
    )
    scenario.headline = ("counter column", "annotate(Count) (reference)")
    with connect(dsn) as conn:
        prepare(conn, 1000, articles)
        step = 100_000  # one statement per step keeps each transition table small
        for first in range(1, rows + 1, step):
            last = min(rows, first + step - 1)
            conn.execute(
                q("insert_skewed_comments"),
                {"users": 1000, "articles": articles, "first": first, "last": last},
            )
        Counters(conn).drain(100_000)
        conn.execute(q("top_column_index"))
        _vacuum(conn, "blog_article", "blog_user", PGC)
        for i in range(repeat):
            order = TOP_VARIANTS if i % 2 == 0 else TOP_VARIANTS[::-1]
            for variant in order:
                name = "top_column" if variant == "counter column" else "top_annotate"
                times = fast_queries if variant == "counter column" else slow_queries
                seconds = _timed(functools.partial(_top, conn, name), times)
                exact = _top(conn, name) == _top(conn, "top_annotate")
                scenario.add(variant, Measurement(seconds, times, exact))
        cleanup(conn)
    scenario.compare(TOP_COMPARISONS)
    return scenario


# -- exact-read -------------------------------------------------------------------


def _count_public(conn: Conn, article: int) -> int:
    row = conn.execute(q("count_public"), {"id": article}).fetchone()
    return int(row[0]) if row else 0


def exact_read(
    dsn: str,
    repeat: int,
    quick: bool,
    *,
    pending: int | None = None,
    base: int | None = None,
    reads: int | None = None,
) -> Scenario:
    pending = pending or (10_000 if quick else 100_000)
    base = base or (20_000 if quick else 100_000)
    reads = reads or (300 if quick else 1000)
    hot, articles = 10, 1000
    scenario = Scenario(
        "exact-read",
        f"{base:,} comments counted and drained over {articles:,} articles, then {pending:,} "
        f"pending deltas (+1 each) over {hot} hot articles; {reads:,} reads of the hot "
        "articles' public comments: stored only vs exact (stored + pending, one statement) "
        "through Counters.get (the counter column) and Counters.get_many (a named counter, "
        f"{hot} keys a statement), and the naive count(*) ({reads // 5:,} reads). "
        "Target: an exact read <= 2x a stored-only read.",
        unit="reads",
    )
    scenario.headline = ("exact", "stored")
    keys = list(range(1, hot + 1))
    with connect(dsn) as conn:
        prepare(conn, 1000, articles, named=True)
        conn.execute(
            q("insert_comments"), {"users": 1000, "articles": articles, "first": 1, "last": base}
        )
        pc = Counters(conn)
        pc.drain(100_000)
        stored = [_count_public(conn, k) for k in keys]
        # the pending comments: inserted with counting paused, their deltas queued as
        # single-row inserts would leave them (one +1 per comment and counter)
        params = {"users": 1000, "hot": hot, "first": base + 1, "last": base + pending}
        with triggers.paused(conn):
            conn.execute(q("insert_hot_comments"), params)
        for name in (ARTICLE_COUNTER, NAMED_COUNTER):
            conn.execute(q("enqueue_hot_deltas"), {**params, "target": pc.counter(name).id})
        _vacuum(conn, "blog_article", PGC)
        truth = [_count_public(conn, k) for k in keys]
        assert pc.pending()[0] == 2 * pending

        def by_get(exact: bool) -> Callable[[], list[int]]:
            return lambda: [pc.get(ARTICLE_COUNTER, k, exact=exact) for k in keys]

        def by_many(exact: bool) -> Callable[[], list[int]]:
            return lambda: pc.get_many(NAMED_COUNTER, keys, exact=exact)

        readers: dict[str, tuple[Callable[[], list[int]], list[int], int]] = {
            "stored": (by_get(False), stored, reads),
            "exact": (by_get(True), truth, reads),
            "stored get_many": (by_many(False), stored, reads),
            "exact get_many": (by_many(True), truth, reads),
            "count(*) (reference)": (
                lambda: [_count_public(conn, k) for k in keys],
                truth,
                reads // 5,
            ),
        }
        for i in range(repeat):
            order: Sequence[str] = READ_VARIANTS if i % 2 == 0 else READ_VARIANTS[::-1]
            for variant in order:
                read, expected, count = readers[variant]
                rounds = max(1, count // hot)
                results: list[list[int]] = []
                started = time.perf_counter()
                for _ in range(rounds):
                    results.append(read())
                seconds = time.perf_counter() - started
                exact = all(r == expected for r in results)
                scenario.add(variant, Measurement(seconds, rounds * hot, exact))
        assert pc.pending()[0] == 2 * pending  # reads changed nothing
        cleanup(conn)
    scenario.compare(READ_COMPARISONS)
    return scenario
