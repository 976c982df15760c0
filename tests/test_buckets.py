"""Counters per period (time buckets): keys in an IANA time zone across DST changes,
exact reads over a range (sync, async, SQL), retention, verify and recount."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import threading
from collections import Counter as Tally
from zoneinfo import ZoneInfo

import psycopg
import pytest

from pgcounters import (
    AsyncCounters,
    AsyncWorker,
    Bucket,
    ColumnTarget,
    CounterBackfilling,
    Counters,
    CounterSpec,
    Fragment,
    InvalidArgument,
    InvalidCounterDefinition,
    NamedTarget,
    Worker,
    WorkerSettings,
    recount,
    triggers,
    verify,
)
from pgcounters.connection import Conn
from pgcounters.keys import Key
from pgcounters.notifications import Changes
from roles import login_role
from support import queued, set_clock, set_database_clock, tamper, wait_for

PARIS = ZoneInfo("Europe/Paris")
UTC = dt.UTC


def _table(conn: Conn) -> None:
    conn.execute(
        "CREATE TABLE comment (id bigserial PRIMARY KEY, article_id bigint, "
        "public boolean NOT NULL DEFAULT true, created_at timestamptz NOT NULL, "
        "written_on timestamp, day date)"
    )


def _spec(
    name: str = "per_day",
    period: str = "day",
    *,
    mode: str = "queued",
    keep: int | None = None,
    column: str = "created_at",
) -> CounterSpec:
    return CounterSpec(
        name=name,
        source="comment",
        keys=("article_id",),
        target=NamedTarget(("bigint",)),
        where=Fragment("public"),
        mode=mode,  # type: ignore[arg-type]
        bucket=Bucket(column, period, "Europe/Paris", keep=keep),  # type: ignore[arg-type]
    )


def _insert(conn: Conn, rows: list[tuple[int, dt.datetime]]) -> None:
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO comment (article_id, created_at) VALUES (%s, %s)", rows)


def _local_start(instant: dt.datetime, period: str) -> dt.datetime:
    """The start of the period of ``instant`` in Paris, computed in Python."""
    local = instant.astimezone(PARIS)
    if period == "hour":
        # the hour as an instant: the two 02:00 of the night clocks go back stay two
        return (
            instant.astimezone(UTC)
            - dt.timedelta(
                minutes=local.minute, seconds=local.second, microseconds=local.microsecond
            )
        ).astimezone(PARIS)
    day = local.date()
    if period == "week":
        day -= dt.timedelta(days=day.weekday())
    elif period == "month":
        day = day.replace(day=1)
    return dt.datetime.combine(day, dt.time(), PARIS)


# the DST changes of 2026 in Paris: 29 March (02:00 -> 03:00), 25 October (03:00 -> 02:00)
SPRING = dt.datetime(2026, 3, 29, 1, 0, tzinfo=UTC)  # 03:00 CEST, just after the change
AUTUMN = dt.datetime(2026, 10, 25, 1, 0, tzinfo=UTC)  # 02:00 CET, the second 02:00


def test_a_day_when_clocks_change_has_23_or_25_hours(conn: Conn) -> None:
    _table(conn)
    triggers.install(conn, [_spec(), _spec("per_hour", "hour")])
    # a comment every 30 minutes from 22:00 UTC the day before to 03:00 UTC the day after
    rows: list[tuple[int, dt.datetime]] = []
    for change in (SPRING, AUTUMN):
        first = change.replace(hour=0) - dt.timedelta(hours=3)
        rows += [(1, first + dt.timedelta(minutes=30 * i)) for i in range(2 * 30)]
    # written by a session in another zone: the keys do not follow its TimeZone
    conn.execute("SET TimeZone = 'Asia/Tokyo'")
    _insert(conn, rows)
    pc = Counters(conn)
    for change in (SPRING, AUTUMN):
        day = change.astimezone(PARIS).date()
        series = pc.get_series("per_hour", 1, day, day + dt.timedelta(days=1))
        # 23 hours the day clocks go forward, 25 the day they go back
        assert len(series) == (23 if change is SPRING else 25)
        midnight = dt.datetime.combine(day, dt.time(), PARIS).astimezone(UTC)
        after = dt.datetime.combine(day + dt.timedelta(days=1), dt.time(), PARIS)
        # (compared as UTC instants: Python compares two times of one zone by their
        # wall-clock fields, and the two 02:00 of the night clocks go back are equal so)
        hours = sorted(
            {
                _local_start(midnight + dt.timedelta(minutes=15 * i), "hour").astimezone(UTC)
                for i in range(4 * 26)
                if midnight + dt.timedelta(minutes=15 * i) < after
            }
        )
        starts = [s for s, _ in series if isinstance(s, dt.datetime)]  # an hour's is a datetime
        assert [s.astimezone(UTC) for s in starts] == hours
        assert all(s.tzinfo == PARIS for s in starts)
        truth = Tally(_local_start(t, "hour").astimezone(UTC) for _, t in rows)
        assert [v for _, v in series] == [truth[s.astimezone(UTC)] for s in starts]
        days = pc.get_series("per_day", 1, day - dt.timedelta(days=1), day + dt.timedelta(days=2))
        truth_days = Tally(_local_start(t, "day").date() for _, t in rows)
        assert days == [(d, truth_days[d]) for d, _ in days]
        assert sum(v for _, v in days) == sum(
            1
            for _, t in rows
            if day - dt.timedelta(days=1)
            <= t.astimezone(PARIS).date()
            <= day + dt.timedelta(days=1)
        )
    assert verify(conn, "per_hour").ok
    assert verify(conn, "per_day").ok


def test_weeks_start_on_monday_and_months_on_the_first(conn: Conn) -> None:
    _table(conn)
    triggers.install(conn, [_spec("per_week", "week"), _spec("per_month", "month")])
    # Sunday 1 November 2026 23:30 in Paris is 22:30 UTC: week of Monday 26 October
    sunday_night = dt.datetime(2026, 11, 1, 22, 30, tzinfo=UTC)
    monday = dt.datetime(2026, 11, 1, 23, 30, tzinfo=UTC)  # 00:30 on Monday 2 November
    october_end = dt.datetime(2026, 10, 31, 23, 30, tzinfo=UTC)  # 00:30 on 1 November
    _insert(conn, [(1, sunday_night), (1, monday), (1, october_end)])
    pc = Counters(conn)
    weeks = pc.get_series("per_week", 1, dt.date(2026, 10, 26), dt.date(2026, 11, 9))
    assert weeks == [(dt.date(2026, 10, 26), 2), (dt.date(2026, 11, 2), 1)]
    months = pc.get_series("per_month", 1, dt.date(2026, 10, 1), dt.date(2026, 12, 1))
    assert months == [(dt.date(2026, 10, 1), 0), (dt.date(2026, 11, 1), 3)]
    assert pc.get("per_week", (1, dt.date(2026, 10, 26))) == 2


def test_timestamp_and_date_columns_are_local_times(conn: Conn) -> None:
    _table(conn)
    triggers.install(
        conn, [_spec("by_wall_clock", "hour", column="written_on"), _spec("by_day", column="day")]
    )
    conn.execute("SET TimeZone = 'UTC'")
    conn.execute(
        "INSERT INTO comment (article_id, created_at, written_on, day) VALUES "
        "(1, now(), '2026-10-25 02:30', '2026-10-25'), (1, now(), '2026-10-25 03:10', NULL)"
    )
    pc = Counters(conn)
    # a wall-clock 02:30 on the night clocks go back is ambiguous: PostgreSQL reads it
    # as standard time (the second 02:30, CET), whatever the session's TimeZone
    assert pc.get("by_wall_clock", (1, "2026-10-25T00:00:00Z")) == 0
    assert pc.get("by_wall_clock", (1, "2026-10-25T01:00:00Z")) == 1
    assert pc.get("by_wall_clock", (1, "2026-10-25T02:00:00Z")) == 1
    assert pc.get("by_day", (1, dt.date(2026, 10, 25))) == 1  # a NULL date counts nowhere


@pytest.mark.parametrize("mode", ["queued", "unlogged", "direct"])
def test_range_series_and_top_are_exact_in_every_mode(conn: Conn, mode: str) -> None:
    _table(conn)
    triggers.install(conn, [_spec(mode=mode)])
    base = dt.datetime(2026, 11, 1, 12, tzinfo=UTC)
    rows = [(a, base + dt.timedelta(days=d)) for a in (1, 2, 3) for d in range(a * 3)]
    _insert(conn, rows)
    conn.execute("UPDATE comment SET public = false WHERE article_id = 3 AND id % 2 = 0")
    pc = Counters(conn)
    first, last = dt.date(2026, 11, 2), dt.date(2026, 11, 6)  # [2, 6): four days
    public = [(a, t) for (i, (a, t)) in enumerate(rows, 1) if not (a == 3 and i % 2 == 0)]

    def truth(article: int) -> int:
        return sum(1 for a, t in public if a == article and first <= t.date() < last)

    def check() -> None:
        for article in (1, 2, 3, 4):
            assert pc.get_range("per_day", article, first, last) == truth(article)
        top = pc.top_range("per_day", first, last, 2)
        ranked = sorted(((truth(a), a) for a in (1, 2, 3)), key=lambda x: (-x[0], x[1]))
        assert top == [((a,), v) for v, a in ranked[:2]]
        series = pc.get_series("per_day", 2, first, last)
        assert series == [
            (
                first + dt.timedelta(days=i),
                sum(1 for a, t in public if a == 2 and t.date() == first + dt.timedelta(days=i)),
            )
            for i in range(4)
        ]

    check()  # with the deltas pending (none in direct mode)
    pc.drain()
    check()
    # aware datetimes: the same range as instants
    start = dt.datetime(2026, 11, 2, tzinfo=PARIS)
    assert pc.get_range("per_day", 1, start, start + dt.timedelta(days=4)) == truth(1)
    assert verify(conn, "per_day").ok


def test_async_reads_are_the_sync_reads(conn: Conn, dsn: str) -> None:
    _table(conn)
    triggers.install(conn, [_spec()])
    base = dt.datetime(2026, 11, 1, 12, tzinfo=UTC)
    _insert(conn, [(1, base), (1, base + dt.timedelta(days=1)), (2, base)])
    pc = Counters(conn)
    first, last = dt.date(2026, 11, 1), dt.date(2026, 11, 3)

    async def reads() -> tuple[int, list[tuple[dt.date, int]], list[tuple[Key, int]]]:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            apc = AsyncCounters(aconn)
            return (
                await apc.get_range("per_day", 1, first, last),
                await apc.get_series("per_day", 1, first, last),
                await apc.top_range("per_day", first, last),
            )

    got = asyncio.run(reads())
    assert got == (
        pc.get_range("per_day", 1, first, last),
        pc.get_series("per_day", 1, first, last),
        pc.top_range("per_day", first, last),
    )
    assert got[0] == 2
    assert got[2] == [((1,), 2), ((2,), 1)]


def test_sql_reads_and_their_grants(conn: Conn, dsn: str) -> None:
    _table(conn)
    triggers.install(conn, [_spec()])
    _insert(conn, [(1, dt.datetime(2026, 11, 1, 23, 30, tzinfo=UTC))])  # 2 November in Paris
    with (
        login_role(dsn, "bucketapp") as (app_role, app_dsn),
        login_role(dsn, "bucketnobody") as (_nobody, nobody_dsn),
    ):
        conn.execute("SELECT pgcounters.grant_app(%s)", (app_role,))
        with psycopg.connect(app_dsn, autocommit=True) as app:
            app.execute("SET TimeZone = 'America/New_York'")
            frm, to = "2026-11-01 00:00 Europe/Paris", "2026-11-03 00:00 Europe/Paris"
            assert app.execute(
                "SELECT pgcounters.get_range('per_day', '{1}', %s, %s)", (frm, to)
            ).fetchone() == (1,)
            series = app.execute(
                "SELECT period_start AT TIME ZONE 'Europe/Paris', value "
                "FROM pgcounters.get_series('per_day', '{1}', %s, %s)",
                (frm, to),
            ).fetchall()
            assert series == [(dt.datetime(2026, 11, 1), 0), (dt.datetime(2026, 11, 2), 1)]
            assert app.execute(
                "SELECT * FROM pgcounters.top_range('per_day', %s, %s, 5)", (frm, to)
            ).fetchall() == [(["1"], 1)]
            # the client's reads: one range and one series statement
            day = dt.date(2026, 11, 2)
            assert Counters(app).get_range("per_day", 1, day, day + dt.timedelta(days=1)) == 1
            assert Counters(app).get_series("per_day", 1, day, day + dt.timedelta(days=2)) == [
                (day, 1),
                (day + dt.timedelta(days=1), 0),
            ]
        conn.execute(
            "GRANT INSERT ON comment TO {0}; GRANT USAGE ON SEQUENCE comment_id_seq TO {0}".replace(
                "{0}", app_role
            )
        )
        with psycopg.connect(app_dsn, autocommit=True) as app:
            app.execute(
                "INSERT INTO comment (article_id, created_at) VALUES (1, '2026-11-02 10:00Z')"
            )
        assert (
            Counters(conn).get_range("per_day", 1, dt.date(2026, 11, 2), dt.date(2026, 11, 3)) == 2
        )
        with (
            psycopg.connect(nobody_dsn, autocommit=True) as other,
            pytest.raises(psycopg.errors.InsufficientPrivilege),
        ):
            other.execute("SELECT pgcounters.get_range('per_day', '{1}', now(), now())")


def test_bad_declarations_and_reads_are_refused(conn: Conn) -> None:
    with pytest.raises(InvalidCounterDefinition, match="IANA"):
        Bucket("created_at", "day", "Europe/Pariss")
    with pytest.raises(InvalidCounterDefinition, match="period"):
        Bucket("created_at", "fortnight")  # type: ignore[arg-type]
    with pytest.raises(InvalidCounterDefinition, match="keep"):
        Bucket("created_at", keep=0)
    with pytest.raises(InvalidCounterDefinition, match="named counter"):
        CounterSpec(
            name="x",
            source="comment",
            keys=("article_id",),
            target=ColumnTarget("article", "n"),
            bucket=Bucket("created_at"),
        )
    _table(conn)
    triggers.install(conn, [_spec()])
    pc = Counters(conn)
    pc.create_counter("plain", int)
    with pytest.raises(InvalidCounterDefinition, match="not counted per period"):
        pc.get_range("plain", 1, dt.date(2026, 1, 1), dt.date(2026, 1, 2))
    with pytest.raises(InvalidArgument, match="aware"):
        pc.get_range("per_day", 1, dt.datetime(2026, 1, 1), dt.date(2026, 1, 2))
    with pytest.raises(InvalidArgument, match="starts before it ends"):
        pc.get_series("per_day", 1, dt.date(2026, 1, 2), dt.date(2026, 1, 1))
    with pytest.raises(InvalidArgument, match="at most"):
        pc.get_series("per_day", 1, dt.date(1800, 1, 2), dt.date(2200, 1, 1))
    # the spec survives its recording
    spec = _spec(keep=30)
    assert CounterSpec.from_json(spec.to_json()) == spec
    assert spec.fingerprint != _spec().fingerprint


def test_verify_and_recount_per_period(conn: Conn) -> None:
    _table(conn)
    triggers.install(conn, [_spec()])
    base = dt.datetime(2026, 11, 1, 12, tzinfo=UTC)
    _insert(conn, [(1, base), (1, base + dt.timedelta(days=1)), (2, base)])
    pc = Counters(conn)
    pc.drain()
    tamper(
        conn,
        "UPDATE pgcounters.counters SET value = value + 5 WHERE key = '{1,2026-11-02}'",
    )
    result = verify(conn, "per_day")
    assert [(m.key, m.expected, m.actual) for m in result.mismatches] == [
        ((1, dt.date(2026, 11, 2)), 1, 6)
    ]
    recount(conn, "per_day")
    assert verify(conn, "per_day").ok
    assert pc.get_range("per_day", 1, dt.date(2026, 11, 1), dt.date(2026, 11, 3)) == 2


def test_install_over_existing_rows_backfills_every_period(conn: Conn) -> None:
    _table(conn)
    base = dt.datetime(2026, 10, 24, 21, 30, tzinfo=UTC)
    rows = [(a, base + dt.timedelta(hours=h)) for a in (1, 2) for h in range(0, 60, 7)]
    _insert(conn, rows)
    triggers.install(conn, [_spec(), _spec("per_hour", "hour")])
    pc = Counters(conn)
    truth = Tally((a, _local_start(t, "day").date()) for a, t in rows)
    for (article, day), n in truth.items():
        assert pc.get("per_day", (article, day)) == n
    assert verify(conn, "per_day").ok
    assert verify(conn, "per_hour").ok


def test_retention_drops_old_periods_while_a_drain_runs(conn: Conn, dsn: str) -> None:
    _table(conn)
    triggers.install(conn, [_spec(keep=3)])
    today = dt.datetime(2026, 11, 20, 12, tzinfo=PARIS)
    # the clock of the reads and of the retention, as for quotas
    set_clock(conn, today)
    rows = [(a, today - dt.timedelta(days=d)) for a in (1, 2) for d in range(6) for _ in range(50)]
    _insert(conn, rows)
    pc = Counters(conn)
    pc.drain()
    # more deltas of every period, pending while the retention runs beside a drainer
    _insert(conn, rows)
    failures: list[BaseException] = []

    def drain() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as other:
                Counters(other).drain(batch_size=7)
        except BaseException as exc:  # pragma: no cover - reported below
            failures.append(exc)

    drainer = threading.Thread(target=drain)
    drainer.start()
    dropped = 0
    while drainer.is_alive():
        dropped += conn.execute("SELECT pgcounters.drop_expired_buckets(3)").fetchone()[0]  # type: ignore[index]
    drainer.join()
    assert not failures
    pc.drain()
    dropped += conn.execute("SELECT pgcounters.drop_expired_buckets()").fetchone()[0]  # type: ignore[index]
    assert dropped >= 6  # 3 old days of 2 articles, some dropped again after the drain
    kept = {dt.date(2026, 11, d) for d in (18, 19, 20)}
    stored = conn.execute("SELECT key[2], value FROM pgcounters.counters ORDER BY 1").fetchall()
    assert {dt.date.fromisoformat(k) for k, _ in stored} == kept
    assert all(v == 100 for _, v in stored)  # every delta of a kept day, once
    # old days read 0, from the first period kept on the values are exact
    series = pc.get_series("per_day", 1, dt.date(2026, 11, 14), dt.date(2026, 11, 21))
    assert series == [(dt.date(2026, 11, d), 100 if d >= 18 else 0) for d in range(14, 21)]
    assert pc.get_range("per_day", 1, dt.date(2026, 11, 1), dt.date(2026, 12, 1)) == 300
    assert pc.top_range("per_day", dt.date(2026, 11, 1), dt.date(2026, 12, 1)) == [
        ((1,), 300),
        ((2,), 300),
    ]
    # verify compares the periods kept only; recount does not bring old ones back
    assert verify(conn, "per_day").ok
    recount(conn, "per_day")
    assert conn.execute("SELECT count(*) FROM pgcounters.counters").fetchone() == (6,)


def _old_and_new_days(conn: Conn) -> None:
    """A counter keeping 2 days, values of 5 days, the database's clock on 20 November."""
    _table(conn)
    triggers.install(conn, [_spec(keep=2)])
    today = dt.datetime(2026, 11, 20, 12, tzinfo=PARIS)
    set_database_clock(conn, today)  # every session of the worker has this clock too
    _insert(conn, [(1, today - dt.timedelta(days=d)) for d in range(5)])


def _stored_days(conn: Conn) -> list[str]:
    return [r[0] for r in conn.execute("SELECT key[2] FROM pgcounters.counters ORDER BY 1")]


def test_the_worker_drains_then_deletes_periods_no_longer_kept(conn: Conn, dsn: str) -> None:
    _old_and_new_days(conn)
    worker = Worker(dsn, WorkerSettings(min_interval=0.01, max_interval=0.05))
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_for(lambda: queued(conn) == 0 and _stored_days(conn) == ["2026-11-19", "2026-11-20"])
    finally:
        worker.stop()
        thread.join(timeout=60)
    assert not thread.is_alive()
    assert verify(conn, "per_day").ok


def test_the_async_worker_deletes_periods_no_longer_kept(conn: Conn, dsn: str) -> None:
    _old_and_new_days(conn)
    Counters(conn).drain()
    assert len(_stored_days(conn)) == 5

    async def main() -> None:
        async with AsyncWorker(dsn, WorkerSettings(min_interval=0.01, max_interval=0.05)):
            for _ in range(3000):
                if _stored_days(conn) == ["2026-11-19", "2026-11-20"]:
                    return
                await asyncio.sleep(0.02)
            raise AssertionError("the old days were not deleted")

    asyncio.run(main())


def _break_retention(conn: Conn) -> None:
    """The retention of the counter fails (a time zone PostgreSQL does not know), the
    drain does not (the triggers hold their own)."""
    conn.execute(
        "UPDATE pgcounters.specs SET definition = jsonb_set(definition, "
        "'{bucket,time_zone}', '\"Nowhere/Nothing\"') WHERE name = 'per_day'"
    )
    with pytest.raises(psycopg.Error):
        conn.execute("SELECT pgcounters.drop_expired_buckets()")


def test_a_failing_retention_never_stops_the_worker_draining_and_reporting(
    conn: Conn, dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    _old_and_new_days(conn)
    _break_retention(conn)
    calls: list[Changes] = []
    settings = WorkerSettings(min_interval=0.01, max_interval=0.05, log_every=0)
    worker = Worker(dsn, settings, on_change=calls.append)
    thread = threading.Thread(target=worker.run)
    with caplog.at_level(logging.WARNING, "pgcounters.worker"):
        thread.start()
        try:
            wait_for(lambda: queued(conn) == 0 and worker.get_stats().rounds > 3)
            # later deltas too, and their changes are reported
            _insert(conn, [(7, dt.datetime(2026, 11, 20, 12, tzinfo=PARIS))])
            wait_for(
                lambda: any((7, dt.date(2026, 11, 20)) in (c.get("per_day") or ()) for c in calls)
            )
        finally:
            worker.stop()
            thread.join(timeout=60)
    assert not thread.is_alive()
    stats = worker.get_stats()
    assert stats.errors == 0
    assert stats.deltas == 6
    assert len(_stored_days(conn)) == 6  # nothing deleted
    assert "deleting values of periods no longer kept failed" in caplog.text


def test_a_failing_retention_never_stops_the_async_worker(conn: Conn, dsn: str) -> None:
    _old_and_new_days(conn)
    _break_retention(conn)

    async def main() -> None:
        settings = WorkerSettings(min_interval=0.01, max_interval=0.05, log_every=0)
        async with AsyncWorker(dsn, settings) as worker:
            for _ in range(3000):
                if queued(conn) == 0 and worker.get_stats().rounds > 3:
                    break
                await asyncio.sleep(0.02)
            assert worker.get_stats().errors == 0
            assert worker.get_stats().rounds > 3

    asyncio.run(main())
    assert queued(conn) == 0


def test_drop_expired_buckets_skips_a_row_another_transaction_holds(conn: Conn, dsn: str) -> None:
    _old_and_new_days(conn)
    pc = Counters(conn)
    pc.drain()
    with psycopg.connect(dsn) as holder:
        holder.execute("SELECT 1 FROM pgcounters.counters WHERE key = '{1,2026-11-16}' FOR UPDATE")
        # no wait: the held row is left for a later call
        assert pc.drop_expired_buckets() == 2
        assert _stored_days(conn)[0] == "2026-11-16"
    assert pc.drop_expired_buckets() == 1
    with pytest.raises(InvalidArgument):
        pc.drop_expired_buckets(0)


@pytest.mark.parametrize("zone", ["Europe/Paris", "America/New_York", "Asia/Kolkata", "UTC"])
@pytest.mark.parametrize("period", ["hour", "day", "week", "month"])
def test_the_client_makes_the_periods_the_database_makes(
    conn: Conn, zone: str, period: str
) -> None:
    tz = ZoneInfo(zone)
    ranges: list[tuple[dt.date, dt.date]] = [
        (dt.date(2026, 3, 1), dt.date(2026, 4, 3)),
        (dt.date(2026, 10, 20), dt.date(2026, 11, 9)),
        (
            dt.datetime(2026, 3, 29, 0, 40, tzinfo=UTC),
            dt.datetime(2026, 3, 30, 5, 10, tzinfo=tz),
        ),
        (dt.datetime(2026, 10, 24, 21, 5, tzinfo=UTC), dt.date(2026, 11, 3)),
        (dt.date(2026, 11, 2), dt.date(2026, 11, 2)),
    ]
    for start, end in ranges:
        client = Counters(conn)._periods(period, zone, start, end)
        lo = start if isinstance(start, dt.datetime) else dt.datetime.combine(start, dt.time(), tz)
        hi = end if isinstance(end, dt.datetime) else dt.datetime.combine(end, dt.time(), tz)
        database = conn.execute(
            "SELECT bucket FROM pgcounters.bucket_periods(%s, %s, %s, %s)", (period, zone, lo, hi)
        ).fetchall()
        assert [text for _, text in client] == [r[0] for r in database], (start, end)


def test_the_online_backfill_counts_every_period_while_rows_are_written(
    conn: Conn, dsn: str
) -> None:
    from pgcounters import backfill

    _table(conn)
    base = dt.datetime(2026, 10, 24, 20, tzinfo=UTC)
    _insert(conn, [(a, base + dt.timedelta(hours=h)) for a in range(1, 30) for h in (0, 3, 5, 30)])
    triggers.install(conn, [_spec(), _spec("per_hour", "hour", mode="unlogged")], backfill=False)
    pc = Counters(conn)
    with pytest.raises(CounterBackfilling):
        pc.get_range("per_day", 1, dt.date(2026, 10, 24), dt.date(2026, 10, 27))
    # batches of the backfill with writes of the application between them
    with psycopg.connect(dsn, autocommit=True) as other:
        while backfill.pending(other):
            backfill.step(other, batch_size=7)
            _insert(conn, [(3, base + dt.timedelta(hours=2)), (40, base)])
    rows = conn.execute("SELECT article_id, created_at FROM comment").fetchall()
    truth = Tally((a, _local_start(t, "day").date()) for a, t in rows)
    for article in (1, 3, 40):
        series = pc.get_series("per_day", article, dt.date(2026, 10, 24), dt.date(2026, 10, 27))
        assert series == [(d, truth[(article, d)]) for d, _ in series]
    assert verify(conn, "per_day").ok
    assert verify(conn, "per_hour").ok


def test_range_reads_keep_apart_text_keys_that_share_a_head(conn: Conn) -> None:
    """The keys of other keys' periods may lie between a range's two keys as text (the
    queues keep keys as their arrays' text): commas, quotes, braces and digits in text
    keys are never counted in another key's range."""
    conn.execute("CREATE TABLE note (id bigserial PRIMARY KEY, tag text, at timestamptz)")
    spec = CounterSpec(
        name="tag_per_day",
        source="note",
        keys=("tag",),
        target=NamedTarget(("text",)),
        bucket=Bucket("at", "day", "Europe/Paris"),
    )
    triggers.install(conn, [spec])
    tags = ["1", "12", "1,2", "1 2", '1"2', "1,", "a", "a,b", "a}", "b", "{1,2026-11-03}", ""]
    noon = dt.datetime(2026, 11, 1, 11, tzinfo=UTC)
    rows = [
        (tag, noon + dt.timedelta(days=d))
        for i, tag in enumerate(tags)
        for d in range(8)
        for _ in range(1 + (i + d) % 3)
    ]
    conn.cursor().executemany("INSERT INTO note (tag, at) VALUES (%s, %s)", rows[::2])
    pc = Counters(conn)
    pc.drain()
    conn.cursor().executemany("INSERT INTO note (tag, at) VALUES (%s, %s)", rows[1::2])
    first, end = dt.date(2026, 11, 3), dt.date(2026, 11, 7)
    for tag in tags:
        per_day = Tally(t.date() for g, t in rows if g == tag and first <= t.date() < end)
        assert pc.get_range("tag_per_day", tag, first, end) == sum(per_day.values()), tag
        assert pc.get_series("tag_per_day", tag, first, end) == [
            (first + dt.timedelta(days=i), per_day[first + dt.timedelta(days=i)]) for i in range(4)
        ], tag
