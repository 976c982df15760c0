"""The pgcounters Django app: counters declared on models, kept by triggers."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate
from psycopg import sql


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
        from pgcounters.contrib.django.pgtrigger_delivery import register

        for model, spec in declared_counters():
            if model._meta.auto_created:
                # a many-to-many's automatic through model is in no migration: its
                # counters' triggers are installed after migrate (_record_specs)
                continue
            register(model, spec)
        post_migrate.connect(_record_specs, sender=self)
        migration_deps.install()


def _record_specs(using: str, verbosity: int = 1, **kwargs: Any) -> None:
    """After migrate: declare and record the counters, backfill new or changed ones.

    * every declared counter gets its target (``pgcounters list`` shows it at
      once) and its recorded spec (for verify, recount, status);
    * a counter recorded for the first time or with another definition is
      marked for a backfill in the same transaction, and the backfill runs here
      (``PGCOUNTERS_BACKFILL = "migrate"``, the default) or in the worker
      (``"worker"``);
    * a recorded counter no model declares any more and whose triggers are gone
      (a removed ``CountField``) is dropped: its spec, values and pending deltas;
    * each counter's ``replica_writes`` choice is applied where it changed.
    """
    from django.conf import settings

    from pgcounters import backfill, schema
    from pgcounters.compiler import ensure_target_call
    from pgcounters.contrib.django.db import psycopg_connection
    from pgcounters.contrib.django.declarations import declared_counters, replica_writes
    from pgcounters.sqlfiles import query
    from pgcounters.triggers import declared, follow, installed, record, uninstall

    when = getattr(settings, "PGCOUNTERS_BACKFILL", "migrate")
    if when not in ("migrate", "worker"):
        from pgcounters.contrib.django.errors import SettingsError

        raise SettingsError(f'PGCOUNTERS_BACKFILL must be "migrate" or "worker", got {when!r}')
    specs = [spec for _, spec in declared_counters()]
    with psycopg_connection(using) as conn:
        state = schema.state(conn)
        if not state.current:
            return  # a partial migrate: the pgcounters schema is not there (or not current) yet
        # counters whose triggers are installed: a partial migrate may not have created
        # the others' tables or columns yet (they are registered by a later migrate)
        _install_through_counters(conn, using)
        live = {t.spec_name for t in installed(conn)}
        with conn.transaction():
            before = {s.name: s.fingerprint for s in declared(conn)}
            for spec in specs:
                if spec.name not in live:
                    continue
                conn.execute(sql.SQL(query("select_call")).format(call=ensure_target_call(spec)))
                record(conn, spec)
                if before.get(spec.name) != spec.fingerprint:
                    backfill.request(conn, spec)
            chosen = replica_writes()
            for name, current in conn.execute(query("replica_writes_choices")).fetchall():
                wanted = chosen.get(name)
                if name in live and wanted is not None and wanted != current:
                    conn.execute(query("set_replica_writes"), {"name": name, "mode": wanted})
        follow(conn)  # partitions and inheritance children of counted tables
        names = {spec.name for spec in specs}
        for name in sorted(set(before) - names - live):
            uninstall(conn, name, drop_values=True)
            with conn.transaction():
                backfill.cancel(conn, name)
        if when == "migrate" and backfill.pending(conn):

            def report(name: str, keys: int) -> None:
                if verbosity >= 2:
                    print(f"  backfilled {keys} keys of {name}")

            done = backfill.run(conn, progress=report)
            if verbosity >= 1 and any(done.values()):
                for name, keys in sorted(done.items()):
                    print(f"  Backfilled counter {name}: {keys} keys")


def _install_through_counters(conn: Any, using: str) -> None:
    """Install the triggers of the counters over a many-to-many's automatic through table
    (no migration holds that model), once their tables exist; idempotent. Their backfill
    is requested here and runs with the others'. Such a counter no model declares any more
    loses its triggers here (its values then go as any removed counter's)."""
    from django.apps import apps
    from django.db import connections

    from pgcounters import triggers
    from pgcounters.contrib.django.declarations import declared_counters

    through = {m._meta.db_table for m in apps.get_models(include_auto_created=True)}
    through -= {m._meta.db_table for m in apps.get_models()}
    names = {spec.name for _, spec in declared_counters()}
    for name in sorted(
        {
            t.spec_name
            for t in triggers.installed(conn)
            # installed here (pgtrigger's names have its own prefix)
            if t.table in through and t.spec_name not in names and t.trigger.startswith("pgc_")
        }
    ):
        triggers.uninstall(conn, name)
    tables = set(connections[using].introspection.table_names())
    chosen = []
    for model, spec in declared_counters():
        if not model._meta.auto_created:
            continue
        needed = {spec.source.name, *(step.table.name for step in spec.via)}
        target = getattr(spec.target, "table", None)
        if target is not None:
            needed.add(target.name)
        if needed <= tables:
            chosen.append(spec)
    if chosen:
        triggers.install(conn, chosen, backfill=False)
