"""The page-view counter of articles: a named counter fed by the application, not a trigger."""

from __future__ import annotations

from typing import Any

from django.db import migrations

from pgcounters import Counters
from pgcounters.contrib.django.db import psycopg_connection

VIEWS = "blog.article.views"


def create(apps: Any, schema_editor: Any) -> None:
    with psycopg_connection(schema_editor.connection.alias) as conn:
        Counters(conn).create_counter(VIEWS, key=int)


def drop(apps: Any, schema_editor: Any) -> None:
    with psycopg_connection(schema_editor.connection.alias) as conn:
        Counters(conn).drop_counter(VIEWS)


class Migration(migrations.Migration):
    dependencies = [("blog", "0001_initial")]

    operations = [migrations.RunPython(create, drop)]
