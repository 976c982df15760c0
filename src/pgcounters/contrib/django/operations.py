"""The Django migration operation that runs the SQL shipped in the package.

Each Django migration of this app applies one file of ``pgcounters/sql/migrations``,
named by that file (``ApplySchemaMigration("0008_drain_quarantine")``), through
the core's :func:`pgcounters.schema.apply_migration`: the same code as
``pgcounters upgrade``, under the same lock, recording the version in
``pgcounters.migrations``. A database installed by one delivery is recognised by
the other (an applied version is skipped).
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

from pgcounters import schema, sqlfiles
from pgcounters.contrib.django.db import raw_connection


class ApplySchemaMigration(migrations.RunPython):
    """Apply one packaged schema migration if it is not applied yet."""

    reduces_to_sql = False

    def __init__(self, migration: str | int) -> None:
        # a number is the form of migrations written before files were named
        found = (
            sqlfiles.migration(migration)
            if isinstance(migration, str)
            else sqlfiles.migration_numbered(migration)
        )
        self.migration = migration
        self.filename = found.filename
        super().__init__(self._forwards, migrations.RunPython.noop, atomic=True)

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        return (f"{__name__}.{type(self).__name__}", [self.migration], {})

    def describe(self) -> str:
        return f"Apply pgcounters schema migration {self.filename}"

    def _forwards(self, apps: Any, schema_editor: Any) -> None:
        schema.apply_migration(raw_connection(schema_editor.connection.alias), self.filename)
