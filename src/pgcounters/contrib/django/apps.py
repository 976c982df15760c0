"""The pgcounters Django app: counters declared on models, kept by triggers."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate, pre_migrate
from psycopg import sql


class PgCountersConfig(AppConfig):
    name = "pgcounters.contrib.django"
    label = "pgcounters"
    verbose_name = "pgcounters"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from pgcounters.contrib.django import (
            checks,  # registers the checks
            migration_deps,
        )
        from pgcounters.contrib.django.declarations import declared_counters
        from pgcounters.contrib.django.pgtrigger_delivery import register

        # a declaration that does not compile (or a name declared twice) is left out: the
        # system check reports it (pgcounters.E001) instead of every command failing with
        # a traceback, and the others keep their triggers
        for model, spec in declared_counters(skip_broken=True):
            if model._meta.auto_created:
                # a many-to-many's automatic through model is in no migration: its
                # counters' triggers are installed after migrate (_record_specs)
                continue
            register(model, spec)
        pre_migrate.connect(_before_migrate, sender=self)
        post_migrate.connect(_record_specs, sender=self)
        migration_deps.install()
        checks.install_migrate_check()


# per database alias: the counters whose triggers were installed when migrate started,
# and those with a disabled trigger then
_live_before: dict[str, set[str]] = {}
_off_before: dict[str, set[str]] = {}


def _disabled(found: Any) -> set[str]:
    """The counters with a disabled trigger among ``found`` (installed triggers)."""
    return {t.spec_name for t in found if not t.enabled and not t.follower}


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
    from pgcounters.triggers import (
        declared,
        follow,
        installed,
        record,
        replace_changed_target,
        uninstall,
    )

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
        present = installed(conn)
        live = {t.spec_name for t in present}
        # counters whose triggers this migrate installed (again): their rows are counted
        # by a backfill, even under a definition recorded before (rows written while the
        # triggers were gone were not counted); likewise those whose disabled triggers it
        # replaced by enabled ones (a migration that installs triggers anew)
        live_before = _live_before.pop(using, live)
        live_before -= _off_before.pop(using, set()) - _disabled(present)
        with conn.transaction():
            before = {s.name: s.fingerprint for s in declared(conn)}
            for spec in specs:
                if spec.name not in live:
                    continue
                # a declaration whose key or target changed: its old counter is dropped
                # (its triggers, installed by the migration, refuse every write until then)
                replace_changed_target(conn, spec)
                conn.execute(sql.SQL(query("select_call")).format(call=ensure_target_call(spec)))
                record(conn, spec)
                if before.get(spec.name) != spec.fingerprint or spec.name not in live_before:
                    backfill.request(conn, spec)
            conn.execute(query("refresh_target_ids"))
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


def _before_migrate(using: str, plan: Any = None, apps: Any = None, **kwargs: Any) -> None:
    """Before migrate: note the counters whose triggers are installed (``_record_specs``
    backfills those whose triggers this migrate installs again), and uninstall the counters
    over a many-to-many's automatic through table whose counter column a migration of the
    plan drops (a removed ``CountField``, or an added one migrated backwards).

    Their triggers were installed by ``migrate`` (no migration holds them), so no migration
    removes them before the column goes, and the schema-change guard would refuse the
    drop. The counter goes with its column (values and recorded spec); a later migrate that
    adds the column again installs it again and backfills it."""
    from django.core.exceptions import FieldDoesNotExist
    from django.db.migrations.operations import AddField, RemoveField

    from pgcounters import schema
    from pgcounters.contrib.django.db import psycopg_connection
    from pgcounters.triggers import installed

    leaving: set[tuple[str, str]] = set()
    for migration, backwards in plan or ():
        for op in migration.operations:
            dropping = isinstance(op, AddField) if backwards else isinstance(op, RemoveField)
            if not dropping or apps is None:
                continue
            try:
                model = apps.get_model(migration.app_label, op.model_name)
                field = model._meta.get_field(op.name)
            except (LookupError, FieldDoesNotExist):
                continue
            column = getattr(field, "column", None)
            if isinstance(column, str):
                leaving.add((model._meta.db_table, column))
    with psycopg_connection(using) as conn:
        if leaving and schema.state(conn).current:
            _uninstall_through(conn, leaving)
        # the counters live before the plan: one whose triggers come back during it (a
        # migration rolled back, then applied again) missed the writes made meanwhile
        found = installed(conn)
        _live_before[using] = {t.spec_name for t in found}
        _off_before[using] = _disabled(found)


def _uninstall_through(conn: Any, leaving: set[tuple[str, str]]) -> None:
    """Uninstall the counters kept by triggers ``migrate`` installed (over an automatic
    through table) whose counter column, (table, column), is in ``leaving``."""
    from pgcounters.compiler import ALL_VIA_EVENTS, EVENTS, GUARD_EVENTS, trigger_name
    from pgcounters.specs import ColumnTarget
    from pgcounters.triggers import declared, installed, uninstall

    present = installed(conn)
    for spec in declared(conn):
        target = spec.target
        if not isinstance(target, ColumnTarget):
            continue
        if (target.table.name, target.column) not in leaving:
            continue
        own = {trigger_name(spec.name, event) for event in EVENTS + GUARD_EVENTS + ALL_VIA_EVENTS}
        mine = [t for t in present if t.spec_name == spec.name]
        # a counter delivered by migrations is removed by their RemoveTrigger operations
        if mine and all(t.trigger in own for t in mine):
            uninstall(conn, spec.name, drop_values=True)


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
    recorded = {s.name: s.fingerprint for s in triggers.declared(conn)}
    introspection = connections[using].introspection
    tables = set(introspection.table_names())
    chosen = []
    for model, spec in declared_counters():
        if not model._meta.auto_created:
            continue
        needed = {spec.source.name, *(step.table.name for step in spec.via)}
        target = getattr(spec.target, "table", None)
        if target is not None:
            needed.add(target.name)
        if not needed <= tables:
            continue
        column = getattr(spec.target, "column", None)
        if target is not None and column is not None:
            # a partial migrate (or one backwards) may have the table without the column
            with connections[using].cursor() as cur:
                described = introspection.get_table_description(cur, target.name)
            if column not in {c.name for c in described}:
                continue
        if not triggers.as_compiled(conn, spec, recorded):
            # only when they changed: installing them again takes locks on their tables
            # (and on the parent's), which a migrate with nothing to do must not
            chosen.append(spec)
    if chosen:
        triggers.install(conn, chosen, backfill=False)
