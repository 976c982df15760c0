"""The SQL entry points check and canonicalise keys as the Python client does: each part
is cast to the counter's key type and stored in its canonical text, or refused."""

from __future__ import annotations

import datetime as dt
import uuid

import psycopg
import pytest

from pgcounters import Counters
from pgcounters.connection import Conn
from pgcounters.dberrors import translated
from pgcounters.errors import InvalidKey

U = uuid.UUID("6f1c2b7e-8a9d-4c3b-9e2f-0a1b2c3d4e5f")


def sql_incr(conn: Conn, name: str, key: list[str], delta: int = 1) -> None:
    with translated():
        conn.execute("SELECT pgcounters.incr(%s, %s::text[], %s)", (name, key, delta))


@pytest.mark.parametrize("mode", ["queued", "unlogged", "direct"])
def test_spellings_of_one_key_make_one_key(conn: Conn, pc: Counters, mode: str) -> None:
    pc.create_counter("k", key=(int, uuid.UUID, dt.date), mode=mode)  # type: ignore[arg-type]
    spellings = [
        ["7", str(U), "2026-01-05"],
        ["+7", str(U).upper(), "2026-1-5"],
        ["007", "{" + U.hex + "}", " 2026-01-5 "],
        [" 7 ", U.hex.upper(), "2026-01-05"],
    ]
    for key in spellings:
        sql_incr(conn, "k", key)
    pc.drain()
    assert pc.top("k") == [((7, U, dt.date(2026, 1, 5)), 4)]
    row = conn.execute("SELECT pgcounters.get('k', ARRAY['+07', %s, '2026-1-05'])", (U.hex,))
    assert row.fetchone() == (4,)


def test_the_canonical_date_does_not_depend_on_datestyle(conn: Conn, pc: Counters) -> None:
    pc.create_counter("d", key=dt.date)
    conn.execute("SET DateStyle = 'SQL, DMY'")
    sql_incr(conn, "d", ["2026-11-21"])
    conn.execute("RESET DateStyle")
    assert conn.execute("SELECT key FROM pgcounters.queue").fetchone() == ("{2026-11-21}",)
    pc.drain()
    assert pc.get("d", dt.date(2026, 11, 21)) == 1


@pytest.mark.parametrize(
    ("key", "message"),
    [
        (["abc"], "not a valid bigint"),
        (["1.5"], "not a valid bigint"),
        (["99999999999999999999"], "out of the bigint range"),
        (["7", "8"], "takes a key of"),
        ([], "takes a key of"),
    ],
)
def test_bad_bigint_keys_are_refused(
    conn: Conn, pc: Counters, key: list[str], message: str
) -> None:
    pc.create_counter("n", key=int)
    with pytest.raises(InvalidKey, match=message):
        sql_incr(conn, "n", key)
    assert pc.pending() == (0, 0)


@pytest.mark.parametrize(
    ("types", "key", "message"),
    [
        (uuid.UUID, ["not-a-uuid"], "not a valid uuid"),
        (dt.date, ["2026-02-30"], "not a valid date"),
        (dt.date, ["05/01/2026"], "not a valid date"),
        (dt.date, ["infinity"], "not a valid date"),
        (str, ["x" * 1001], "at most 1000"),
    ],
)
def test_bad_keys_of_other_types_are_refused(
    conn: Conn, pc: Counters, types: object, key: list[str], message: str
) -> None:
    pc.create_counter("c", key=types)
    with pytest.raises(InvalidKey, match=message):
        sql_incr(conn, "c", key)


def test_a_bigint_keyed_column_counter_refuses_a_text_key_from_sql(
    conn: Conn, pc: Counters
) -> None:
    conn.execute("CREATE TABLE p (id bigint PRIMARY KEY, n bigint NOT NULL DEFAULT 0)")
    conn.execute("INSERT INTO p VALUES (7)")
    pc.create_column_counter("p.n", "p", "n")
    with pytest.raises(InvalidKey, match="not a valid bigint"):
        sql_incr(conn, "p.n", ["abc"])
    sql_incr(conn, "p.n", ["+007"])
    assert conn.execute("SELECT key FROM pgcounters.queue").fetchone() == ("{7}",)
    pc.drain()
    assert conn.execute("SELECT n FROM p").fetchone() == (1,)


def test_add_direct_canonicalises_and_refuses(conn: Conn, pc: Counters) -> None:
    t = pc.create_counter("dd", key=int, mode="direct").id
    with translated():
        conn.execute("SELECT pgcounters.add_direct(%s, %s, %s)", ([t, t], ["{+3}", "{03}"], [1, 2]))
        conn.execute("SELECT pgcounters.add_direct(%s, %s, %s)", ([t], ["{3}"], [4]))
    assert conn.execute("SELECT key, value FROM pgcounters.counters").fetchall() == [(["3"], 7)]
    with pytest.raises(InvalidKey), translated():
        conn.execute("SELECT pgcounters.add_direct(%s, %s, %s)", ([t], ["{x}"], [1]))
    with pytest.raises(InvalidKey), translated():
        conn.execute("SELECT pgcounters.add_direct(%s, %s, %s)", ([t], ["{3"], [1]))


def test_the_upgrade_rekeys_what_sql_callers_wrote_before(empty_dsn: str) -> None:
    """Before schema version 8, SQL callers could write '007' next to '7' (a count split
    in two) and an upper-case UUID: the upgrade folds them into the canonical keys."""
    from pgcounters import sqlfiles
    from pgcounters.schema import upgrade

    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        with conn.transaction():
            for migration in sqlfiles.migrations():
                if migration.version <= 7:
                    conn.execute(migration.sql.encode())
                    conn.execute(
                        sqlfiles.query("record_migration"),
                        {"version": migration.version, "name": migration.name},
                    )
        conn.execute("SELECT pgcounters.create_counter('n', '{bigint,uuid}', 'queued')")
        conn.execute("SELECT pgcounters.create_counter('t', '{text}', 'queued')")
        for key, delta in ((["7", str(U)], 1), (["007", str(U).upper()], 2), (["+7", U.hex], 4)):
            conn.execute("SELECT pgcounters.incr('n', %s::text[], %s)", (key, delta))
        conn.execute("SELECT pgcounters.incr('t', '{007}', 1)")
        conn.execute("SELECT pgcounters.drain_batch(100)")  # stored, split in three
        conn.execute("SELECT pgcounters.incr('n', %s::text[], 8)", (["0007", str(U)],))
        conn.execute(
            "INSERT INTO pgcounters.queue (target_id, key, delta)"
            " SELECT id, '{abc', 16 FROM pgcounters.targets WHERE name = 'n'"
        )
        applied = upgrade(conn)
        assert applied[0] == 8  # and the versions after it
        assert applied == sorted(applied)
        pc = Counters(conn)
        assert pc.top("n") == [((7, U), 7)]
        assert pc.top("t") == [(("007",), 1)]  # text keys are kept as written
        result = pc.drain()
        assert (result.deltas, result.quarantined) == (1, 1)
        assert pc.top("n") == [((7, U), 15)]
