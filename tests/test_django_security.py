"""`manage.py pgcounters grant`: the shared parser's grant verb on the Django database."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection

from pgcounters.contrib.django.db import dsn
from roles import login_role

pytestmark = pytest.mark.django_db(transaction=True)


def test_manage_py_grants_an_application_role() -> None:
    with login_role(dsn(), "pgc_django") as (role, _):
        out = StringIO()
        call_command("pgcounters", "grant", "--app", role, stdout=out)
        with connection.cursor() as cur:
            cur.execute(
                "SELECT has_table_privilege(%s, 'pgcounters.queue', 'INSERT'),"
                " has_table_privilege(%s, 'pgcounters.counters', 'UPDATE'),"
                " has_function_privilege(%s, 'pgcounters.drain_batch(integer, boolean)',"
                " 'EXECUTE')",
                [role, role, role],
            )
            assert cur.fetchone() == (True, False, False)
        call_command("pgcounters", "grant", "--revoke", role, "-q", stdout=out)
        with connection.cursor() as cur:
            cur.execute("SELECT has_table_privilege(%s, 'pgcounters.queue', 'INSERT')", [role])
            assert cur.fetchone() == (False,)
