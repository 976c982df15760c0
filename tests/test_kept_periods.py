"""A counter per period that keeps N periods reads 0 for an older period from the moment it
leaves, whatever the retention and the drain have done yet: every read path (the client's
get, get_many, their decimal and stored forms, top, the range reads, the async client, and
the SQL functions), before a drain, after it, and after a late change to an old row was
drained once the retention had deleted that period's value. Judged against the rows the
test wrote, counted by hand."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections import Counter as Tally
from decimal import Decimal
from zoneinfo import ZoneInfo

import psycopg
import pytest

from pgcounters import AsyncCounters, Bucket, Counters, CounterSpec, NamedTarget, sqlfiles, triggers
from pgcounters.connection import Conn
from pgcounters.keys import Key
from support import set_database_clock

PARIS = ZoneInfo("Europe/Paris")
NOW = dt.datetime(2026, 11, 20, 12, tzinfo=PARIS)  # the database's clock
TODAY = NOW.date()
KEEP = 7
FIRST_KEPT = TODAY - dt.timedelta(days=KEEP - 1)  # 14 November: today and the 6 before
OLD = TODAY - dt.timedelta(days=30)
# rows written: (article, days before today) -> how many
WRITTEN = {
    (1, 30): 2,  # expired long ago
    (1, 7): 1,  # the day before the first one kept: expired
    (1, 6): 1,  # the first day kept
    (1, 0): 3,
    (2, 30): 4,
    (2, 1): 5,
    (3, 0): 5,  # ties with (2, yesterday)
}


def _day(days_before: int) -> dt.date:
    return TODAY - dt.timedelta(days=days_before)


def _install(conn: Conn, mode: str) -> None:
    conn.execute(
        "CREATE TABLE comment (id bigserial PRIMARY KEY, article_id bigint NOT NULL,"
        " created_at timestamptz NOT NULL)"
    )
    spec = CounterSpec(
        name="per_day",
        source="comment",
        keys=("article_id",),
        target=NamedTarget(("bigint",)),
        mode=mode,  # type: ignore[arg-type]
        bucket=Bucket("created_at", "day", "Europe/Paris", keep=KEEP),
    )
    triggers.install(conn, [spec])
    set_database_clock(conn, NOW)  # the clock of every session of the database
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO comment (article_id, created_at) VALUES (%s, %s)",
            [
                (article, NOW - dt.timedelta(days=days))
                for (article, days), n in WRITTEN.items()
                for _ in range(n)
            ],
        )


def _truth(rows: dict[tuple[int, int], int]) -> dict[Key, int]:
    """What every read must say of each key: the rows of a kept day, 0 for any other."""
    return {
        (article, _day(days)): (n if _day(days) >= FIRST_KEPT else 0)
        for (article, days), n in rows.items()
    }


def _ranked(truth: dict[Key, int]) -> list[tuple[Key, int]]:
    """top's answer: the kept keys with a value, highest first, ties by the key's text."""
    kept = [(k, v) for k, v in truth.items() if k[1] >= FIRST_KEPT]  # type: ignore[operator]
    return sorted(kept, key=lambda kv: (-kv[1], str(kv[0][0]), str(kv[0][1])))


def _check_reads(conn: Conn, dsn: str, truth: dict[Key, int], *, drained: bool) -> None:
    pc = Counters(conn)
    keys = [*truth, (9, TODAY), (9, OLD)]  # two keys never counted
    want = [truth.get(k, 0) for k in keys]
    # the client, one key and many, exact and (drained) stored, integers and decimals
    assert [pc.get("per_day", k) for k in keys] == want
    assert pc.get_many("per_day", keys) == want
    assert [pc.get_decimal("per_day", k) for k in keys] == [Decimal(v) for v in want]
    assert pc.get_many_decimal("per_day", keys) == [Decimal(v) for v in want]
    if drained:
        assert [pc.get("per_day", k, exact=False) for k in keys] == want
        assert pc.get_many("per_day", keys, exact=False) == want
        assert pc.top("per_day", 20) == _ranked(truth)
        assert pc.top_decimal("per_day", 20) == [(k, Decimal(v)) for k, v in _ranked(truth)]
    # the range reads, over a range that starts long before the first day kept
    per_article = Tally[object]()
    for (article, _), v in truth.items():
        per_article[article] += v
    start, end = OLD - dt.timedelta(days=5), TODAY + dt.timedelta(days=1)
    for article in (1, 2, 3):
        assert pc.get_range("per_day", article, start, end) == per_article[article]
        series = dict(pc.get_series("per_day", article, start, end))
        assert {d: v for d, v in series.items() if v} == {
            d: v for (a, d), v in truth.items() if a == article and v
        }
    assert pc.top_range("per_day", start, end) == sorted(
        (((a,), v) for a, v in per_article.items() if v), key=lambda kv: (-kv[1], str(kv[0][0]))
    )
    # the SQL functions
    texts = [[str(a), d.isoformat()] for a, d in keys]  # type: ignore[union-attr]
    got = [
        conn.execute("SELECT pgcounters.get('per_day', %s)", (t,)).fetchone()[0]  # type: ignore[index]
        for t in texts
    ]
    assert got == want
    got = [
        conn.execute("SELECT pgcounters.get_decimal('per_day', %s)", (t,)).fetchone()[0]  # type: ignore[index]
        for t in texts
    ]
    assert got == [Decimal(v) for v in want]
    rows = conn.execute("SELECT key, value FROM pgcounters.get_many('per_day', %s)", (texts,))
    assert [int(v) for _, v in rows] == want
    if drained:
        rows = conn.execute("SELECT key, value FROM pgcounters.top('per_day', 20)")
        assert [(k, int(v)) for k, v in rows] == [
            ([str(a), d.isoformat()], v)  # type: ignore[union-attr]
            for (a, d), v in _ranked(truth)
        ]
    for article in (1, 2, 3):
        row = conn.execute(
            "SELECT pgcounters.get_range('per_day', %s, %s, %s)",
            ([str(article)], f"{start} Europe/Paris", f"{end} Europe/Paris"),
        ).fetchone()
        assert row == (per_article[article],)
    # the async client, in a session of its own (the database's clock)

    async def reads() -> tuple[list[int], list[int], list[tuple[Key, int]]]:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            apc = AsyncCounters(aconn)
            return (
                [await apc.get("per_day", k) for k in keys],
                await apc.get_many("per_day", keys),
                await apc.top("per_day", 20),
            )

    one, many, ranked = asyncio.run(reads())
    assert (one, many) == (want, want)
    if drained:
        assert ranked == _ranked(truth)


@pytest.mark.parametrize("mode", ["queued", "unlogged", "direct"])
def test_every_read_leaves_out_the_periods_no_longer_kept(conn: Conn, dsn: str, mode: str) -> None:
    _install(conn, mode)
    truth = _truth(WRITTEN)
    assert (truth[(1, OLD)], truth[(1, TODAY)]) == (0, 3)  # 2 rows thirty days ago: 0
    pc = Counters(conn)
    if mode != "direct":
        _check_reads(conn, dsn, truth, drained=False)  # every delta pending
    pc.drain()
    _check_reads(conn, dsn, truth, drained=True)  # stored, the retention not run yet
    # the retention deletes the old days' values; then a late change to one old row of
    # article 1 and one of article 2 (deleted) is drained: their days hold -1 alone
    assert pc.drop_expired_buckets() == 3
    conn.execute(
        "DELETE FROM comment WHERE id IN (SELECT min(id) FROM comment"
        " WHERE created_at < %s GROUP BY article_id)",
        (NOW - dt.timedelta(days=20),),
    )
    if mode != "direct":
        _check_reads(conn, dsn, truth, drained=False)
    pc.drain()
    stored = conn.execute(
        "SELECT key[1]::bigint, value FROM pgcounters.counters WHERE key[2] = %s ORDER BY 1",
        (OLD.isoformat(),),
    ).fetchall()
    assert stored == [(1, -1), (2, -1)]  # what a read that ignores the window would say
    _check_reads(conn, dsn, truth, drained=True)


def test_the_reads_of_a_few_keys_stay_index_scans(conn: Conn) -> None:
    """The window costs no scan of a table: the plans of the client's reads of a few keys
    (checked in the plan, not by timing), with many stored values and queued deltas. (The
    plan of top, which filters the same way, is checked on a large counter in
    test_drain_many_keys.py.)"""
    _install(conn, "queued")
    target = conn.execute("SELECT id FROM pgcounters.targets WHERE name = 'per_day'").fetchone()
    assert target is not None
    for table, column in (("counters", "value"), ("queue", "delta"), ("queue_unlogged", "delta")):
        conn.execute(
            f"INSERT INTO pgcounters.{table} (target_id, key, {column})"  # noqa: S608
            " SELECT %s, ARRAY[g::text, '2026-11-20'], 1 FROM generate_series(1000, 30999) AS g",
            (target[0],),
        )
    conn.execute("ANALYZE pgcounters.counters, pgcounters.queue, pgcounters.queue_unlogged")
    key = ["1", TODAY.isoformat()]
    keys = '[["1", "2026-11-20"], ["2", "2026-10-21"]]'
    for statement, params in (
        ("exact_named", {"t": target[0], "k": key}),
        ("stored_named", {"t": target[0], "k": key}),
        ("exact_named_many", {"t": target[0], "keys": keys}),
        ("stored_named_many", {"t": target[0], "keys": keys}),
    ):
        row = conn.execute("EXPLAIN (FORMAT JSON) " + sqlfiles.query(statement), params).fetchone()
        assert row is not None
        assert "Seq Scan" not in str(row[0]), statement
