"""``range-read``: a 30-day range read of a counter per day against a single stored read.

Comments of 200 articles over 60 days are counted per article per day in Paris (a
counter per period, ``Bucket("created_at", "day", "Europe/Paris")``), drained, then one
comment more a day for the last 30 days is left pending. One client reads, one call
after the other:

* ``stored read (reference)``: ``Counters.get(name, key, exact=False)`` of a plain counter,
  one indexed row;
* ``exact read``: ``Counters.get(name, key)``, the stored value plus the pending deltas;
* ``30-day range``: ``Counters.get_range(name, key, first day, last day + 1)``, exact
  (30 stored values and their pending deltas) in one statement;
* ``30-day series``: ``Counters.get_series`` over the same days (30 values, zero-filled).

Target: the 30-day range within 2x the single stored read (ratio >= 0.5). Every read
is checked against the comments themselves.
"""

from __future__ import annotations

import datetime as dt
import time

from pgcounters import triggers
from pgcounters.client import Counters
from pgcounters.config import connect
from pgcounters.demos import sqlfiles
from pgcounters.demos.bench.report import Comparison, Measurement, Scenario
from pgcounters.schema import install
from pgcounters.specs import Bucket, CounterSpec, NamedTarget

ARTICLES = 200
DAYS = 60
RANGE = 30
PER_DAY = 3
UNTIL = dt.date(2026, 11, 20)
PER_DAY_COUNTER = "bench.range.comments_per_day"
PLAIN_COUNTER = "bench.range.comments"
VARIANTS = ("stored read (reference)", "exact read", "30-day range", "30-day series")
COMPARISONS: tuple[Comparison, ...] = (
    ("30-day range", "stored read (reference)", 0.5),
    ("30-day series", "stored read (reference)", None),
    ("exact read", "stored read (reference)", None),
)


def _q(name: str) -> str:
    return sqlfiles.named("bench_buckets.sql")[name]


def _specs() -> list[CounterSpec]:
    source = "public.bench_range_comment"
    return [
        CounterSpec(
            name=PER_DAY_COUNTER,
            source=source,
            keys=("article_id",),
            target=NamedTarget(("bigint",)),
            bucket=Bucket("created_at", "day", "Europe/Paris"),
        ),
        CounterSpec(
            name=PLAIN_COUNTER, source=source, keys=("article_id",), target=NamedTarget(("bigint",))
        ),
    ]


def prepare(dsn: str) -> None:
    """The table, its two counters, drained, and one comment a day of the range pending."""
    with connect(dsn) as conn:
        install(conn)
        for name in (PER_DAY_COUNTER, PLAIN_COUNTER):
            triggers.uninstall(conn, name, drop_values=True)
        conn.execute(_q("drop_table"))
        conn.execute(_q("create_table"))
        triggers.install(conn, _specs())
        conn.execute(
            _q("insert_comments"),
            {"articles": ARTICLES, "days": DAYS, "per_day": PER_DAY, "until": UNTIL},
        )
        Counters(conn).drain()
        conn.execute(
            _q("insert_comments"),
            {"articles": ARTICLES, "days": RANGE, "per_day": 1, "until": UNTIL},
        )
        # a planner with the statistics of empty tables takes any index: the reads are
        # measured as they run on a database autovacuum keeps analysed
        conn.execute(_q("analyze"))


def run_variant(dsn: str, variant: str, reads: int) -> Measurement:
    """``reads`` reads of one variant, each of another article; checked afterwards."""
    first, last = UNTIL - dt.timedelta(days=RANGE), UNTIL
    with connect(dsn) as conn:
        pc = Counters(conn)
        got: dict[int, int] = {}
        started = time.perf_counter()
        for i in range(reads):
            article = 1 + i % ARTICLES
            if variant == "stored read (reference)":
                got[article] = pc.get(PLAIN_COUNTER, article, exact=False)
            elif variant == "exact read":
                got[article] = pc.get(PLAIN_COUNTER, article)
            elif variant == "30-day range":
                got[article] = pc.get_range(PER_DAY_COUNTER, article, first, last)
            else:
                series = pc.get_series(PER_DAY_COUNTER, article, first, last)
                got[article] = sum(v for _, v in series) if len(series) == RANGE else -1
        seconds = time.perf_counter() - started
        exact = True
        for article, value in got.items():
            if variant == "stored read (reference)":
                exact = exact and value == DAYS * PER_DAY
                continue
            if variant == "exact read":
                exact = exact and value == DAYS * PER_DAY + RANGE
                continue
            row = conn.execute(
                _q("truth"), {"article": article, "first": first, "last": last}
            ).fetchone()
            exact = exact and row is not None and value == row[0] == RANGE * (PER_DAY + 1)
    return Measurement(seconds, reads, exact=exact)


def range_read(dsn: str, repeat: int, quick: bool) -> Scenario:
    reads = 500 if quick else 5000
    scenario = Scenario(
        "range-read",
        f"A counter per article per day (Paris), {ARTICLES} articles x {DAYS} days, one "
        f"comment a day pending over the last {RANGE}: {reads} exact {RANGE}-day range reads "
        "(one statement each) against as many single stored reads of a plain counter "
        "(target: within 2x, ratio >= 0.5), beside exact single reads and 30-day series.",
        unit="reads",
    )
    prepare(dsn)
    for _ in range(repeat):
        for variant in VARIANTS:
            scenario.add(variant, run_variant(dsn, variant, reads))
    scenario.compare(COMPARISONS)
    scenario.headline = ("30-day range", "stored read (reference)")
    return scenario
