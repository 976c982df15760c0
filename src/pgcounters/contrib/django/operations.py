"""Django migration operations that run the SQL shipped in the package.

Each Django migration of this app applies one file of ``pgcounters/sql/migrations``
and records its version in ``pgcounters.migrations``, exactly as
``pgcounters install`` does: both deliveries give the same schema, and a
database installed by one is recognised by the other (an applied version is
skipped).
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

from pgcounters import sqlfiles


class ApplySchemaMigration(migrations.RunPython):
    """Apply one packaged schema migration if it is not applied yet."""

    reduces_to_sql = False

    def __init__(self, version: int) -> None:
        self.version = version
        super().__init__(self._forwards, migrations.RunPython.noop, atomic=True)

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        return (f"{__name__}.{type(self).__name__}", [self.version], {})

    def describe(self) -> str:
        return f"Apply pgcounters schema migration {self.version:04d}"

    def _forwards(self, apps: Any, schema_editor: Any) -> None:
        migration = next(m for m in sqlfiles.migrations() if m.version == self.version)
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(sqlfiles.query("install_lock"))
            cursor.execute(sqlfiles.query("schema_exists"))
            if cursor.fetchone()[0]:
                cursor.execute(
                    "SELECT 1 FROM pgcounters.migrations WHERE version = %s", [self.version]
                )
                if cursor.fetchone():
                    return
            cursor.execute(migration.sql)
            cursor.execute(
                sqlfiles.query("record_migration"),
                {"version": migration.version, "name": migration.name},
            )
