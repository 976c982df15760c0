"""The pgcounters Django app: counters declared on models, kept by triggers."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate


class PgCountersConfig(AppConfig):
    name = "pgcounters.contrib.django"
    label = "pgcounters"
    verbose_name = "pgcounters"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from pgcounters.contrib.django import (
            checks,  # noqa: F401  (registers the checks)
            migration_deps,
        )
        from pgcounters.contrib.django.declarations import declared_counters
        from pgcounters.contrib.django.triggers import register

        for model, spec in declared_counters():
            register(model, spec)
        post_migrate.connect(_record_specs, sender=self)
        migration_deps.install()


def _record_specs(using: str, **kwargs: Any) -> None:
    """After migrate: record the declared specs, for verify, recount and status."""
    from pgcounters.contrib.django.db import psycopg_connection
    from pgcounters.contrib.django.declarations import declared_counters
    from pgcounters.triggers import follow, record

    with psycopg_connection(using) as conn:
        for _, spec in declared_counters():
            record(conn, spec)
        follow(conn)  # partitions and inheritance children of counted tables
