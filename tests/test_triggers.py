"""Declared counters kept by statement-level triggers, judged against truths written by hand
(tests/truth.py); ``verify`` and ``recount`` are judged against the same truths."""

from __future__ import annotations

import io
import random
import threading
from typing import Any

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from psycopg import sql

import blog_schema
import truth
from pgcounters import Counters, triggers
from pgcounters.compiler import compile_spec, trigger_name
from pgcounters.connection import Conn
from pgcounters.errors import CounterDefinitionConflict, InvalidCounterDefinition, UnknownCounter
from pgcounters.repair import recount, verify
from pgcounters.specs import ColumnTarget, CounterSpec, Fragment, NamedTarget
from support import tamper, wait_for_lock_wait

MODES = ["queued", "unlogged", "direct"]


@pytest.fixture
def blog(conn: Conn) -> Conn:
    blog_schema.create(conn)
    return conn


TRUTHS = blog_schema.truths()
ARTICLE = TRUTHS[0]


def test_compiler_needs_no_database() -> None:
    spec = blog_schema.specs()[0]
    compiled = compile_spec(spec)
    events = ["insert", "update", "delete", "truncate", "guard_update", "guard_insert"]
    assert [t.event for t in compiled.triggers] == [*events, "guard_key"]
    text = compiled.install_sql().as_string()
    # the guards of the counter column: row triggers on the parent table, only when it changes
    assert 'BEFORE UPDATE OF "public_comments" ON "public"."blog_article"' in text
    assert 'WHEN (OLD."public_comments" IS DISTINCT FROM NEW."public_comments")' in text
    # and the row trigger that starts the counter again when the row's key changes
    assert 'FOR EACH ROW WHEN (OLD."id" IS DISTINCT FROM NEW."id")' in text
    assert "FOR EACH STATEMENT" in text
    assert "REFERENCING OLD TABLE AS" in text
    assert "NEW TABLE AS" in text
    assert f"fingerprint={spec.fingerprint}" in text
    assert all(len(t.name) <= 45 for t in compiled.triggers)
    # deterministic, and the fingerprint follows the definition
    assert compile_spec(blog_schema.specs()[0]).install_sql() == compiled.install_sql()
    changed = CounterSpec(
        name=spec.name,
        source=spec.source,
        keys=spec.keys,
        target=spec.target,
        where=Fragment("publish_status = %s", ("Public",)),
    )
    assert changed.fingerprint != spec.fingerprint


def test_hostile_values_are_quoted_literals(blog: Conn) -> None:
    hostile = "x'); DROP TABLE blog_comment; --\\ $$ $pgc$ %s {} \u00e9"
    spec = CounterSpec(
        name="hostile",
        source="blog_comment",
        target=NamedTarget(()),
        where=Fragment("publish_status = %s", (hostile,)),
    )
    triggers.install(blog, [spec])
    blog.execute("INSERT INTO blog_comment (publish_status) VALUES (%s), ('other')", (hostile,))
    assert Counters(blog).get("hostile") == 1
    hand = truth.from_sql(
        "hostile", "SELECT count(*) FROM blog_comment WHERE publish_status = %s", (hostile,)
    )
    assert truth.values(blog, hand) == {(): 1}
    truth.assert_drained(blog, [hand])
    assert verify(blog, "hostile").ok


def test_long_names_give_short_trigger_names() -> None:
    name = "a" * 200
    assert len(trigger_name(name, "truncate")) <= 45
    assert trigger_name(name, "insert") != trigger_name(name[:-1], "insert")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"keys": ("a", "b")}, "exactly one key"),
        ({"keys": ("x" * 64,)}, "63 bytes"),
        ({"mode": "sometimes"}, "mode must be"),
        ({"where": "publish_status = 'public'"}, "Fragment"),
        ({"name": "bad name!"}, "invalid counter name"),
    ],
)
def test_bad_declarations_fail_at_declaration(kwargs: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {
        "name": "c",
        "source": "blog_comment",
        "keys": ("article_id",),
        "target": ColumnTarget("blog_article", "public_comments"),
    }
    args.update(kwargs)
    with pytest.raises(InvalidCounterDefinition, match=message):
        CounterSpec(**args)


def test_fragment_placeholders_must_match_values() -> None:
    with pytest.raises(InvalidCounterDefinition, match="placeholders"):
        Fragment("a = %s AND b = %s", ("x",))
    assert (
        Fragment("a LIKE 'x%%' AND b = %s", (1,)).composed().as_string() == "a LIKE 'x%' AND b = 1"
    )


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            CounterSpec(
                name="bad.column",
                source="blog_comment",
                keys=("article_id",),
                target=ColumnTarget("blog_article", "no_such_column"),
            ),
            "no_such_column",
        ),
        (
            CounterSpec(
                name="bad.where",
                source="blog_comment",
                target=NamedTarget(()),
                where=Fragment("no_such_field = %s", (1,)),
            ),
            "does not compile",
        ),
        (
            CounterSpec(name="bad.table", source="no_such_table", target=NamedTarget(()), keys=()),
            "no_such_table",
        ),
    ],
)
def test_bad_declarations_fail_at_install_and_leave_nothing(
    blog: Conn, spec: CounterSpec, message: str
) -> None:
    good = blog_schema.specs()[0]
    with pytest.raises(InvalidCounterDefinition, match=message):
        triggers.install(blog, [good, spec])
    assert triggers.installed(blog) == []
    assert triggers.declared(blog) == []
    assert blog.execute("SELECT count(*) FROM pgcounters.targets").fetchone() == (0,)


def _workload(conn: Conn) -> None:
    """Every kind of write a naive row trigger misses: bulk, flips, moves, NULL keys, sums."""
    conn.execute(
        "INSERT INTO blog_comment (article_id, creator_id, publish_status, score, created_on)"
        " SELECT 1 + g % 5, 1 + g % 3, CASE WHEN g % 2 = 0 THEN 'public' ELSE 'private' END,"
        " g, date '2026-11-20' + g % 3 FROM generate_series(1, 500) g"
    )
    conn.execute("UPDATE blog_comment SET publish_status = 'public' WHERE id % 3 = 0")  # flips
    conn.execute("UPDATE blog_comment SET publish_status = 'private' WHERE id % 10 = 0")
    conn.execute("UPDATE blog_comment SET article_id = NULL WHERE id % 7 = 0")  # NULL parent
    conn.execute("UPDATE blog_comment SET article_id = 3 WHERE id % 49 = 0")  # back from NULL
    conn.execute("UPDATE blog_comment SET article_id = 2, creator_id = 1 WHERE id % 11 = 0")
    conn.execute("UPDATE blog_comment SET score = score * 2 WHERE id % 5 = 0")  # summed value
    conn.execute("UPDATE blog_comment SET score = NULL WHERE id % 17 = 0")
    conn.execute("UPDATE blog_comment SET created_on = created_on + 1 WHERE id % 4 = 0")
    conn.execute("DELETE FROM blog_comment WHERE id % 13 = 0")
    conn.execute("DELETE FROM blog_article WHERE id = 5")  # cascades to its comments
    with (
        conn.cursor() as cur,
        cur.copy(
            "COPY blog_comment (article_id, creator_id, publish_status, score) FROM STDIN"
        ) as copy,
    ):
        for i in range(50):
            copy.write_row((1 + i % 4, 1 + i % 2, "public", i))


@pytest.mark.parametrize("mode", MODES)
def test_every_write_is_counted(blog: Conn, mode: str) -> None:
    specs = blog_schema.specs(mode)
    triggers.install(blog, specs)
    _workload(blog)
    truth.assert_drained(blog, TRUTHS)
    article_truth = blog.execute(
        "SELECT a.id, count(c.id) FILTER (WHERE c.publish_status = 'public')"
        " FROM blog_article a LEFT JOIN blog_comment c ON c.article_id = a.id GROUP BY a.id"
        " ORDER BY a.id"
    ).fetchall()
    stored = blog.execute("SELECT id, public_comments FROM blog_article ORDER BY id").fetchall()
    assert stored == article_truth
    assert sum(n for _, n in stored) > 0


@pytest.mark.parametrize("mode", ["queued", "unlogged"])
def test_exact_reads_include_pending_deltas(blog: Conn, mode: str) -> None:
    specs = blog_schema.specs(mode)
    triggers.install(blog, specs)
    _workload(blog)
    pc = Counters(blog)
    total = blog.execute("SELECT count(*) FROM blog_comment").fetchone()
    assert total is not None
    assert pc.get("blog.comments_total") == total[0]
    assert pc.get("blog.comments_total", exact=False) == 0
    assert truth.pending_deltas(blog, "blog.comments_total") > 0
    truth.assert_exact(blog, TRUTHS)


def test_a_bulk_statement_writes_one_delta_per_key(blog: Conn) -> None:
    triggers.install(blog, blog_schema.specs()[:1])
    blog.execute(
        "INSERT INTO blog_comment (article_id, publish_status)"
        " SELECT 1 + g % 5, 'public' FROM generate_series(1, 10000) g"
    )
    assert blog.execute("SELECT count(*), sum(delta) FROM pgcounters.queue").fetchone() == (
        5,
        10000,
    )
    # an update that changes nothing counted writes nothing
    blog.execute("UPDATE blog_comment SET score = 1")
    assert blog.execute("SELECT count(*) FROM pgcounters.queue").fetchone() == (5,)


def test_mark_as_read_twice_counts_once(blog: Conn, dsn: str) -> None:
    """Two requests mark the same comment at once; the count drops exactly once."""
    spec = blog_schema.specs()[0]
    triggers.install(blog, [spec])
    blog.execute("INSERT INTO blog_comment (article_id, publish_status) VALUES (1, 'public')")
    first = psycopg.connect(dsn)
    second = psycopg.connect(dsn)
    try:
        first.execute("UPDATE blog_comment SET publish_status = 'private' WHERE id = 1")
        done = threading.Event()

        def other() -> None:
            second.execute("UPDATE blog_comment SET publish_status = 'private' WHERE id = 1")
            second.commit()
            done.set()

        thread = threading.Thread(target=other)
        thread.start()
        wait_for_lock_wait(blog, second.info.backend_pid)  # blocked on the row lock
        assert not done.is_set()
        first.commit()
        thread.join()
    finally:
        first.close()
        second.close()
    assert Counters(blog).get(spec.name, 1) == 0


def test_truncate_resets_the_counters(blog: Conn) -> None:
    specs = blog_schema.specs()
    triggers.install(blog, specs)
    _workload(blog)
    Counters(blog).drain(batch_size=7, max_batches=2)  # some applied, some pending
    blog.execute("TRUNCATE blog_comment")
    assert blog.execute("SELECT sum(public_comments) FROM blog_article").fetchone() == (0,)
    assert blog.execute("SELECT count(*) FROM pgcounters.queue").fetchone() == (0,)
    truth.assert_exact(blog, TRUTHS)
    truth.assert_stored(blog, TRUTHS)
    blog.execute("INSERT INTO blog_comment (article_id, publish_status) VALUES (1, 'public')")
    assert Counters(blog).get("blog.article.public_comments", 1) == 1


def test_rolled_back_writes_count_nothing(blog: Conn) -> None:
    triggers.install(blog, blog_schema.specs())
    with blog.transaction(force_rollback=True):
        blog.execute("INSERT INTO blog_comment (article_id, publish_status) VALUES (1, 'public')")
        assert blog.execute("SELECT count(*) FROM pgcounters.queue").fetchone() != (0,)
    assert blog.execute("SELECT count(*) FROM pgcounters.queue").fetchone() == (0,)


def test_drift_is_detected(blog: Conn) -> None:
    specs = blog_schema.specs()
    triggers.install(blog, specs)
    assert {d.state for d in triggers.drift(blog)} == {"installed"}
    changed = CounterSpec(
        name=specs[0].name,
        source=specs[0].source,
        keys=specs[0].keys,
        target=specs[0].target,
        where=Fragment("publish_status IN (%s, %s)", ("public", "Public")),
    )
    by_name = {d.name: d for d in triggers.drift(blog, [changed, *specs[1:]])}
    assert by_name[changed.name].state == "outdated"
    blog.execute(f'DROP TRIGGER "{trigger_name(specs[1].name, "delete")}" ON blog_comment')
    blog.execute(
        f'ALTER TABLE blog_comment DISABLE TRIGGER "{trigger_name(specs[2].name, "insert")}"'
    )
    by_name = {d.name: d for d in triggers.drift(blog, specs[:3])}
    assert by_name[specs[1].name].state == "missing"
    assert by_name[specs[2].name].state == "disabled"
    assert by_name[specs[3].name].state == "undeclared"
    # reinstalling the changed spec replaces its triggers
    triggers.install(blog, [changed])
    assert {d.name: d.state for d in triggers.drift(blog, [changed])}[changed.name] == "installed"


def test_uninstall_removes_triggers_and_optionally_values(blog: Conn) -> None:
    specs = blog_schema.specs()
    triggers.install(blog, specs)
    blog.execute("INSERT INTO blog_comment (article_id, publish_status) VALUES (1, 'public')")
    assert triggers.uninstall(blog, specs[0].name)
    assert specs[0].name not in {t.spec_name for t in triggers.installed(blog)}
    assert Counters(blog).get(specs[0].name, 1) == 1  # the counter itself stays
    assert triggers.uninstall(blog, specs[3].name, drop_values=True)
    with pytest.raises(UnknownCounter):
        Counters(blog).get(specs[3].name, (1, "2026-11-21"))
    assert not triggers.uninstall(blog, "never.declared")


def test_bulk_import_paused_then_recount(blog: Conn) -> None:
    specs = blog_schema.specs()
    triggers.install(blog, specs)
    with triggers.paused(blog):
        blog.execute(
            "INSERT INTO blog_comment (article_id, creator_id, publish_status, score)"
            " SELECT 1 + g % 5, 1 + g % 3, 'public', g FROM generate_series(1, 3000) g"
        )
    assert blog.execute("SELECT count(*) FROM pgcounters.queue").fetchone() == (0,)
    for spec, hand in zip(specs, TRUTHS, strict=True):
        wrong = truth.exact_mismatches(blog, hand)
        assert wrong, spec.name  # the paused import is not counted
        # verify reports exactly the keys the truth finds wrong, with the same values
        assert {(m.key, m.expected, m.actual) for m in verify(blog, spec).mismatches} == {
            (m.key, m.truth, m.found) for m in wrong
        }, spec.name
    for spec in specs:
        result = recount(blog, spec.name, batch_size=2)
        assert result.keys_done > 0
    truth.assert_exact(blog, TRUTHS)
    truth.assert_stored(blog, TRUTHS)  # nothing was pending: recount stored the truth
    # after the pause, counting is back on this connection
    blog.execute("INSERT INTO blog_comment (article_id, publish_status) VALUES (1, 'public')")
    assert blog.execute("SELECT count(*) FROM pgcounters.queue").fetchone() != (0,)


def test_pausing_one_counter_leaves_the_others(blog: Conn) -> None:
    specs = blog_schema.specs()
    triggers.install(blog, specs)
    with triggers.paused(blog, specs[0].name):
        blog.execute("INSERT INTO blog_comment (article_id, publish_status) VALUES (1, 'public')")
    assert Counters(blog).get(specs[0].name, 1) == 0
    assert Counters(blog).get("blog.comments_total") == 1


def test_the_pause_check_is_an_expression_postgresql_inlines(blog: Conn) -> None:
    """Every trigger of every statement asks is_paused: PostgreSQL folds the function into
    the caller's expression (no call of a SQL function of its own), whatever the setting."""
    for setting in ("", "all", "blog.x,blog.y"):
        blog.execute("SELECT set_config('pgcounters.paused', %s, false)", (setting,))
        plan = blog.execute(
            "EXPLAIN (VERBOSE, COSTS OFF) SELECT pgcounters.is_paused('blog.y')"
        ).fetchall()
        output = " ".join(str(line[0]) for line in plan)
        assert "is_paused" not in output, output
        assert "current_setting" in output, output
    blog.execute("RESET pgcounters.paused")
    # the same answers as before
    for setting, name, expected in (
        ("", "blog.y", False),
        ("all", "blog.y", True),
        ("blog.x,blog.y", "blog.y", True),
        ("blog.x,blog.y", "blog.z", False),
        ("blog.x, blog.y", "blog.y", False),  # names are not trimmed
    ):
        blog.execute("SELECT set_config('pgcounters.paused', %s, false)", (setting,))
        row = blog.execute("SELECT pgcounters.is_paused(%s)", (name,)).fetchone()
        assert row == (expected,), (setting, name)
    blog.execute("RESET pgcounters.paused")


def test_recount_resumes_and_takes_key_ranges(blog: Conn) -> None:
    spec = blog_schema.specs()[0]
    triggers.install(blog, [spec])
    tamper(blog, "UPDATE blog_article SET public_comments = 99")
    done: list[int] = []
    result = recount(blog, spec, batch_size=2, key_range=(2, 3), progress=done.append)
    assert (result.keys_done, result.keys_fixed, sum(done)) == (2, 2, 2)
    assert blog.execute(
        "SELECT array_agg(public_comments ORDER BY id) FROM blog_article"
    ).fetchone() == ([99, 0, 0, 99, 99],)
    # an interrupted recount (cursor at key 2, unfinished) resumes after key 2
    blog.execute(
        "UPDATE pgcounters.recounts SET cursor_key = '{2}', finished_at = NULL WHERE name = %s",
        (spec.name,),
    )
    result = recount(blog, spec, batch_size=2)
    assert result.resumed
    assert result.keys_done == 3
    assert blog.execute(
        "SELECT array_agg(public_comments ORDER BY id) FROM blog_article"
    ).fetchone() == ([99, 0, 0, 0, 0],)
    assert recount(blog, spec).keys_fixed == 1
    truth.assert_stored(blog, [ARTICLE])
    assert verify(blog, spec).ok


def test_verify_samples_and_reports_mismatches(blog: Conn) -> None:
    spec = blog_schema.specs()[0]
    triggers.install(blog, [spec])
    blog.execute("INSERT INTO blog_comment (article_id, publish_status) VALUES (2, 'public')")
    tamper(blog, "UPDATE blog_article SET public_comments = public_comments + 5 WHERE id = 3")
    result = verify(blog, spec.name)
    assert result.keys_checked == 5
    assert [(m.key, m.expected, m.actual) for m in result.mismatches] == [((3,), 0, 5)]
    assert [(m.key, m.truth, m.found) for m in truth.exact_mismatches(blog, ARTICLE)] == [
        ((3,), 0, 5)
    ]
    sampled = verify(blog, spec.name, sample=2)
    assert sampled.keys_checked == 2
    with pytest.raises(UnknownCounter):
        verify(blog, "not.recorded")


def _drainer(
    dsn: str, stop: threading.Event, errors: list[BaseException], batch_size: int, batches: int
) -> None:
    """Drain small batches until ``stop`` is set; record any error."""
    try:
        with psycopg.connect(dsn, autocommit=True) as c:
            pc = Counters(c)
            while not stop.is_set():
                pc.drain(batch_size=batch_size, max_batches=batches)
    except BaseException as exc:
        errors.append(exc)


def test_recount_during_writes_and_drains_ends_exact(blog: Conn, dsn: str) -> None:
    specs = blog_schema.specs()
    triggers.install(blog, specs)
    tamper(blog, "UPDATE blog_article SET public_comments = 1000")  # wrong on purpose
    blog.execute(
        "INSERT INTO pgcounters.counters SELECT id, '{}', 77 FROM pgcounters.targets"
        " WHERE name = 'blog.comments_total'"
    )
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer(seed: int) -> None:
        rng = random.Random(seed)
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                while not stop.is_set():
                    c.execute(
                        "INSERT INTO blog_comment (article_id, creator_id, publish_status, score)"
                        " VALUES (%s, %s, %s, %s)",
                        (
                            rng.randint(1, 5),
                            rng.randint(1, 5),
                            rng.choice(["public", "private"]),
                            1,
                        ),
                    )
                    c.execute(
                        "UPDATE blog_comment SET publish_status = %s WHERE id = %s",
                        (rng.choice(["public", "private"]), rng.randint(1, 200)),
                    )
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(3)]
    threads += [threading.Thread(target=_drainer, args=(dsn, stop, errors, 5, 3)) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for spec in specs:
            recount(blog, spec, batch_size=2)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert errors == []
    truth.assert_drained(blog, TRUTHS)


# -- property-based: random operation sequences against the truth -------------------

OPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("insert"),
            st.integers(1, 5),
            st.integers(1, 3),
            st.booleans(),
            st.integers(1, 20),
        ),
        st.tuples(st.just("flip"), st.integers(0, 9)),
        st.tuples(st.just("move"), st.integers(0, 9), st.one_of(st.none(), st.integers(1, 5))),
        st.tuples(st.just("score"), st.integers(0, 9), st.one_of(st.none(), st.integers(-5, 50))),
        st.tuples(st.just("delete"), st.integers(0, 9)),
        st.tuples(st.just("bulk_flip"), st.integers(1, 5)),
        st.tuples(st.just("bulk_delete"), st.integers(1, 5)),
        st.tuples(
            st.just("drain"),
        ),
    ),
    max_size=25,
)


def _apply(conn: Conn, op: tuple[Any, ...]) -> None:
    kind = op[0]
    row = sql.SQL("(SELECT id FROM blog_comment ORDER BY id OFFSET %s LIMIT 1)")
    if kind == "insert":
        _, article, user, public, n = op
        conn.execute(
            "INSERT INTO blog_comment (article_id, creator_id, publish_status, score)"
            " SELECT %s, %s, %s, g FROM generate_series(1, %s) g",
            (article, user, "public" if public else "private", n),
        )
    elif kind == "flip":
        conn.execute(
            sql.SQL(
                "UPDATE blog_comment SET publish_status = CASE publish_status WHEN 'public'"
                " THEN 'private' ELSE 'public' END WHERE id = {}"
            ).format(row),
            (op[1],),
        )
    elif kind == "move":
        conn.execute(
            sql.SQL("UPDATE blog_comment SET article_id = %s WHERE id = {}").format(row),
            (op[2], op[1]),
        )
    elif kind == "score":
        conn.execute(
            sql.SQL("UPDATE blog_comment SET score = %s WHERE id = {}").format(row), (op[2], op[1])
        )
    elif kind == "delete":
        conn.execute(sql.SQL("DELETE FROM blog_comment WHERE id = {}").format(row), (op[1],))
    elif kind == "bulk_flip":
        conn.execute(
            "UPDATE blog_comment SET publish_status = CASE publish_status WHEN 'public'"
            " THEN 'private' ELSE 'public' END WHERE article_id = %s",
            (op[1],),
        )
    elif kind == "bulk_delete":
        conn.execute("DELETE FROM blog_comment WHERE creator_id = %s", (op[1] % 3 + 1,))
    else:
        Counters(conn).drain()


@pytest.mark.parametrize("mode", MODES)
def test_random_operation_sequences_match_the_truth(blog: Conn, mode: str) -> None:
    specs = blog_schema.specs(mode)
    triggers.install(blog, specs)

    @settings(max_examples=15, deadline=None)
    @given(ops=OPS)
    def run(ops: list[tuple[Any, ...]]) -> None:
        # each example starts from the same state: no comment, ids from 1, every count zero
        blog.execute("TRUNCATE blog_comment RESTART IDENTITY")  # resets every counter
        truth.assert_drained(blog, TRUTHS)
        for op in ops:
            _apply(blog, op)
        truth.assert_exact(blog, TRUTHS)  # before the drain: stored + pending
        truth.assert_drained(blog, TRUTHS)

    run()


def test_threads_with_multi_row_transactions_and_drainers(conn: Conn, dsn: str) -> None:
    """8 writers, random multi-statement transactions, each on its own comments (so the
    writers never wait for each other's rows); 2 drainers. Queued counters add no lock."""
    blog_schema.create(conn, users=8)
    specs = blog_schema.specs()
    triggers.install(conn, specs)
    errors: list[BaseException] = []
    stop = threading.Event()
    mine = sql.SQL(
        "(SELECT id FROM blog_comment WHERE creator_id = %s ORDER BY id OFFSET %s LIMIT 1)"
    )

    def writer(user: int) -> None:
        rng = random.Random(user)
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                for _ in range(25):
                    with c.transaction():
                        for _ in range(rng.randint(1, 4)):
                            n = rng.randint(0, 10)
                            choice = rng.randrange(5)
                            if choice == 0:
                                c.execute(
                                    "INSERT INTO blog_comment (article_id, creator_id,"
                                    " publish_status, score) SELECT %s, %s, %s, g"
                                    " FROM generate_series(1, %s) g",
                                    (
                                        rng.randint(1, 5),
                                        user,
                                        rng.choice(["public", "private"]),
                                        rng.randint(1, 5),
                                    ),
                                )
                            elif choice == 1:
                                c.execute(
                                    sql.SQL(
                                        "UPDATE blog_comment SET publish_status = CASE"
                                        " publish_status WHEN 'public' THEN 'private'"
                                        " ELSE 'public' END WHERE id = {}"
                                    ).format(mine),
                                    (user, n),
                                )
                            elif choice == 2:
                                c.execute(
                                    sql.SQL(
                                        "UPDATE blog_comment SET article_id = %s WHERE id = {}"
                                    ).format(mine),
                                    (rng.choice([None, 1, 2, 3, 4, 5]), user, n),
                                )
                            elif choice == 3:
                                c.execute(
                                    sql.SQL(
                                        "UPDATE blog_comment SET score = %s WHERE id = {}"
                                    ).format(mine),
                                    (rng.randint(0, 9), user, n),
                                )
                            else:
                                c.execute(
                                    sql.SQL("DELETE FROM blog_comment WHERE id = {}").format(mine),
                                    (user, n),
                                )
        except BaseException as exc:
            errors.append(exc)

    writers = [threading.Thread(target=writer, args=(i,)) for i in range(1, 9)]
    drainers = [
        threading.Thread(target=_drainer, args=(dsn, stop, errors, 10, 5)) for _ in range(2)
    ]
    for t in writers + drainers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    for t in drainers:
        t.join()
    assert errors == []
    truth.assert_drained(conn, TRUTHS)
    assert conn.execute("SELECT count(*) FROM blog_comment").fetchone() != (0,)


def test_copy_is_counted(blog: Conn) -> None:
    triggers.install(blog, blog_schema.specs()[:1])
    data = io.StringIO("".join(f"{1 + i % 3}\tpublic\n" for i in range(30)))
    with (
        blog.cursor() as cur,
        cur.copy("COPY blog_comment (article_id, publish_status) FROM STDIN") as copy,
    ):
        copy.write(data.read())
    assert Counters(blog).get_many("blog.article.public_comments", [1, 2, 3]) == [10, 10, 10]


@pytest.mark.parametrize("mode", MODES)
def test_keys_equal_in_their_key_type_are_one_key(conn: Conn, mode: Any) -> None:
    """A numeric 1.0 and 1.00 key one bigint counter; timestamps of one day key one date:
    grouped and written as the key type's canonical text, as the client reads them."""
    conn.execute(
        "CREATE TABLE day (d date PRIMARY KEY, events bigint NOT NULL DEFAULT 0);"
        "INSERT INTO day VALUES ('2026-11-21'), ('2026-11-22');"
        "CREATE TABLE event (id serial PRIMARY KEY, at timestamp NOT NULL, amount numeric)"
    )
    per_day = CounterSpec(
        name="events.per_day", source="event", keys=["at"],
        target=ColumnTarget("day", "events", key_column="d", key_type="date"), mode=mode,
    )  # fmt: skip
    per_amount = CounterSpec(
        name="events.per_amount", source="event", keys=["amount"],
        target=NamedTarget(("bigint",)), mode=mode,
    )  # fmt: skip
    triggers.install(conn, [per_day, per_amount])
    conn.execute(
        "INSERT INTO event (at, amount) VALUES ('2026-11-21 09:00', 1.0),"
        " ('2026-11-21 10:00', 1.00), ('2026-11-21 11:00', 2), ('2026-11-22 01:00', 1.000)"
    )
    conn.execute("INSERT INTO event (at, amount) VALUES ('2026-11-21 12:00', 1.0)")
    pc = Counters(conn)
    assert pc.get("events.per_amount", 1) == 4  # exact read, before the drain too
    pc.drain()
    days = dict(conn.execute("SELECT d::text, events FROM day").fetchall())
    assert days == {"2026-11-21": 4, "2026-11-22": 1}
    assert pc.get("events.per_amount", 1) == 4
    assert pc.get("events.per_amount", 2) == 1
    conn.execute("DELETE FROM event WHERE amount = 1")  # 1.0, 1.00 and 1.000 in one statement
    pc.drain()
    assert pc.get("events.per_amount", 1) == 0
    assert dict(conn.execute("SELECT d::text, events FROM day").fetchall()) == {
        "2026-11-21": 1,
        "2026-11-22": 0,
    }
    truth.assert_drained(
        conn,
        [
            truth.from_sql(
                "events.per_day",
                "SELECT at::date, count(*) FROM event GROUP BY at::date",
                stored="SELECT d, events FROM day",
            ),
            truth.from_sql(
                "events.per_amount",
                "SELECT amount::bigint, count(*) FROM event WHERE amount IS NOT NULL"
                " GROUP BY amount::bigint",
            ),
        ],
    )


def test_a_counter_declared_again_over_another_table_leaves_the_old_one(
    conn: Conn,
) -> None:
    conn.execute(
        "CREATE TABLE post (id bigint PRIMARY KEY, comments bigint NOT NULL DEFAULT 0);"
        "INSERT INTO post VALUES (1);"
        "CREATE TABLE old_comment (id serial PRIMARY KEY, post_id bigint);"
        "CREATE TABLE comment (id serial PRIMARY KEY, post_id bigint)"
    )

    def spec(source: str) -> CounterSpec:
        return CounterSpec(
            name="post.comments", source=source, keys=["post_id"],
            target=ColumnTarget("post", "comments"),
        )  # fmt: skip

    triggers.install(conn, [spec("old_comment")])
    triggers.install(conn, [spec("comment")])
    # the counting triggers moved to the new table; the guards stay on the parent
    assert {t.table for t in triggers.installed(conn)} == {"comment", "post"}
    assert {t.table for t in triggers.installed(conn) if t.event.startswith("guard")} == {"post"}
    conn.execute("INSERT INTO old_comment (post_id) VALUES (1), (1)")
    conn.execute("INSERT INTO comment (post_id) VALUES (1)")
    Counters(conn).drain()
    assert conn.execute("SELECT comments FROM post").fetchone() == (1,)
    assert [d.state for d in triggers.drift(conn)] == ["installed"]
    # triggers left on another table by hand are drift
    function = trigger_name("post.comments", "insert")
    conn.execute(
        "CREATE TRIGGER pgc_stray AFTER INSERT ON old_comment REFERENCING NEW TABLE AS pgc_new"
        f" FOR EACH STATEMENT EXECUTE FUNCTION pgcounters.{function}()"
    )
    assert [d.state for d in triggers.drift(conn)] == ["outdated"]


def test_a_declared_counter_installed_again_with_other_key_parts_is_counted_again(
    blog: Conn,
) -> None:
    """Its old values are keyed otherwise: the install drops them and the backfill counts
    the rows under the new key (before, the install failed with "already exists with
    another definition"). A counter made by hand under that name is not dropped."""
    name = "blog.comments_by_article"
    per_article = CounterSpec(
        name=name, source="blog_comment", keys=("article_id",), target=NamedTarget(("bigint",))
    )
    triggers.install(blog, [per_article])
    blog.execute(
        "INSERT INTO blog_comment (article_id, creator_id, publish_status)"
        " VALUES (1, 1, 'public'), (1, 2, 'public'), (2, 1, 'public')"
    )
    pc = Counters(blog)
    assert pc.get(name, 1) == 2
    per_pair = CounterSpec(
        name=name,
        source="blog_comment",
        keys=("article_id", "creator_id"),
        target=NamedTarget(("bigint", "bigint")),
    )
    triggers.install(blog, [per_pair])
    blog.execute(
        "INSERT INTO blog_comment (article_id, creator_id, publish_status) VALUES (1, 1, 'x')"
    )
    pc = Counters(blog)
    assert [pc.get(name, k) for k in ((1, 1), (1, 2), (2, 1))] == [2, 1, 1]
    assert verify(blog, per_pair).mismatches == []
    pc.create_counter("by_hand", key=int)
    with pytest.raises(CounterDefinitionConflict, match="another definition"):
        triggers.install(
            blog, [CounterSpec(name="by_hand", source="blog_comment", target=NamedTarget(()))]
        )
    assert pc.get("by_hand", 1) == 0


def test_direct_counters_of_one_table_with_other_conditions_never_deadlock(
    blog: Conn, dsn: str
) -> None:
    """Two direct counter columns of one parent, with complementary conditions: each
    counter locked only the parents of the rows it counts, so one statement writing a
    public comment of article 1 and a private one of article 2 locked 1 then 2, another
    writing them the other way round locked 2 then 1: deadlocks. Every direct counter of
    the table now locks the parents of all the statement's rows, in key order."""
    blog.execute("ALTER TABLE blog_article ADD COLUMN private_comments bigint NOT NULL DEFAULT 0")
    private = Fragment("publish_status <> %s", ("public",))
    specs = [
        CounterSpec(name="blog.article.public_direct", source="blog_comment",
                    keys=("article_id",), target=ColumnTarget("blog_article", "public_comments"),
                    where=blog_schema.PUBLIC, mode="direct"),
        CounterSpec(name="blog.article.private_direct", source="blog_comment",
                    keys=("article_id",), target=ColumnTarget("blog_article", "private_comments"),
                    where=private, mode="direct"),
    ]  # fmt: skip
    triggers.install(blog, specs)
    deadlocks: list[str] = []
    errors: list[BaseException] = []

    def writer(first: int, second: int) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                for _ in range(150):
                    try:
                        # one statement, one transaction: a public comment of one article
                        # and a private one of the other
                        c.execute(
                            "INSERT INTO blog_comment (article_id, creator_id, publish_status)"
                            " VALUES (%s, 1, 'public'), (%s, 1, 'private')",
                            (first, second),
                        )
                    except psycopg.errors.DeadlockDetected as exc:
                        deadlocks.append(str(exc).splitlines()[0])
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=args) for args in ((1, 2), (2, 1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert deadlocks == []
    rows = blog.execute(
        "SELECT a.id, a.public_comments, a.private_comments,"
        " (SELECT count(*) FROM blog_comment c WHERE c.article_id = a.id"
        "   AND c.publish_status = 'public'),"
        " (SELECT count(*) FROM blog_comment c WHERE c.article_id = a.id"
        "   AND c.publish_status <> 'public')"
        " FROM blog_article a WHERE a.id IN (1, 2) ORDER BY a.id"
    ).fetchall()
    assert rows == [(1, 150, 150, 150, 150), (2, 150, 150, 150, 150)]
