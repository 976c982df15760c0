"""A session's settings never change a key: DateStyle, TimeZone, IntervalStyle and
extra_float_digits of the writer leave every declared counter's keys as they are.

The truth here is SQL written by hand over the source rows, computed in a session with
fixed settings; pgcounters' values are read back and compared key by key.
"""

from __future__ import annotations

import datetime as dt

import psycopg
import pytest

import blog_schema
from pgcounters import Counters, triggers
from pgcounters.connection import Conn
from pgcounters.repair import recount, verify
from pgcounters.specs import CounterSpec, NamedTarget

MODES = ["queued", "unlogged", "direct"]

# settings a real session may carry, each of which changed a key or a cast before
HOSTILE_SETTINGS = [
    "SET DateStyle = 'SQL, DMY'",
    "SET TimeZone = 'Pacific/Kiritimati'",  # UTC+14: its day starts ten hours before UTC's
    "SET IntervalStyle = 'sql_standard'",
    "SET extra_float_digits = 0",
]


def _hostile_session(dsn: str) -> Conn:
    conn = psycopg.connect(dsn, autocommit=True)
    for statement in HOSTILE_SETTINGS:
        conn.execute(statement)
    return conn


def _per_day_truth(conn: Conn) -> dict[tuple[int, dt.date], int]:
    rows = conn.execute(
        "SELECT article_id, created_on, count(*) FROM blog_comment"
        " WHERE publish_status = 'public' AND article_id IS NOT NULL"
        " GROUP BY article_id, created_on"
    ).fetchall()
    return {(a, d): n for a, d, n in rows}


@pytest.mark.parametrize("mode", MODES)
def test_date_keys_written_in_a_dmy_session_are_iso(dsn: str, mode: str) -> None:
    day = blog_schema.specs(mode)[3]
    assert day.name == "blog.comments_per_article_day"
    with psycopg.connect(dsn, autocommit=True) as conn, _hostile_session(dsn) as hostile:
        blog_schema.create(conn)
        triggers.install(conn, [day])
        conn.execute(
            "INSERT INTO blog_comment (article_id, publish_status, created_on)"
            " VALUES (1, 'public', '2026-11-21'), (1, 'public', '2026-11-21'),"
            " (2, 'public', '2026-01-05'), (2, 'private', '2026-01-05')"
        )
        # the same days, written by a session whose dates read 21/11/2026
        hostile.execute(
            "INSERT INTO blog_comment (article_id, publish_status, created_on)"
            " VALUES (1, 'public', date '2026-11-21'), (1, 'public', '2026-11-21'),"
            " (2, 'public', '2026-01-05')"
        )
        hostile.execute(
            "UPDATE blog_comment SET publish_status = 'public' WHERE publish_status = 'private'"
        )
        hostile.execute("DELETE FROM blog_comment WHERE id = 1")

        truth = _per_day_truth(conn)
        assert truth == {(1, dt.date(2026, 11, 21)): 3, (2, dt.date(2026, 1, 5)): 3}
        queued = {
            k for (k,) in conn.execute("SELECT DISTINCT key FROM pgcounters.queue").fetchall()
        } | {
            k
            for (k,) in conn.execute(
                "SELECT DISTINCT key FROM pgcounters.queue_unlogged"
            ).fetchall()
        }
        assert queued <= {"{1,2026-11-21}", "{2,2026-01-05}"}
        for counters in (Counters(conn), Counters(hostile)):
            for key, value in truth.items():
                assert counters.get(day.name, key) == value, key
        # the operator's tools agree from either session
        assert verify(hostile, day).mismatches == []
        Counters(hostile).drain()
        assert verify(conn, day).mismatches == []
        for counters in (Counters(conn), Counters(hostile)):
            assert sorted(counters.top(day.name, 10)) == sorted(truth.items())
        stored = conn.execute("SELECT key FROM pgcounters.counters ORDER BY key::text").fetchall()
        assert stored == [(["1", "2026-11-21"],), (["2", "2026-01-05"],)]


@pytest.mark.parametrize("mode", MODES)
def test_a_timestamptz_keys_its_utc_date_in_every_time_zone(dsn: str, mode: str) -> None:
    spec = CounterSpec(
        name="events.per_day",
        source="event",
        keys=("at",),
        target=NamedTarget(("date",)),
        mode=mode,  # type: ignore[arg-type]
    )
    with psycopg.connect(dsn, autocommit=True) as conn, _hostile_session(dsn) as hostile:
        conn.execute("CREATE TABLE event (id bigserial PRIMARY KEY, at timestamptz)")
        triggers.install(conn, [spec])
        instants = [
            "2026-11-21 09:59:59+00",  # 23:59:59 on the 21st in Kiritimati: the 21st in UTC
            "2026-11-21 10:00:00+00",  # the 22nd in Kiritimati, still the 21st in UTC
            "2026-11-21 23:30:00+00",  # the 22nd in Kiritimati, the 21st in UTC
            "2026-11-22 00:00:00+00",
        ]
        conn.execute("SET TimeZone = 'America/Los_Angeles'")
        for at in instants[:2]:
            conn.execute("INSERT INTO event (at) VALUES (%s::timestamptz)", [at])
        for at in instants[2:]:
            hostile.execute("INSERT INTO event (at) VALUES (%s::timestamptz)", [at])
        conn.execute("INSERT INTO event (at) VALUES (NULL)")  # no key: not counted
        hostile.execute(
            "UPDATE event SET at = at + interval '1 hour' WHERE at = '2026-11-21 23:30:00+00'"
        )  # 00:30 on the 22nd in UTC: moves one count from the 21st to the 22nd

        truth: dict[dt.date, int] = dict(
            conn.execute(
                "SELECT (at AT TIME ZONE 'UTC')::date, count(*) FROM event"
                " WHERE at IS NOT NULL GROUP BY 1"
            ).fetchall()
        )
        assert truth == {dt.date(2026, 11, 21): 2, dt.date(2026, 11, 22): 2}
        for counters in (Counters(conn), Counters(hostile)):
            for day, value in truth.items():
                assert counters.get(spec.name, day) == value, day
        assert verify(hostile, spec).mismatches == []
        # a recount from a session in another zone computes the same truth
        recount(hostile, spec)
        Counters(conn).drain()
        for counters in (Counters(conn), Counters(hostile)):
            assert sorted(counters.top(spec.name, 10)) == sorted(
                ((d,), n) for d, n in truth.items()
            )


def test_a_text_column_keys_a_date_with_one_field_order(dsn: str) -> None:
    spec = CounterSpec(
        name="imports.per_day",
        source="import_row",
        keys=("day",),
        target=NamedTarget(("date",)),
    )
    with psycopg.connect(dsn, autocommit=True) as conn, _hostile_session(dsn) as hostile:
        conn.execute("CREATE TABLE import_row (id bigserial PRIMARY KEY, day text)")
        triggers.install(conn, [spec])
        conn.execute("INSERT INTO import_row (day) VALUES ('2026-11-05'), ('2026/11/05')")
        # '05/11/2026' is the 5th of November to a DMY session and the 11th of May to an MDY
        # one: keyed with one field order (year first), it is refused in every session alike
        hostile.execute("INSERT INTO import_row (day) VALUES ('2026-11-05')")
        with pytest.raises(psycopg.errors.DatetimeFieldOverflow):
            hostile.execute("INSERT INTO import_row (day) VALUES ('05/11/2026')")
        with pytest.raises(psycopg.errors.DatetimeFieldOverflow):
            conn.execute("INSERT INTO import_row (day) VALUES ('05/11/2026')")
        assert Counters(hostile).get(spec.name, dt.date(2026, 11, 5)) == 3
        assert conn.execute("SELECT count(*) FROM import_row").fetchone() == (3,)


@pytest.mark.parametrize(
    "value",
    ["2026-11-21", "0099-01-02", "0044-03-15 BC", "10000-01-01", "infinity", "-infinity"],
)
def test_date_text_is_iso_in_every_date_style(conn: Conn, value: str) -> None:
    conn.execute("SET DateStyle = 'ISO, YMD'")
    iso = conn.execute("SELECT %s::date::text", [value]).fetchone()
    for style in ("SQL, DMY", "German", "Postgres, MDY", "ISO, DMY"):
        conn.execute("SELECT set_config('datestyle', %s, false)", [style])
        assert (
            conn.execute(
                "SELECT pgcounters.date_text(pgcounters.date_key(%s::text))", [value]
            ).fetchone()
            == iso
        ), style
