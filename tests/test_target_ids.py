"""A declared counter's trigger finds its counter's id in its statement's plan.

``pgcounters.refresh_target_ids`` lists the ids of the integer counters in the body of
``pgcounters._target_id``; a trigger calls it with its counter's identity as a constant,
so PostgreSQL folds the id into the plan and calls ``ensure_target`` only for a counter
that is not listed. Every test here checks the counts against the truth as well.
"""

from __future__ import annotations

import threading

import psycopg
import pytest

import blog_schema
import truth
from pgcounters import Counters, triggers
from pgcounters.compiler import target_identity
from pgcounters.connection import Conn
from pgcounters.specs import ColumnTarget, CounterSpec
from pgcounters.worker import Worker, WorkerSettings
from support import running, wait_for

ENSURE = "pgcounters.ensure_target(text, text[], text, text, text, text, text)"
ARTICLE = "blog.article.public_comments"
TRUTHS = blog_schema.truths()
FAST = WorkerSettings(min_interval=0.01, max_interval=0.05, log_every=0)


@pytest.fixture
def blog(conn: Conn) -> Conn:
    blog_schema.create(conn)
    triggers.install(conn, blog_schema.specs())
    return conn


def spec_named(name: str) -> CounterSpec:
    return next(spec for spec in blog_schema.specs() if spec.name == name)


def listed(conn: Conn, spec: CounterSpec) -> int | None:
    row = conn.execute("SELECT pgcounters._target_id(%s)", (target_identity(spec),)).fetchone()
    assert row is not None
    return None if row[0] is None else int(row[0])


def target_id(conn: Conn, name: str) -> int | None:
    row = conn.execute("SELECT id FROM pgcounters.targets WHERE name = %s", (name,)).fetchone()
    return None if row is None else int(row[0])


def comment(c: Conn, article: int = 1) -> None:
    c.execute(
        "INSERT INTO blog_comment (article_id, creator_id, publish_status, score)"
        " VALUES (%s, 1, 'public', 3)",
        (article,),
    )


def calls(c: Conn) -> int:
    """The calls of ensure_target this session made and has not yet sent to the statistics
    (track_functions on): they add up over transactions until then."""
    row = c.execute(
        "SELECT pg_stat_get_xact_function_calls(%s::regprocedure)", (ENSURE,)
    ).fetchone()
    assert row is not None
    return int(row[0] or 0)


def lookups(c: Conn, article: int) -> int:
    """How many times a comment's statement called ensure_target."""
    before = calls(c)
    comment(c, article)
    return calls(c) - before


def unlist(dsn: str) -> None:
    """Empty the list the way the function says it does outside read committed."""
    with psycopg.connect(dsn) as c:
        c.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        assert c.execute("SELECT pgcounters.refresh_target_ids()").fetchone() == (0,)


def test_an_install_lists_each_integer_counter_under_the_identity_its_triggers_name(
    blog: Conn,
) -> None:
    specs = blog_schema.specs()
    assert any(spec.scale is None for spec in specs)
    for spec in specs:
        expected = target_id(blog, spec.name) if spec.scale is None else None
        assert listed(blog, spec) == expected, spec.name
    # the identity the database writes is the one the compiler writes, character for
    # character, whatever the names of the table and columns hold
    for odd in ['a"b', "back\\slash", "tab\there", "née ☃", "nl\nx", "\x01"]:
        row = blog.execute(
            "SELECT pgcounters._target_identity('c', '{bigint}', 'queued', 'public', %s, %s, 'id')",
            (odd, odd + "_n"),
        ).fetchone()
        column = CounterSpec(
            name="c", source="blog_comment", keys=("article_id",),
            target=ColumnTarget(odd, odd + "_n"),
        )  # fmt: skip
        assert row == (target_identity(column),), odd


def test_a_listed_counters_trigger_looks_nothing_up(blog: Conn, dsn: str) -> None:
    with psycopg.connect(dsn) as c:
        c.execute("SET track_functions = 'all'")
        assert lookups(c, 1) == 0
        c.commit()
        # the same session, its plans made: once the list is emptied it plans again and
        # each counter of the table looks its id up
        unlist(dsn)
        integers = [s for s in blog_schema.specs() if s.scale is None]
        assert lookups(c, 2) == len(integers)
        c.commit()
        blog.execute("SELECT pgcounters.refresh_target_ids()")
        assert lookups(c, 3) == 0
        c.commit()
    truth.assert_drained(blog, TRUTHS)


def test_a_dropped_counter_is_unlisted_when_its_drop_commits(blog: Conn, dsn: str) -> None:
    spec = spec_named(ARTICLE)
    first = listed(blog, spec)
    assert first is not None
    with psycopg.connect(dsn, autocommit=True) as writer:
        comment(writer)  # its plans hold the id
        with blog.transaction():
            assert blog.execute("SELECT pgcounters.drop_counter(%s)", (ARTICLE,)).fetchone() == (
                True,
            )
            # not yet committed: the list still has it for everyone else
            assert listed(writer, spec) == first
        assert listed(blog, spec) is None
        # the triggers stay: the next write declares the counter again, under a new id
        comment(writer, 2)
    second = target_id(blog, ARTICLE)
    assert second is not None
    assert second != first
    blog.execute("SELECT pgcounters.refresh_target_ids()")
    assert listed(blog, spec) == second
    # nothing was written for the dropped id, and nothing set aside
    assert blog.execute(
        "SELECT count(*) FROM pgcounters.queue WHERE target_id = %s", (first,)
    ).fetchone() == (0,)
    Counters(blog).drain()
    assert blog.execute("SELECT count(*) FROM pgcounters.quarantine").fetchone() == (0,)
    assert blog.execute("SELECT public_comments FROM blog_article WHERE id = 2").fetchone() == (1,)


def test_refreshes_take_turns_and_a_worker_never_waits_for_one(blog: Conn, dsn: str) -> None:
    with psycopg.connect(dsn) as holder, psycopg.connect(dsn, autocommit=True) as other:
        holder.execute("SELECT pgcounters.refresh_target_ids()")  # holds the list's lock
        # a worker's refresh returns at once when another is writing the list
        assert other.execute("SELECT pgcounters.refresh_target_ids(false)").fetchone() == (None,)
        done: list[object] = []

        def refresh() -> None:
            with psycopg.connect(dsn, autocommit=True) as c:
                done.append(c.execute("SELECT pgcounters.refresh_target_ids()").fetchone())

        thread = threading.Thread(target=refresh)
        thread.start()
        wait_for(
            lambda: (
                other.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    " AND query LIKE '%%refresh_target_ids()%%'"
                ).fetchone()
                == (1,)
            )
        )
        assert done == []
        holder.commit()
        thread.join(timeout=60)
        integers = [s for s in blog_schema.specs() if s.scale is None]
        assert done == [(len(integers),)]


def test_a_worker_lists_a_counter_its_first_write_created(blog: Conn, dsn: str) -> None:
    spec = spec_named(ARTICLE)
    blog.execute("SELECT pgcounters.drop_counter(%s)", (ARTICLE,))
    with psycopg.connect(dsn, autocommit=True) as c:
        comment(c)  # declares it again, under an id not listed yet
    assert listed(blog, spec) is None
    worker = Worker(dsn, FAST)
    with running(worker) as errors:
        wait_for(lambda: listed(blog, spec) == target_id(blog, ARTICLE))
    assert errors == []
    with psycopg.connect(dsn) as c:
        c.execute("SET track_functions = 'all'")
        assert lookups(c, 2) == 0
        c.commit()
    Counters(blog).drain()
    assert blog.execute(
        "SELECT public_comments FROM blog_article WHERE id IN (1, 2) ORDER BY id"
    ).fetchall() == [(1,), (1,)]
