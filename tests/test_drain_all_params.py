"""``CALL pgcounters.drain_all`` from a driver that sends its arguments as parameters (the
extended protocol: psycopg, JDBC, asyncpg), in autocommit mode, as the docs tell."""

from __future__ import annotations

from pgcounters import Counters
from pgcounters.connection import Conn


def test_drain_all_with_its_batch_size_as_a_parameter(conn: Conn, pc: Counters) -> None:
    pc.create_counter("n", key=int)
    for key in (1, 2, 2):
        pc.incr("n", key)
    assert conn.execute("CALL pgcounters.drain_all(%s)", (2,)).fetchone() == (3, 0, 0)
    rows = conn.execute("SELECT key, value FROM pgcounters.counters ORDER BY key").fetchall()
    assert rows == [(["1"], 1), (["2"], 2)]
