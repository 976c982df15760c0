"""Counted tables with partitions or inheritance children: rows written into a descendant,
moved between partitions, truncated with one partition, attached and detached with a
partition, and partitions created later are all counted, in the three modes, against a truth
written here by hand over the root (which reads its whole tree)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgcounters import Counters, triggers
from pgcounters.connection import Conn
from pgcounters.dberrors import translate
from pgcounters.errors import CounterBroken
from pgcounters.specs import ColumnTarget, CounterSpec, Fragment, NamedTarget

MODES = ["queued", "unlogged", "direct"]

PARTITIONED = """
CREATE TABLE article (id bigint PRIMARY KEY, clicks bigint NOT NULL DEFAULT 0);
INSERT INTO article (id) SELECT generate_series(1, 4);
CREATE TABLE event (id bigserial, article_id bigint, kind text NOT NULL, n integer NOT NULL,
                    month integer NOT NULL) PARTITION BY LIST (month);
CREATE TABLE event_10 PARTITION OF event FOR VALUES IN (10);
CREATE TABLE event_11 PARTITION OF event FOR VALUES IN (11) PARTITION BY LIST (kind);
CREATE TABLE event_11_click PARTITION OF event_11 FOR VALUES IN ('click');
CREATE TABLE event_11_other PARTITION OF event_11 DEFAULT;
"""

INHERITED = """
CREATE TABLE article (id bigint PRIMARY KEY, clicks bigint NOT NULL DEFAULT 0);
INSERT INTO article (id) SELECT generate_series(1, 4);
CREATE TABLE event (id bigserial, article_id bigint, kind text NOT NULL, n integer NOT NULL,
                    month integer NOT NULL);
CREATE TABLE event_10 () INHERITS (event);
CREATE TABLE event_11 (extra text) INHERITS (event);
"""


def specs(mode: Any) -> list[CounterSpec]:
    return [
        CounterSpec(
            name="article.clicks",
            source="event",
            keys=("article_id",),
            target=ColumnTarget("article", "clicks"),
            where=Fragment("kind = %s", ("click",)),
            mode=mode,
        ),
        CounterSpec(
            name="events.n_per_article",
            source="event",
            keys=("article_id",),
            target=NamedTarget(("bigint",)),
            sum="n",
            mode=mode,
        ),
    ]


def assert_counted(conn: Conn) -> None:
    clicks = dict(
        conn.execute(
            "SELECT a.id, count(e.id) FROM article a"
            " LEFT JOIN event e ON e.article_id = a.id AND e.kind = 'click' GROUP BY a.id"
        ).fetchall()
    )
    sums = dict(
        conn.execute(
            "SELECT a.id, coalesce(sum(e.n), 0) FROM article a"
            " LEFT JOIN event e ON e.article_id = a.id GROUP BY a.id"
        ).fetchall()
    )
    pc = Counters(conn)
    got = {a: (pc.get("article.clicks", a), pc.get("events.n_per_article", a)) for a in clicks}
    assert got == {a: (clicks[a], sums[a]) for a in clicks}


def _insert(conn: Conn, table: str, rows: list[tuple[int, str, int, int]]) -> None:
    with conn.cursor() as cur:
        cur.executemany(
            f"INSERT INTO {table} (article_id, kind, n, month) VALUES (%s, %s, %s, %s)",  # noqa: S608 - a test's own table names
            rows,
        )


@pytest.mark.parametrize("mode", MODES)
def test_writes_into_partitions_are_counted(conn: Conn, mode: str) -> None:
    conn.execute(PARTITIONED)
    _insert(conn, "event", [(1, "click", 1, 10)])  # before the counters: counted with its partition
    triggers.install(conn, specs(mode))
    _insert(conn, "event", [(1, "click", 2, 10), (2, "view", 3, 11), (2, "click", 4, 11)])
    _insert(conn, "event_10", [(3, "click", 5, 10)])  # straight into a partition
    _insert(conn, "event_11_click", [(3, "click", 6, 11), (4, "click", 7, 11)])  # a leaf
    _insert(conn, "event_11", [(4, "view", 8, 11)])  # a partition that is partitioned
    conn.execute("UPDATE event SET month = 11 WHERE article_id = 1")  # across partitions
    conn.execute("UPDATE event_11_click SET article_id = 2 WHERE article_id = 4")
    conn.execute("UPDATE event SET kind = 'click' WHERE kind = 'view' AND article_id = 4")
    conn.execute("DELETE FROM event_10 WHERE article_id = 3")
    with (
        conn.cursor() as cur,
        cur.copy("COPY event_10 (article_id, kind, n, month) FROM STDIN") as cp,
    ):
        cp.write_row((1, "click", 9, 10))
    assert_counted(conn)
    Counters(conn).drain()
    assert_counted(conn)


@pytest.mark.parametrize("mode", MODES)
def test_truncate_of_one_partition_and_of_the_table(conn: Conn, mode: str) -> None:
    conn.execute(PARTITIONED)
    triggers.install(conn, specs(mode))
    _insert(conn, "event", [(1, "click", 2, 10), (2, "click", 3, 11), (2, "view", 4, 11)])
    conn.execute("TRUNCATE event_11_click")
    assert_counted(conn)
    conn.execute("TRUNCATE event_11")
    assert_counted(conn)
    _insert(conn, "event", [(3, "click", 5, 11)])
    conn.execute("TRUNCATE event")
    assert_counted(conn)
    _insert(conn, "event", [(3, "click", 5, 11)])
    Counters(conn).drain()
    assert_counted(conn)


@pytest.mark.parametrize("mode", MODES)
def test_partitions_created_attached_and_detached_later(conn: Conn, mode: str) -> None:
    conn.execute(PARTITIONED)
    triggers.install(conn, specs(mode))
    _insert(conn, "event", [(1, "click", 1, 10)])
    conn.execute("CREATE TABLE event_12 PARTITION OF event FOR VALUES IN (12)")
    _insert(conn, "event_12", [(2, "click", 2, 12)])
    conn.execute("CREATE TABLE event_9 (LIKE event INCLUDING DEFAULTS)")
    _insert(conn, "event_9", [(3, "click", 3, 9), (3, "view", 4, 9)])
    conn.execute("ALTER TABLE event ATTACH PARTITION event_9 FOR VALUES IN (9)")  # with rows
    assert_counted(conn)
    conn.execute("ALTER TABLE event DETACH PARTITION event_10")
    assert_counted(conn)
    _insert(conn, "event_10", [(1, "click", 100, 10)])  # no longer part of the table
    assert_counted(conn)
    assert all(d.state == "installed" for d in triggers.drift(conn)), triggers.drift(conn)
    # dropping a partition still attached would take its rows away unseen: refused
    with pytest.raises(psycopg.Error, match=r"Detach it first|unseen") as caught:
        conn.execute("DROP TABLE event_12")
    assert isinstance(translate(caught.value), CounterBroken)
    conn.execute("ALTER TABLE event DETACH PARTITION event_12")
    conn.execute("DROP TABLE event_12")
    conn.execute("DROP TABLE event_10")  # detached before: nothing to refuse
    assert_counted(conn)
    Counters(conn).drain()
    assert_counted(conn)


@pytest.mark.parametrize("mode", MODES)
def test_inheritance_children_are_counted(conn: Conn, mode: str) -> None:
    conn.execute(INHERITED)
    triggers.install(conn, specs(mode))
    _insert(conn, "event", [(1, "click", 1, 10)])
    _insert(conn, "event_10", [(2, "click", 2, 10), (2, "view", 3, 10)])
    conn.execute(
        "INSERT INTO event_11 (article_id, kind, n, month, extra) VALUES (3, 'click', 4, 11, 'x')"
    )
    conn.execute("UPDATE event SET article_id = 4 WHERE article_id = 2")  # reaches the children
    conn.execute("DELETE FROM event WHERE kind = 'view'")
    assert_counted(conn)
    conn.execute("ALTER TABLE event_11 NO INHERIT event")  # its rows leave the table
    assert_counted(conn)
    conn.execute("ALTER TABLE event_11 INHERIT event")  # and come back
    assert_counted(conn)
    conn.execute("CREATE TABLE event_12 () INHERITS (event)")
    _insert(conn, "event_12", [(1, "click", 5, 12)])
    conn.execute("TRUNCATE event_10")
    assert_counted(conn)
    # TRUNCATE ONLY of the table would leave its children's rows counting: refused
    with pytest.raises(psycopg.Error, match="TRUNCATE ONLY") as caught:
        conn.execute("TRUNCATE ONLY event")
    assert isinstance(translate(caught.value), CounterBroken)
    assert_counted(conn)
    conn.execute("TRUNCATE event")  # the whole tree: every count is zero
    assert conn.execute("SELECT count(*) FROM event").fetchone() == (0,)
    assert_counted(conn)
    _insert(conn, "event_12", [(1, "click", 6, 12)])
    Counters(conn).drain()
    assert_counted(conn)


def test_without_the_guard_an_unfollowed_partition_is_reported(
    conn: Conn,
) -> None:
    """Where a non-superuser installed the schema (no event trigger): drift says which table
    is not counted, and installing again follows it."""
    conn.execute(PARTITIONED)
    triggers.install(conn, specs("queued"))
    conn.execute("ALTER EVENT TRIGGER pgcounters_guard_ddl DISABLE")
    conn.execute('CREATE TABLE "event 12" PARTITION OF event FOR VALUES IN (12)')
    states = {d.name: d for d in triggers.drift(conn)}
    assert states["article.clicks"].state == "missing"
    assert '"event 12" is not counted' in states["article.clicks"].detail
    triggers.install(conn, specs("queued"))
    assert all(d.state == "installed" for d in triggers.drift(conn))
    _insert(conn, '"event 12"', [(1, "click", 1, 12)])
    assert_counted(conn)


def test_a_partition_of_a_counter_delivered_by_django_is_followed_and_kept(
    conn: Conn,
) -> None:
    """django-pgtrigger names a trigger pgtrigger_<name>_<id>: the partitions of such a
    counter are followed, and dropping one still attached is refused, as for pgc_<name>."""
    conn.execute(PARTITIONED)
    triggers.install(conn, specs("queued"))
    for (name,) in conn.execute(
        "SELECT tgname FROM pg_trigger WHERE tgrelid = 'event'::regclass AND tgname LIKE 'pgc%'"
    ).fetchall():
        conn.execute(
            sql.SQL("ALTER TRIGGER {} ON event RENAME TO {}").format(
                sql.Identifier(name), sql.Identifier(f"pgtrigger_{name}_1a2b3")
            )
        )
    conn.execute("CREATE TABLE event_12 PARTITION OF event FOR VALUES IN (12)")
    _insert(conn, "event_12", [(1, "click", 5, 12)])
    assert_counted(conn)
    with pytest.raises(psycopg.Error, match="unseen"):
        conn.execute("DROP TABLE event_12")
    conn.execute("ALTER TABLE event DETACH PARTITION event_12")
    conn.execute("DROP TABLE event_12")
    assert_counted(conn)


def test_a_merge_moving_a_row_to_another_partition_is_not_seen_and_recount_repairs_it(
    conn: Conn,
) -> None:
    """A documented limit of PostgreSQL: the UPDATE action of a MERGE that moves a row to
    another partition hands the statement triggers neither row (a plain UPDATE that moves
    one hands both). verify finds the difference and recount repairs it."""
    from pgcounters.repair import recount, verify

    conn.execute(
        "CREATE TABLE ev (id int, region text, parent_id bigint, code text)"
        " PARTITION BY LIST (region);"
        "CREATE TABLE ev_eu PARTITION OF ev FOR VALUES IN ('eu');"
        "CREATE TABLE ev_us PARTITION OF ev FOR VALUES IN ('us');"
        "INSERT INTO ev VALUES (1, 'us', 2, 'm2'), (2, 'us', 3, 'm3')"
    )
    spec = CounterSpec(
        name="ev.per_parent", source="ev", keys=("parent_id",), target=NamedTarget(("bigint",))
    )
    triggers.install(conn, [spec])
    pc = Counters(conn)
    parents = [2, 3, 4, 5]
    conn.execute("UPDATE ev SET region = 'eu', parent_id = 4 WHERE code = 'm3'")
    # a plain UPDATE's move is counted: m2 under 2, m3 moved from 3 to 4
    assert pc.get_many("ev.per_parent", parents) == [1, 0, 1, 0]
    conn.execute(
        "MERGE INTO ev AS t USING (SELECT 'm2' AS code) AS s ON t.code = s.code"
        " WHEN MATCHED THEN UPDATE SET region = 'eu', parent_id = 5"
    )
    # m2 moved from 2 to 5 unseen: the values stay as they were
    assert pc.get_many("ev.per_parent", parents) == [1, 0, 1, 0]
    report = verify(conn, "ev.per_parent")
    assert sorted((m.key, m.expected, m.actual) for m in report.mismatches) == [
        ((2,), 0, 1),
        ((5,), 1, 0),
    ]
    recount(conn, "ev.per_parent")
    assert pc.get_many("ev.per_parent", parents) == [0, 0, 1, 1]
