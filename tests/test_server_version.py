"""The oldest PostgreSQL pgcounters installs on is the oldest its tests run on (15): an older
server is refused with a clear error by `install`, `upgrade`, Django's migrations and the SQL
files themselves (PC023)."""

from __future__ import annotations

import psycopg
import pytest

from pgcounters import UnsupportedServer, schema, sqlfiles
from pgcounters.connection import Conn
from pgcounters.dberrors import translated
from pgcounters.sqlfiles import migration


def test_a_server_older_than_15_is_refused_and_15_is_not() -> None:
    with pytest.raises(UnsupportedServer, match=r"needs PostgreSQL 15 or later; .* PostgreSQL 14"):
        schema.check_server(140013)
    with pytest.raises(UnsupportedServer, match="PostgreSQL 9"):
        schema.check_server(90624)
    schema.check_server(150000)
    schema.check_server(180001)


def test_the_sql_files_refuse_an_older_server_with_their_own_code(conn: Conn) -> None:
    # the check of schema.sql and of the migration that added it, with the version it reads
    # made newer than this server, so that this server is "too old" for it
    version = conn.execute("SHOW server_version_num").fetchone()
    assert version is not None
    for text in (sqlfiles.schema().sql, migration("0032_read_plans").sql):
        start = text.index("DO $$\nBEGIN\n    IF current_setting('server_version_num')")
        block = text[start : text.index("$$;", start + 5) + 3]
        assert "< 150000" in block
        raised = block.replace("< 150000", f"< {int(version[0]) + 1}")
        with pytest.raises(UnsupportedServer, match="needs PostgreSQL 15 or later"), translated():
            conn.execute(raised)
    with pytest.raises(psycopg.Error) as refused:
        conn.execute(raised)
    assert refused.value.sqlstate == "PC023"
