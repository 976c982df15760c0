"""The Django migrations of the app deliver the packaged SQL: each file once, in order."""

from __future__ import annotations

from django.db.migrations.loader import MigrationLoader

from pgcounters import sqlfiles
from pgcounters.contrib.django.operations import ApplySchemaMigration

APP = "pgcounters"


def _chain(loader: MigrationLoader) -> list[str]:
    """The app's migrations from the first to the last; fails unless they form one line."""
    graph = loader.graph
    nodes = {key for key in graph.nodes if key[0] == APP}
    roots = [n for n in nodes if not [p for p in graph.node_map[n].parents if p.key[0] == APP]]
    assert len(roots) == 1, f"the app's migrations have {len(roots)} first migrations: {roots}"
    chain = [roots[0]]
    while True:
        children = [c.key for c in graph.node_map[chain[-1]].children if c.key[0] == APP]
        assert len(children) <= 1, f"{chain[-1][1]} is followed by several migrations: {children}"
        if not children:
            break
        chain.append(children[0])
    assert set(chain) == nodes, f"migrations off the line: {sorted(nodes - set(chain))}"
    return [name for _, name in chain]


def test_every_sql_migration_has_one_django_migration_in_order() -> None:
    loader = MigrationLoader(None, ignore_no_migrations=True)
    applied: list[str] = []
    for name in _chain(loader):
        for operation in loader.disk_migrations[(APP, name)].operations:
            if isinstance(operation, ApplySchemaMigration):
                assert isinstance(operation.migration, str), (
                    f"{name} names its SQL file by number: "
                    f'write ApplySchemaMigration("{operation.filename}")'
                )
                applied.append(operation.filename)
    assert applied == [m.filename for m in sqlfiles.migrations()]


def test_the_line_starts_with_the_schema_and_ends_with_the_latest_sql_file() -> None:
    loader = MigrationLoader(None, ignore_no_migrations=True)
    chain = _chain(loader)
    assert chain[0] == "0001_schema"
    last = [
        op.filename
        for name in chain
        for op in loader.disk_migrations[(APP, name)].operations
        if isinstance(op, ApplySchemaMigration)
    ][-1]
    assert last == sqlfiles.migrations()[-1].filename
