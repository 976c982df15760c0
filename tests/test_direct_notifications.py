"""Change notifications of direct-mode counters: reported after the writing transaction
commits (never before, never for one that rolls back), batched per statement, to the same
listeners as the drain's (the worker's callback, NOTIFY)."""

from __future__ import annotations

import asyncio
import logging

import psycopg
import pytest
from psycopg import sql

from pgcounters import AsyncCounters, Counters, security, status, triggers
from pgcounters.async_worker import AsyncWorker
from pgcounters.connection import Conn
from pgcounters.notifications import (
    CHANNEL,
    Changes,
    listen_direct,
    merge,
    parse_payload,
    take_direct,
    take_direct_batch,
    unlisten_direct,
)
from pgcounters.specs import ColumnTarget, CounterSpec, NamedTarget
from pgcounters.worker import Worker, WorkerSettings
from roles import login_role
from support import running, wait_for

FAST = WorkerSettings(min_interval=0.01, max_interval=0.05, log_every=0)


def _notes(conn: Conn) -> int:
    row = conn.execute("SELECT count(*) FROM pgcounters.direct_changes").fetchone()
    assert row is not None
    return int(row[0])


def _listeners(conn: Conn) -> int:
    row = conn.execute("SELECT count(*) FROM pgcounters.change_listeners").fetchone()
    assert row is not None
    return int(row[0])


@pytest.fixture
def blog(conn: Conn) -> Conn:
    """Articles with two direct counters of their comments: a column and a named one."""
    conn.execute("CREATE TABLE article (id bigint PRIMARY KEY, comments bigint DEFAULT 0)")
    conn.execute("CREATE TABLE comment (id serial PRIMARY KEY, article_id bigint)")
    conn.execute("INSERT INTO article (id) SELECT generate_series(1, 5)")
    triggers.install(
        conn,
        [
            CounterSpec(
                "article.comments",
                "comment",
                ColumnTarget("article", "comments"),
                keys="article_id",
                mode="direct",
            ),
            CounterSpec(
                "comments.per_article",
                "comment",
                NamedTarget(("bigint",)),
                keys="article_id",
                mode="direct",
            ),
        ],
    )
    return conn


def test_nothing_is_noted_while_no_worker_reports_changes(blog: Conn, pc: Counters) -> None:
    blog.execute("INSERT INTO comment (article_id) VALUES (1), (2)")
    pc.create_counter("views", int, mode="direct")
    pc.incr("views", 7)
    assert _notes(blog) == 0
    assert take_direct(blog) == {}


def test_changes_are_noted_once_per_statement_and_visible_after_the_commit(
    dsn: str, blog: Conn, pc: Counters
) -> None:
    assert listen_direct(blog) == 1
    with psycopg.connect(dsn) as writer:  # a transaction left open
        writer.execute(
            "INSERT INTO comment (article_id) SELECT 1 + i % 3 FROM generate_series(1, 300) AS i"
        )
        # one note per statement and counter, never one per row; none visible yet
        row = writer.execute("SELECT count(*) FROM pgcounters.direct_changes").fetchone()
        assert row == (2,)
        assert take_direct(blog) == {}
        writer.commit()
    want = {(1,), (2,), (3,)}
    assert take_direct(blog) == {"article.comments": want, "comments.per_article": want}
    assert _notes(blog) == 0  # taken: reported once
    assert take_direct(blog) == {}


def test_a_rolled_back_transaction_is_never_reported(dsn: str, blog: Conn) -> None:
    listen_direct(blog)
    with psycopg.connect(dsn) as writer:
        writer.execute("INSERT INTO comment (article_id) VALUES (4)")
        writer.rollback()
        writer.execute("INSERT INTO comment (article_id) VALUES (5)")
        writer.commit()
    assert take_direct(blog) == {"article.comments": {(5,)}, "comments.per_article": {(5,)}}


def test_an_update_reports_both_parents_and_a_net_zero_key_is_not_reported(blog: Conn) -> None:
    blog.execute("INSERT INTO comment (article_id) VALUES (1), (2)")
    listen_direct(blog)
    # comment 1 moves from article 1 to 3; comment 2 moves to 2 again (no change)
    blog.execute("UPDATE comment SET article_id = CASE id WHEN 1 THEN 3 ELSE 2 END")
    assert take_direct(blog) == {
        "article.comments": {(1,), (3,)},
        "comments.per_article": {(1,), (3,)},
    }


def test_increments_through_the_sql_interface_are_reported(conn: Conn, pc: Counters) -> None:
    pc.create_counter("likes", (int, str), mode="direct")
    listen_direct(conn)
    conn.execute("SELECT pgcounters.incr('likes', ARRAY['1', 'a'], 1)")
    conn.execute("SELECT pgcounters.incr('likes', ARRAY['2', 'b'], 0)")  # changes nothing
    conn.execute(
        "SELECT pgcounters.add_direct(ARRAY[t.id, t.id], ARRAY['{3,c}', '{04,d}'], ARRAY[2, 1])"
        " FROM pgcounters.targets AS t WHERE t.name = 'likes'"
    )
    assert take_direct(conn) == {"likes": {(1, "a"), (3, "c"), (4, "d")}}


def test_sql_increments_of_a_direct_counter_column_are_reported(
    dsn: str, blog: Conn, pc: Counters
) -> None:
    listen_direct(blog)
    with psycopg.connect(dsn, autocommit=True) as other:
        other.execute("SELECT pgcounters.incr('article.comments', ARRAY['2'], 1)")
        other.execute("SELECT pgcounters.incr('article.comments', ARRAY['3'], 0)")  # no change
        other.execute("SELECT pgcounters.incr('article.comments', ARRAY['99'], 1)")  # no row
        with other.transaction():
            other.execute("SELECT pgcounters.incr('article.comments', ARRAY['4'], 2)")
            other.execute("SELECT pgcounters.incr('article.comments', ARRAY['04'], -2)")
        other.execute("BEGIN")
        other.execute("SELECT pgcounters.incr('article.comments', ARRAY['5'], 1)")
        other.execute("ROLLBACK")  # rolled back: never reported
    assert _notes(blog) == 3
    assert take_direct(blog) == {"article.comments": {(2,), (4,)}}
    assert pc.get("article.comments", 2, exact=False) == 1
    assert pc.get("article.comments", 4, exact=False) == 0
    assert pc.get("article.comments", 5, exact=False) == 0


def test_the_last_worker_to_unregister_drops_the_notes_and_dead_ones_are_forgotten(
    dsn: str, blog: Conn
) -> None:
    with psycopg.connect(dsn, autocommit=True) as other:
        listen_direct(other)
        other_pid = other.info.backend_pid
    # that session is gone (a worker killed): the next one to register forgets it
    wait_for(lambda: _pid_gone(blog, other_pid))
    assert listen_direct(blog) == 1
    blog.execute("INSERT INTO comment (article_id) VALUES (1)")
    assert _notes(blog) == 2
    assert unlisten_direct(blog) == 0
    assert _notes(blog) == 0
    assert _listeners(blog) == 0
    blog.execute("INSERT INTO comment (article_id) VALUES (1)")
    assert _notes(blog) == 0


def _pid_gone(conn: Conn, pid: int) -> bool:
    row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
    return row == (0,)


def test_a_worker_reports_direct_changes_to_its_callback_and_listeners(
    dsn: str, blog: Conn, pc: Counters
) -> None:
    pc.create_counter("views", int, mode="direct")
    settings = WorkerSettings(
        min_interval=0.01, max_interval=0.05, log_every=0, notify=True, notify_interval=0
    )
    calls: list[Changes] = []
    worker = Worker(dsn, settings, on_change=calls.append)
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute(f"LISTEN {CHANNEL}")
        with running(worker) as errors:
            wait_for(lambda: _listeners(blog) == 1)
            blog.execute(
                "INSERT INTO comment (article_id) SELECT 1 + i % 2 FROM generate_series(1, 50) i"
            )
            with blog.transaction(force_rollback=True):
                blog.execute("INSERT INTO comment (article_id) VALUES (5)")
            blog.execute("SELECT pgcounters.incr('views', ARRAY['42'], 1)")
            wait_for(lambda: _all(_merged(calls)))
        assert errors == []
        received = [parse_payload(n.payload) for n in listener.notifies(timeout=0.5)]
    want: Changes = {
        "article.comments": {(1,), (2,)},
        "comments.per_article": {(1,), (2,)},
        "views": {(42,)},
    }
    assert _merged(calls) == want  # article 5's rolled-back comment is never reported
    texts: dict[str, set[tuple[str, ...]]] = {}
    for message in received:
        for name, keys in message.items():
            assert keys is not None
            texts.setdefault(name, set()).update(keys)
    assert texts == {n: {tuple(str(p) for p in k) for k in ks or ()} for n, ks in want.items()}
    # the worker unregistered as it stopped: direct writes note nothing any more
    assert _listeners(blog) == 0
    blog.execute("INSERT INTO comment (article_id) VALUES (3)")
    assert _notes(blog) == 0


def _merged(calls: list[Changes]) -> Changes:
    union: Changes = {}
    for c in list(calls):
        merge(union, c)
    return union


def _all(seen: Changes) -> bool:
    return (
        seen.get("views") == {(42,)}
        and seen.get("article.comments") == {(1,), (2,)}
        and seen.get("comments.per_article") == {(1,), (2,)}
    )


def test_a_worker_without_listeners_does_not_register(dsn: str, blog: Conn) -> None:
    worker = Worker(dsn, FAST)
    with running(worker) as errors:
        wait_for(lambda: worker.get_stats().rounds > 2)
        assert _listeners(blog) == 0
    assert errors == []


def test_a_granted_worker_role_reports_and_one_without_the_right_still_drains(
    dsn: str, conn: Conn, pc: Counters, caplog: pytest.LogCaptureFixture
) -> None:
    pc.create_counter("views", int)
    pc.create_counter("likes", int, mode="direct")
    with login_role(dsn, "pgc_worker") as (role, role_dsn):
        security.grant_worker(conn, role)
        calls: list[Changes] = []
        worker = Worker(role_dsn, FAST, on_change=calls.append)
        with running(worker) as errors:
            wait_for(lambda: _listeners(conn) == 1)
            conn.execute("SELECT pgcounters.incr('likes', ARRAY['1'], 1)")
            wait_for(lambda: _merged(calls).get("likes") == {(1,)})
        assert errors == []
        # a role granted before these functions existed: the drain's changes only
        conn.execute(
            sql.SQL("REVOKE EXECUTE ON FUNCTION pgcounters.listen_direct_changes() FROM {}").format(
                sql.Identifier(role)
            )
        )
        calls.clear()
        worker = Worker(role_dsn, FAST, on_change=calls.append)
        with caplog.at_level(logging.WARNING, "pgcounters.worker"), running(worker) as errors:
            pc.incr("views", 5)
            wait_for(lambda: _merged(calls).get("views") == {(5,)})
        assert errors == []
        assert "changes of direct-mode counters are not reported" in caplog.text
        assert _listeners(conn) == 0


def _kill(conn: Conn, pid: int) -> None:
    conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
    wait_for(lambda: _pid_gone(conn, pid))


def test_a_killed_worker_leaves_no_notes_growing_and_the_next_worker_forgets_it(
    dsn: str, blog: Conn, pc: Counters
) -> None:
    pc.create_counter("views", int, mode="direct")
    dead = psycopg.connect(dsn, autocommit=True)
    listen_direct(dead)
    blog.execute("SELECT pgcounters.incr('views', ARRAY['1'], 1)")
    assert _notes(blog) == 1
    _kill(blog, dead.info.backend_pid)
    dead.close()
    # its registration is left behind, but nobody alive will report: nothing is noted
    assert _listeners(blog) == 1
    for i in range(100):
        blog.execute("SELECT pgcounters.incr('views', ARRAY[%s], 1)", (str(i),))
    blog.execute("INSERT INTO comment (article_id) VALUES (1)")
    pc.incr("views", 7)
    pc.incr_many([("views", 8, 1), ("article.comments", 2, 1)])
    blog.execute(
        "SELECT pgcounters.add_direct(ARRAY[t.id, t.id], ARRAY['{1}', '{2}'], ARRAY[1, 1])"
        " FROM pgcounters.targets AS t WHERE t.name = 'views'"
    )
    assert _notes(blog) == 1
    # any worker, reporting or not, forgets it as it sets up, and the note nobody reported
    worker = Worker(dsn, FAST)
    with running(worker) as errors:
        wait_for(lambda: worker.get_stats().rounds > 0)
        assert _listeners(blog) == 0
        assert _notes(blog) == 0
    assert errors == []


def test_an_async_worker_forgets_the_registration_of_a_killed_worker(dsn: str, blog: Conn) -> None:
    dead = psycopg.connect(dsn, autocommit=True)
    listen_direct(dead)
    _kill(blog, dead.info.backend_pid)
    dead.close()
    assert _listeners(blog) == 1

    async def main() -> None:
        async with AsyncWorker(dsn, FAST) as worker:
            for _ in range(3000):
                if worker.get_stats().rounds > 0:
                    break
                await asyncio.sleep(0.02)
            assert _listeners(blog) == 0

    asyncio.run(main())


def _view_statements(conn: Conn, n: int) -> None:
    for i in range(n):
        conn.execute("SELECT pgcounters.incr('views', ARRAY[%s], 1)", (str(i),))


def test_a_worker_takes_direct_notes_at_once_while_takes_are_full(
    dsn: str, conn: Conn, pc: Counters
) -> None:
    pc.create_counter("views", int, mode="direct")
    listen_direct(conn)  # another reporting session: the notes wait for the worker
    _view_statements(conn, 35)
    calls: list[Changes] = []
    # idle rounds an hour apart: only a full take makes the worker go on at once
    slow = WorkerSettings(batch_size=10, min_interval=3600, max_interval=3600, log_every=0)
    worker = Worker(dsn, slow, on_change=calls.append)
    with running(worker) as errors:
        wait_for(lambda: _notes(conn) == 0, timeout=30)
        assert _merged(calls) == {"views": {(i,) for i in range(35)}}
    assert errors == []


def test_a_stopping_worker_reports_every_committed_note_first(
    dsn: str, conn: Conn, pc: Counters
) -> None:
    pc.create_counter("views", int, mode="direct")
    listen_direct(conn)
    calls: list[Changes] = []
    slow = WorkerSettings(batch_size=10, min_interval=3600, max_interval=3600, log_every=0)
    worker = Worker(dsn, slow, on_change=calls.append)
    with running(worker) as errors:
        wait_for(lambda: worker.get_stats().rounds > 0 and _listeners(conn) == 2)
        _view_statements(conn, 35)  # while the worker waits for its next round
    assert errors == []
    assert _merged(calls) == {"views": {(i,) for i in range(35)}}
    assert _notes(conn) == 0
    assert _listeners(conn) == 1


def test_take_direct_batch_says_how_many_notes_it_took(conn: Conn, pc: Counters) -> None:
    pc.create_counter("views", int, mode="direct")
    listen_direct(conn)
    for _ in range(3):
        conn.execute("SELECT pgcounters.incr('views', ARRAY['5'], 1)")
    assert take_direct_batch(conn, 2) == ({"views": {(5,)}}, 2)
    assert take_direct_batch(conn, 2) == ({"views": {(5,)}}, 1)
    assert take_direct_batch(conn, 2) == ({}, 0)


def _client_writes_sync(pc: Counters) -> None:
    pc.incr("views", 1, 1)  # the first increment of a key: the upsert
    pc.incr("views", 1, 1)  # the row exists: the update
    pc.incr("views", 2, 0)  # changes nothing
    pc.incr("pairs", (1, "a"), 2)
    pc.incr_many([("views", 3, 1), ("views", 4, 1), ("views", 5, 1), ("views", 5, -1)])
    pc.incr("article.comments", 2, 1)  # a direct counter column
    pc.incr_many([("article.comments", 3, 1), ("views", 6, 1)])


async def _client_writes_async(pc: AsyncCounters) -> None:
    await pc.incr("views", 1, 1)
    await pc.incr("views", 1, 1)
    await pc.incr("views", 2, 0)
    await pc.incr("pairs", (1, "a"), 2)
    await pc.incr_many([("views", 3, 1), ("views", 4, 1), ("views", 5, 1), ("views", 5, -1)])
    await pc.incr("article.comments", 2, 1)
    await pc.incr_many([("article.comments", 3, 1), ("views", 6, 1)])


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_direct_increments_through_the_python_client_are_reported(
    dsn: str, blog: Conn, pc: Counters, flavour: str
) -> None:
    pc.create_counter("views", int, mode="direct")
    pc.create_counter("pairs", (int, str), mode="direct")
    listen_direct(blog)
    if flavour == "sync":
        with psycopg.connect(dsn, autocommit=True) as other:
            client = Counters(other)
            assert client.incr("views", 9, 1) == 1  # the role writes pgcounters.counters
            _client_writes_sync(client)
    else:

        async def main() -> None:
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as other:
                client = AsyncCounters(other)
                assert await client.incr("views", 9, 1) == 1
                await _client_writes_async(client)

        asyncio.run(main())
    # one note per statement: 2 + 1 + 1 (incr_many: one statement) + 1 + 2 (a column's
    # statement and the named counters' one), none for the increment of 0
    assert _notes(blog) == 8
    assert take_direct(blog) == {
        "views": {(9,), (1,), (3,), (4,), (6,)},
        "pairs": {(1, "a")},
        "article.comments": {(2,), (3,)},
    }
    assert pc.get("views", 1) == 2
    assert pc.get("article.comments", 3, exact=False) == 1


def test_add_direct_reports_the_keys_whose_sum_changed(conn: Conn, pc: Counters) -> None:
    pc.create_counter("likes", int, mode="direct")
    listen_direct(conn)
    conn.execute(
        "SELECT pgcounters.add_direct(ARRAY[t.id, t.id, t.id, t.id], "
        "ARRAY['{1}', '{1}', '{2}', '{3}'], ARRAY[1, -1, 1, 0])"
        " FROM pgcounters.targets AS t WHERE t.name = 'likes'"
    )
    assert take_direct(conn) == {"likes": {(2,)}}


def test_status_shows_reporting_workers_and_the_notes_waiting(
    dsn: str, conn: Conn, pc: Counters
) -> None:
    pc.create_counter("views", int, mode="direct")
    listen_direct(conn)
    _view_statements(conn, 3)
    dead = psycopg.connect(dsn, autocommit=True)
    listen_direct(dead)
    _kill(conn, dead.info.backend_pid)
    dead.close()
    report = status.get_status(conn)
    section = next(s for s in report.sections if s.name == "direct_changes")
    assert section.as_json() == {"listening": 1, "gone": 1, "waiting": 3}
    assert "1 reporting workers, 3 notes waiting at most" in status.text(report)
    assert "pgcounters_direct_change_notes 3" in status.prometheus(report)


def test_the_notes_of_a_killed_worker_are_reported_by_the_next_reporting_worker(
    dsn: str, conn: Conn, pc: Counters
) -> None:
    pc.create_counter("views", int, mode="direct")
    dead = psycopg.connect(dsn, autocommit=True)
    listen_direct(dead)
    _view_statements(conn, 2)
    _kill(conn, dead.info.backend_pid)
    dead.close()
    calls: list[Changes] = []
    worker = Worker(dsn, FAST, on_change=calls.append)
    with running(worker) as errors:
        wait_for(lambda: _merged(calls).get("views") == {(0,), (1,)})
        assert _listeners(conn) == 1
    assert errors == []


def test_an_application_role_cannot_note_changes_by_calling_note_direct(
    dsn: str, blog: Conn, pc: Counters
) -> None:
    """note_direct is the triggers' and the counters' writers': an application role that
    calls it by hand (a forged cache invalidation, a growing table) is refused, while its
    ordinary writes still note what they change, through the triggers and the client."""
    pc.create_counter("views", int, mode="direct")
    listen_direct(blog)
    named, column = (
        blog.execute("SELECT id FROM pgcounters.targets WHERE name = %s", (name,)).fetchone()
        for name in ("comments.per_article", "article.comments")
    )
    assert named is not None
    assert column is not None
    with login_role(dsn, "pgc_app") as (role, role_dsn):
        security.grant_app(blog, role)
        blog.execute(sql.SQL("GRANT INSERT ON comment TO {}").format(sql.Identifier(role)))
        blog.execute(
            sql.SQL("GRANT USAGE ON SEQUENCE comment_id_seq TO {}").format(sql.Identifier(role))
        )
        with psycopg.connect(role_dsn, autocommit=True) as app:
            refused = psycopg.errors.InsufficientPrivilege
            with pytest.raises(refused, match="note_direct notes the changes of a direct"):
                app.execute("SELECT pgcounters.note_direct(%s, ARRAY[ARRAY['{7}']])", named)
            # a counter column the role may write: only the keys of rows it wrote
            with pytest.raises(refused, match=r"may not write counter id .* these keys"):
                app.execute("SELECT pgcounters.note_direct(%s, ARRAY[7])", column)
            views = blog.execute("SELECT id FROM pgcounters.targets WHERE name = 'views'")
            row = views.fetchone()
            assert row is not None
            with pytest.raises(refused, match=f"role {role} may not write counter id"):
                app.execute("SELECT pgcounters.note_direct(%s, ARRAY[ARRAY['{1}']])", (row[0],))
            assert _notes(blog) == 0
            # what the role may do still notes its changes: a counted write (the triggers),
            # an increment of a direct named counter (add_direct), of a counter column
            app.execute("INSERT INTO comment (article_id) VALUES (2)")
            client = Counters(app)
            client.incr("views", 4)
            client.incr("article.comments", 5, 1)
    assert take_direct(blog) == {
        "comments.per_article": {(2,)},
        "article.comments": {(2,), (5,)},
        "views": {(4,)},
    }


def test_direct_changes_of_more_keys_than_the_cap_report_their_counter_as_many_keys(
    blog: Conn,
) -> None:
    listen_direct(blog)
    blog.execute("INSERT INTO comment (article_id) VALUES (1), (2), (3)")
    changes, taken = take_direct_batch(blog, 1000, max_keys=2)
    assert changes == {"article.comments": None, "comments.per_article": None}
    assert taken == 2
    blog.execute("INSERT INTO comment (article_id) VALUES (1), (2)")
    assert take_direct(blog, max_keys=2) == {
        "article.comments": {(1,), (2,)},
        "comments.per_article": {(1,), (2,)},
    }


def test_a_worker_that_lost_its_connection_reports_every_direct_counter_as_changed(
    dsn: str, blog: Conn, pc: Counters
) -> None:
    """While it reconnected, no reporting worker was registered, so direct writes noted
    nothing and their changes reached no listener: once registered again, it reports each
    direct counter as changed with its keys not listed ("many keys"), and caches drop them."""
    pc.create_counter("views", int, mode="direct")
    pc.create_counter("queued.views", int)
    calls: list[Changes] = []
    settings = WorkerSettings(
        min_interval=0.01, max_interval=0.05, log_every=0, reconnect_min=0.05, reconnect_max=0.1
    )
    worker = Worker(dsn, settings, on_change=calls.append)
    with running(worker) as errors:
        wait_for(lambda: _listeners(blog) == 1)
        pc.incr("views", 7)
        wait_for(lambda: _merged(calls).get("views") == {(7,)})
        assert all(None not in c.values() for c in calls)  # its first registration: no gap
        row = blog.execute("SELECT pid FROM pgcounters.change_listeners").fetchone()
        assert row is not None
        _kill(blog, int(row[0]))
        pc.incr("views", 8)  # before or after it registers again: reported either way
        wait_for(lambda: any(c.get("views", ()) is None for c in calls))
    assert errors == []
    gap = next(c for c in calls if c.get("views", ()) is None)
    assert gap == {"article.comments": None, "comments.per_article": None, "views": None}
