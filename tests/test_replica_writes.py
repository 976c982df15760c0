"""Rows written with session_replication_role = replica (logical replication's apply, some
restore tools), which PostgreSQL's triggers do not see by default: a counter either flags
itself stale until a recount, or counts them; it never says it is installed and exact while
it missed them. The truth is SQL written here by hand."""

from __future__ import annotations

import psycopg
import pytest

import blog_schema
from pgcounters import Counters, backfill, status, triggers
from pgcounters.connection import Conn
from pgcounters.errors import CounterBroken, InvalidCounterDefinition, UnknownCounter
from pgcounters.repair import recount
from pgcounters.status import get_status

ARTICLE = "blog.article.public_comments"
MODES = ["queued", "unlogged", "direct"]


def _replica(dsn: str) -> Conn:
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute("SET session_replication_role = replica")
    return conn


def _article_truth(conn: Conn) -> dict[int, int]:
    return dict(
        conn.execute(
            "SELECT a.id, count(c.id) FROM blog_article a LEFT JOIN blog_comment c"
            " ON c.article_id = a.id AND c.publish_status = 'public' GROUP BY a.id"
        ).fetchall()
    )


def _article_values(conn: Conn) -> dict[int, int]:
    pc = Counters(conn)
    return {a: pc.get(ARTICLE, a) for a in _article_truth(conn)}


@pytest.mark.parametrize("mode", MODES)
def test_by_default_a_counter_that_missed_replica_writes_is_stale_until_recounted(
    dsn: str, conn: Conn, mode: str
) -> None:
    blog_schema.create(conn)
    triggers.install(conn, blog_schema.specs(mode))
    conn.execute("INSERT INTO blog_comment (article_id, publish_status) VALUES (1, 'public')")
    with _replica(dsn) as replica:
        replica.execute(
            "INSERT INTO blog_comment (article_id, publish_status) VALUES (1, 'public'),"
            " (2, 'public')"
        )
    truth = _article_truth(conn)
    assert truth[1] == 2
    assert _article_values(conn)[1] == 1  # not counted, as PostgreSQL's triggers behave
    states = {d.name: d for d in triggers.drift(conn)}
    assert {n: d.state for n, d in states.items()} == {s.name: "stale" for s in blog_schema.specs()}
    assert "session_replication_role = replica" in states[ARTICLE].detail
    snapshot = get_status(conn)
    (section,) = [s for s in snapshot.sections if s.name == "triggers"]
    assert any(ARTICLE in line and "stale" in line for line in section.lines())
    assert f'pgcounters_trigger_drift{{counter="{ARTICLE}",state="stale"}} 1' in (
        status.prometheus(snapshot)
    )
    for spec in blog_schema.specs(mode):
        recount(conn, spec)
    assert _article_values(conn) == _article_truth(conn)
    assert all(d.state == "installed" for d in triggers.drift(conn))


@pytest.mark.parametrize("mode", MODES)
def test_a_counter_set_to_count_replica_writes_counts_them(dsn: str, conn: Conn, mode: str) -> None:
    blog_schema.create(conn)
    conn.execute(
        "CREATE TABLE blog_comment_archive () INHERITS (blog_comment)"
    )  # a descendant follows the choice too
    triggers.install(conn, blog_schema.specs(mode))
    for spec in blog_schema.specs(mode):
        triggers.set_replica_writes(conn, spec.name, "count")
    triggers.install(conn, blog_schema.specs(mode))  # installing again keeps the choice
    with _replica(dsn) as replica:
        replica.execute(
            "INSERT INTO blog_comment (article_id, publish_status) VALUES (1, 'public'),"
            " (2, 'public'), (2, 'private')"
        )
        replica.execute(
            "INSERT INTO blog_comment_archive (article_id, publish_status) VALUES (3, 'public')"
        )
        replica.execute("UPDATE blog_comment SET publish_status = 'public' WHERE article_id = 2")
        replica.execute("DELETE FROM blog_comment WHERE article_id = 1")
    conn.execute("INSERT INTO blog_comment (article_id, publish_status) VALUES (1, 'public')")
    assert _article_values(conn) == _article_truth(conn) == {1: 1, 2: 2, 3: 1, 4: 0, 5: 0}
    assert all(d.state == "installed" for d in triggers.drift(conn))
    # and back: flagged again
    triggers.set_replica_writes(conn, ARTICLE, "flag")
    with _replica(dsn) as replica:
        replica.execute(
            "INSERT INTO blog_comment (article_id, publish_status) VALUES (4, 'public')"
        )
    states = {d.name: d.state for d in triggers.drift(conn)}
    assert states[ARTICLE] == "stale"
    assert states["blog.user.public_comments"] == "installed"  # still counting them


def test_truncate_in_replica_mode_is_flagged(dsn: str, conn: Conn) -> None:
    blog_schema.create(conn)
    triggers.install(conn, blog_schema.specs())
    conn.execute("INSERT INTO blog_comment (article_id, publish_status) VALUES (1, 'public')")
    with _replica(dsn) as replica:
        replica.execute("TRUNCATE blog_comment")
    assert {d.state for d in triggers.drift(conn)} == {"stale"}


def _watch_states(conn: Conn) -> list[tuple[str, str]]:
    return [
        (str(name), str(state))
        for name, state in conn.execute(
            "SELECT tgname, tgenabled FROM pg_catalog.pg_trigger"
            " WHERE tgrelid = 'blog_comment'::regclass AND tgname LIKE 'pgc_replica_watch%'"
            " ORDER BY 1"
        ).fetchall()
    ]


def test_the_watch_is_enabled_in_replica_mode_only(dsn: str, conn: Conn) -> None:
    """Other sessions skip the watch triggers without evaluating their condition; a
    replica-mode session still fires them (the counters are flagged), and a watch an earlier
    version enabled in every mode is turned to replica mode when counters are followed."""
    blog_schema.create(conn)
    triggers.install(conn, blog_schema.specs())
    replica_only = [("pgc_replica_watch", "R"), ("pgc_replica_watch_trn", "R")]
    assert _watch_states(conn) == replica_only
    conn.execute("ALTER TABLE blog_comment ENABLE ALWAYS TRIGGER pgc_replica_watch")
    conn.execute("ALTER TABLE blog_comment ENABLE ALWAYS TRIGGER pgc_replica_watch_trn")
    triggers.follow(conn)
    assert _watch_states(conn) == replica_only
    conn.execute("INSERT INTO blog_comment (article_id, publish_status) VALUES (1, 'public')")
    assert {d.state for d in triggers.drift(conn)} == {"installed"}  # origin mode: no flag
    with _replica(dsn) as replica:
        replica.execute("UPDATE blog_comment SET publish_status = 'hidden'")
    assert {d.state for d in triggers.drift(conn)} == {"stale"}


def test_bad_choices_are_clear_errors(conn: Conn) -> None:
    blog_schema.create(conn)
    triggers.install(conn, blog_schema.specs())
    with pytest.raises(InvalidCounterDefinition, match="'flag' or 'count'"):
        triggers.set_replica_writes(conn, ARTICLE, "always")  # type: ignore[arg-type]
    with pytest.raises(UnknownCounter):
        triggers.set_replica_writes(conn, "no.such.counter", "count")


def test_a_failed_recount_keeps_the_stale_mark(dsn: str, conn: Conn) -> None:
    blog_schema.create(conn)
    triggers.install(conn, blog_schema.specs())
    with _replica(dsn) as replica:
        replica.execute(
            "INSERT INTO blog_comment (article_id, publish_status) VALUES (1, 'public')"
        )
    conn.execute("ALTER EVENT TRIGGER pgcounters_guard_ddl DISABLE")
    conn.execute("ALTER TABLE blog_comment RENAME COLUMN publish_status TO status")
    with pytest.raises(CounterBroken):
        recount(conn, ARTICLE)
    conn.execute("ALTER TABLE blog_comment RENAME COLUMN status TO publish_status")
    assert {d.name: d.state for d in triggers.drift(conn)}[ARTICLE] == "stale"
    recount(conn, ARTICLE)
    assert {d.name: d.state for d in triggers.drift(conn)}[ARTICLE] == "installed"
    assert _article_values(conn) == _article_truth(conn)


def test_a_completed_backfill_clears_the_stale_mark(dsn: str, conn: Conn) -> None:
    blog_schema.create(conn)
    triggers.install(conn, blog_schema.specs())
    with _replica(dsn) as replica:
        replica.execute(
            "INSERT INTO blog_comment (article_id, publish_status) VALUES (1, 'public'),"
            " (2, 'public'), (3, 'public')"
        )
    assert {d.name: d.state for d in triggers.drift(conn)}[ARTICLE] == "stale"
    with conn.transaction():
        backfill.request(conn, triggers.spec(conn, ARTICLE))
    backfill.run(conn, [ARTICLE], batch_size=2)
    assert backfill.pending(conn) == []
    assert {d.name: d.state for d in triggers.drift(conn)}[ARTICLE] == "installed"
    assert _article_values(conn) == _article_truth(conn)


def test_a_mark_made_while_a_backfill_runs_stays(dsn: str, conn: Conn) -> None:
    blog_schema.create(conn)
    triggers.install(conn, blog_schema.specs())
    with _replica(dsn) as replica:
        replica.execute(
            "INSERT INTO blog_comment (article_id, publish_status) VALUES (4, 'public')"
        )
    with conn.transaction():
        backfill.request(conn, triggers.spec(conn, ARTICLE))
    assert backfill.step(conn, batch_size=2) == 2  # articles 1 and 2 backfilled
    with _replica(dsn) as replica:  # a key the backfill has passed: missed again
        replica.execute(
            "INSERT INTO blog_comment (article_id, publish_status) VALUES (1, 'public')"
        )
    backfill.run(conn, [ARTICLE], batch_size=2)
    assert backfill.pending(conn) == []
    assert {d.name: d.state for d in triggers.drift(conn)}[ARTICLE] == "stale"
    assert _article_values(conn)[1] == _article_truth(conn)[1] - 1
    recount(conn, ARTICLE)
    assert {d.name: d.state for d in triggers.drift(conn)}[ARTICLE] == "installed"
