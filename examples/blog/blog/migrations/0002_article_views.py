"""The page-view counter of articles: a named counter fed by the application, not a trigger."""

from __future__ import annotations

from typing import Any

from django.db import migrations

from pgcounters import Counters
from pgcounters.contrib.django import psycopg_connection

VIEWS = "blog.article.views"


# check_schema=False: a migration runs against the schema version of its dependencies,
# which is older than the package's once the package ships a newer schema migration
def create(apps: Any, schema_editor: Any) -> None:
    with psycopg_connection(schema_editor.connection.alias) as conn:
        Counters(conn, check_schema=False).create_counter(VIEWS, key=int)


def drop(apps: Any, schema_editor: Any) -> None:
    with psycopg_connection(schema_editor.connection.alias) as conn:
        Counters(conn, check_schema=False).drop_counter(VIEWS)


class Migration(migrations.Migration):
    dependencies = [("blog", "0001_initial")]

    operations = [migrations.RunPython(create, drop)]
