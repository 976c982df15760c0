"""Exact reads from SQL: an unlogged counter's pending deltas are part of what get,
get_many and get_decimal return; counters per hour in zones whose offset is not a whole
number of hours (Asia/Kolkata, +05:30; Australia/Lord_Howe, +10:30 and +11 in summer)
are keyed and read in the counter's zone, whatever the writing or reading session's
TimeZone. Judged against values the test computes by hand."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from zoneinfo import ZoneInfo

import pytest

from pgcounters import Bucket, Counters, CounterSpec, NamedTarget, triggers
from pgcounters.connection import Conn

UTC = dt.UTC


# -- an unlogged counter's pending deltas ---------------------------------------------


def _unlogged(conn: Conn) -> dict[str, int]:
    """An unlogged counter with stored values and deltas still in the unlogged queue;
    the value of each key, added up here."""
    conn.execute("SELECT pgcounters.create_counter('hits', ARRAY['bigint'], 'unlogged')")
    written = [("1", 5), ("2", 7), ("1", 3)]
    for key, delta in written:
        conn.execute("SELECT pgcounters.incr('hits', ARRAY[%s], %s)", (key, delta))
    conn.execute("CALL pgcounters.drain_all()")
    pending = [("1", 4), ("3", 11), ("2", -2), ("1", 1)]
    for key, delta in pending:
        conn.execute("SELECT pgcounters.incr('hits', ARRAY[%s], %s)", (key, delta))
    # the pending deltas are in the unlogged queue, none in the logged one
    assert conn.execute(
        "SELECT (SELECT count(*) FROM pgcounters.queue_unlogged),"
        " (SELECT count(*) FROM pgcounters.queue)"
    ).fetchone() == (4, 0)
    return {"1": 5 + 3 + 4 + 1, "2": 7 - 2, "3": 11, "4": 0}


def test_sql_get_adds_the_unlogged_queues_pending_deltas(conn: Conn) -> None:
    truth = _unlogged(conn)
    for key, value in truth.items():
        row = conn.execute("SELECT pgcounters.get('hits', ARRAY[%s])", (key,)).fetchone()
        assert row == (value,), key


def test_sql_get_many_adds_the_unlogged_queues_pending_deltas(conn: Conn) -> None:
    truth = _unlogged(conn)
    rows = conn.execute(
        "SELECT key[1], value FROM pgcounters.get_many('hits', %s)", (list(truth),)
    ).fetchall()
    assert rows == [(key, Decimal(value)) for key, value in truth.items()]


def test_sql_get_decimal_adds_the_unlogged_queues_pending_deltas(conn: Conn) -> None:
    truth = _unlogged(conn)
    for key, value in truth.items():
        row = conn.execute("SELECT pgcounters.get_decimal('hits', ARRAY[%s])", (key,)).fetchone()
        assert row == (Decimal(value),), key


# -- hours of zones with half-hour offsets -----------------------------------------------

KOLKATA = ZoneInfo("Asia/Kolkata")
LORD_HOWE = ZoneInfo("Australia/Lord_Howe")
# instants of both seasons of Lord Howe (summer +11 until 5 April 2026, +10:30 after),
# away from its clock changes, at quarter past and quarter to the hours of each zone
INSTANTS = [
    dt.datetime(2026, 1, 15, 3, 10, tzinfo=UTC),  # Lord Howe summer, Kolkata 08:40
    dt.datetime(2026, 1, 15, 3, 40, tzinfo=UTC),  # Kolkata 09:10, Lord Howe 14:40
    dt.datetime(2026, 1, 15, 3, 50, tzinfo=UTC),
    dt.datetime(2026, 1, 15, 18, 20, tzinfo=UTC),  # Kolkata 23:50 of the 15th
    dt.datetime(2026, 1, 15, 18, 40, tzinfo=UTC),  # Kolkata 00:10 of the 16th
    dt.datetime(2026, 6, 10, 13, 20, tzinfo=UTC),  # Lord Howe winter (+10:30): 23:50
    dt.datetime(2026, 6, 10, 13, 35, tzinfo=UTC),  # Lord Howe 00:05 of the 11th
    dt.datetime(2026, 6, 10, 13, 55, tzinfo=UTC),
]


def _hour_key(instant: dt.datetime, zone: ZoneInfo) -> str:
    """The key part of the hour of ``instant`` in ``zone``: the UTC instant it starts at,
    computed here with zoneinfo."""
    local = instant.astimezone(zone)
    start = local.replace(minute=0, second=0, microsecond=0).astimezone(UTC)
    return start.strftime("%Y-%m-%dT%H:%M:%SZ")


def _specs() -> list[CounterSpec]:
    return [
        CounterSpec(
            name=f"{name}_{period}",
            source="visit",
            keys=("page",),
            target=NamedTarget(("bigint",)),
            mode=mode,  # type: ignore[arg-type]
            bucket=Bucket("at", period, zone),  # type: ignore[arg-type]
        )
        for name, zone in (("kolkata", "Asia/Kolkata"), ("lord_howe", "Australia/Lord_Howe"))
        for period, mode in (("hour", "queued"), ("day", "unlogged"))
    ]


@pytest.mark.parametrize("session_zone", ["UTC", "Europe/Paris", "Asia/Kolkata"])
def test_hours_and_days_of_half_hour_zones_follow_the_counters_zone(
    conn: Conn, session_zone: str
) -> None:
    conn.execute("CREATE TABLE visit (id bigserial PRIMARY KEY, page bigint, at timestamptz)")
    triggers.install(conn, _specs())
    # written and read by a session in another zone
    conn.execute("SELECT set_config('TimeZone', %s, false)", (session_zone,))
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO visit (page, at) VALUES (1, %s)", [(t,) for t in INSTANTS])
    pc = Counters(conn)
    for name, zone in (("kolkata", KOLKATA), ("lord_howe", LORD_HOWE)):
        hours: dict[str, int] = {}
        days: dict[dt.date, int] = {}
        for t in INSTANTS:
            hours[_hour_key(t, zone)] = hours.get(_hour_key(t, zone), 0) + 1
            days[t.astimezone(zone).date()] = days.get(t.astimezone(zone).date(), 0) + 1
        # the keys the triggers wrote are the hours and days of the counter's zone
        for counter, truth in ((f"{name}_hour", hours), (f"{name}_day", days)):
            written = conn.execute(
                "SELECT q.key[2], sum(q.delta)::int FROM (SELECT target_id, key::text[] AS key,"
                " delta FROM pgcounters.queue UNION ALL SELECT target_id, key::text[], delta"
                " FROM pgcounters.queue_unlogged) AS q JOIN pgcounters.targets AS t"
                " ON t.id = q.target_id WHERE t.name = %s GROUP BY 1",
                (counter,),
            ).fetchall()
            assert dict(written) == {str(part): v for part, v in truth.items()}, counter
            for part, value in truth.items():
                key = [str(1), str(part)]
                assert conn.execute("SELECT pgcounters.get(%s, %s)", (counter, key)).fetchone() == (
                    value,
                ), (counter, part)
                assert pc.get(counter, (1, part)) == value, (counter, part)
        # a series of the hours of the whole days around the instants, in the counter's zone
        for t in INSTANTS[::3]:
            day = t.astimezone(zone).date()
            start = dt.datetime.combine(day, dt.time(), zone)
            end = dt.datetime.combine(day + dt.timedelta(days=1), dt.time(), zone)
            # an hour is named by its start, an aware datetime
            series = [(_text(s), v) for s, v in pc.get_series(f"{name}_hour", 1, start, end)]
            assert [s for s, _ in series] == [
                (start + dt.timedelta(hours=h)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                for h in range(24)
            ]
            assert {s: v for s, v in series if v} == {
                k: v for k, v in hours.items() if start <= _parse(k) < end
            }
            rows = conn.execute(
                "SELECT to_char(period_start AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'),"
                " value FROM pgcounters.get_series(%s, '{1}', %s, %s) WHERE value <> 0",
                (f"{name}_hour", start, end),
            ).fetchall()
            assert dict(rows) == {k: v for k, v in hours.items() if start <= _parse(k) < end}
        assert pc.get_range(f"{name}_day", 1, min(days), max(days) + dt.timedelta(days=1)) == len(
            INSTANTS
        )


def _parse(key: str) -> dt.datetime:
    return dt.datetime.strptime(key, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def _text(start: dt.date) -> str:
    assert isinstance(start, dt.datetime)
    return start.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- the order of ties -------------------------------------------------------------------


def test_ties_of_top_range_and_top_are_in_byte_order_of_the_keys_text(conn: Conn) -> None:
    conn.execute("CREATE TABLE visit (id bigserial PRIMARY KEY, page text, at timestamptz)")
    spec = CounterSpec(
        name="per_page",
        source="visit",
        keys=("page",),
        target=NamedTarget(("text",)),
        bucket=Bucket("at", "day", "UTC"),
    )
    triggers.install(conn, [spec])
    day = dt.datetime(2026, 11, 20, 12, tzinfo=UTC)
    # 2 visits of each page over two days, 3 of z; pages whose byte order is not the
    # order of their numbers nor of their letters ignoring case
    visits = [(p, day + dt.timedelta(days=d)) for p in ("b", "9", "a", "B", "10") for d in (0, 1)]
    visits += [("z", day)] * 3
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO visit (page, at) VALUES (%s, %s)", visits)
    ranked = [("z", 3), ("10", 2), ("9", 2), ("B", 2), ("a", 2), ("b", 2)]
    pc = Counters(conn)
    start, end = day.date(), day.date() + dt.timedelta(days=2)
    for n in (0, 1, 2, 4, 6, 10):
        rows = conn.execute(
            "SELECT key, value FROM pgcounters.top_range('per_page', %s, %s, %s)",
            (day - dt.timedelta(hours=12), day + dt.timedelta(days=1, hours=12), n),
        ).fetchall()
        assert [(k[0], v) for k, v in rows] == ranked[:n]
        assert pc.top_range("per_page", start, end, n) == [((k,), v) for k, v in ranked[:n]]
    # top: the stored values of each (page, day), once drained
    pc.drain()
    by_day = [("z", 3)] + [(p, 1) for p in ("10", "10", "9", "9", "B", "B", "a", "a", "b", "b")]
    rows = conn.execute("SELECT key, value FROM pgcounters.top('per_page', 20)").fetchall()
    assert [(k[0], int(v)) for k, v in rows] == by_day
    assert [(k[0], v) for k, v in pc.top("per_page", 20)] == by_day
