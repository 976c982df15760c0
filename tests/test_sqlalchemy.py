"""Counters declared on SQLAlchemy 2 models: every way of writing is counted, and exact()
agrees with the truth (a count(*) / sum over the related table) after each."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from sqlalchemy import (
    Column,
    Connection,
    Engine,
    ForeignKey,
    Integer,
    MetaData,
    Numeric,
    String,
    Table,
    create_engine,
    delete,
    func,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, aliased, mapped_column, relationship

from pgcounters import Counters, triggers
from pgcounters.contrib.sqlalchemy import (
    counted,
    counter_spec,
    counter_specs,
    declare_counter,
    exact,
    install_counters,
    install_schema,
)
from pgcounters.errors import InvalidArgument, InvalidCounterDefinition, SchemaNotInstalled
from pgcounters.specs import CounterSpec, Fragment, NamedTarget
from sqlalchemy_models import COUNTED, Article, Base, Comment, url
from support import wait_for_lock_wait


@pytest.fixture
def engine(dsn: str) -> Iterator[Engine]:
    engine = create_engine(url(dsn))
    with engine.begin() as conn:
        Base.metadata.create_all(conn)
    yield engine
    engine.dispose()


def truth(conn: Connection) -> dict[int, dict[str, Any]]:
    """Each article's counts computed from the comments themselves."""
    c = Comment.__table__.c
    rows = conn.execute(
        select(
            Article.id,
            func.count(c.id),
            func.count(c.id).filter(c.status == "public"),
            func.coalesce(func.sum(c.score), 0),
            func.coalesce(func.sum(c.amount), Decimal("0.00")),
        )
        .select_from(Article)
        .outerjoin(Comment.__table__, c.article_id == Article.id)
        .group_by(Article.id)
    ).all()
    return {r[0]: dict(zip(COUNTED, (r[1], r[2], r[3], r[4], r[1]), strict=True)) for r in rows}


def exact_values(conn: Connection) -> dict[int, dict[str, Any]]:
    rows = conn.execute(
        select(Article.id, *(exact(getattr(Article, name)) for name in COUNTED))
    ).all()
    return {r[0]: dict(zip(COUNTED, r[1:], strict=True)) for r in rows}


def stored(conn: Connection) -> dict[int, dict[str, Any]]:
    rows = conn.execute(select(Article.id, *(getattr(Article, n) for n in COUNTED))).all()
    return {r[0]: dict(zip(COUNTED, r[1:], strict=True)) for r in rows}


def check(engine: Engine) -> dict[int, dict[str, Any]]:
    with engine.connect() as conn:
        expected = truth(conn)
        assert exact_values(conn) == expected
        return expected


def test_the_models_declare_their_counters() -> None:
    specs = {spec.name: spec for spec in counter_specs(Base.metadata)}
    assert sorted(specs) == [
        "sa.article.direct",
        "sa_article.amount_total",
        "sa_article.comment_count",
        "sa_article.public_comments",
        "sa_article.score_total",
    ]
    public = specs["sa_article.public_comments"]
    assert public.keys == ("article_id",)
    assert public.where is not None
    assert public.where.params == ("public",)
    assert specs["sa_article.amount_total"].scale == 2
    assert specs["sa.article.direct"].mode == "direct"
    assert counter_spec(Article.public_comments) == public
    with pytest.raises(InvalidArgument, match="not a pgcounters counted"):
        exact(Article.title)
    column = Article.__table__.c.comment_count
    assert str(column.type) == "BIGINT"
    assert not column.nullable


def test_orm_bulk_and_raw_writes_are_counted(engine: Engine, dsn: str) -> None:
    with engine.begin() as conn:
        assert install_counters(conn, Base.metadata) == [
            s.name for s in counter_specs(Base.metadata)
        ]
    with Session(engine) as session:  # the ORM
        first, second = Article(title="a"), Article(title="b")
        session.add_all([first, second])
        session.flush()
        first.comments += [
            Comment(status="public", score=3, amount=Decimal("1.25")),
            Comment(status="hidden", score=4, amount=Decimal("2.50")),
        ]
        session.add(Comment(article_id=second.id, score=7))
        session.commit()
        ids = (first.id, second.id)
        # read-your-writes of the direct counter, through the ORM
        session.refresh(first)
        assert first.direct_count == 2
    assert check(engine)[ids[0]]["comment_count"] == 2
    with engine.begin() as conn:  # bulk statements of the Core
        conn.execute(
            insert(Comment),
            [
                {
                    "article_id": ids[i % 2],
                    "status": "public",
                    "score": i,
                    "amount": Decimal("0.10"),
                }
                for i in range(50)
            ],
        )
    check(engine)
    with engine.begin() as conn:
        conn.execute(
            update(Comment)
            .where(Comment.score > 10)
            .values(status="hidden", score=Comment.score + 1)
        )
        conn.execute(update(Comment).where(Comment.score == 5).values(article_id=ids[1]))
    check(engine)
    with engine.begin() as conn:
        conn.execute(delete(Comment).where(Comment.score < 3))
    check(engine)
    with Session(engine) as session:  # ORM bulk by primary key, and ORM delete
        session.execute(
            update(Comment),
            [{"id": cid, "score": 100} for cid in session.scalars(select(Comment.id).limit(5))],
        )
        session.delete(session.scalars(select(Comment).limit(1)).one())
        session.commit()
    check(engine)
    with engine.begin() as conn:  # raw SQL
        conn.execute(
            text(
                "INSERT INTO sa_comment (article_id, status, score, amount)"
                " VALUES (:a, 'public', 9, 3.33)"
            ),
            {"a": ids[0]},
        )
        conn.execute(text("UPDATE sa_comment SET amount = amount + 1 WHERE status = 'public'"))
    # another program, on its own connection
    with psycopg.connect(dsn, autocommit=True) as other:
        other.execute("DELETE FROM sa_comment WHERE score = 100")
    expected = check(engine)
    assert expected[ids[0]]["comment_count"] > 0
    # the queue drained, the stored columns are the truth
    with psycopg.connect(dsn, autocommit=True) as raw:
        Counters(raw).drain()
    with engine.connect() as conn:
        assert stored(conn) == expected
    # a deleted article: its comments go by cascade, nothing is left pending for it
    with engine.begin() as conn:
        conn.execute(delete(Article).where(Article.id == ids[1]))
    check(engine)


def test_exact_reads_an_aliased_entity(engine: Engine) -> None:
    with engine.begin() as conn:
        install_counters(conn, Base.metadata)
        conn.execute(insert(Article), [{"id": 1}, {"id": 2}])
        conn.execute(insert(Comment), [{"article_id": 1}, {"article_id": 1}, {"article_id": 2}])
    other = aliased(Article)
    with engine.connect() as conn:
        rows = conn.execute(
            select(Article.id, other.id, exact(other.comment_count)).join(
                other, other.id == Article.id + 1
            )
        ).all()
    assert rows == [(1, 2, 1)]


def test_install_counts_the_rows_already_there(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(insert(Article), [{"id": i} for i in range(1, 21)])
        conn.execute(
            insert(Comment),
            [
                {
                    "article_id": 1 + i % 20,
                    "status": "public" if i % 3 else "hidden",
                    "score": i,
                    "amount": Decimal("0.05"),
                }
                for i in range(300)
            ],
        )
    with engine.begin() as conn:
        install_counters(conn, Base.metadata)
    with engine.connect() as conn:  # stored right away, nothing pending: the backfill ran
        expected = truth(conn)
        assert stored(conn) == expected
        assert exact_values(conn) == expected
        assert conn.execute(text("SELECT count(*) FROM pgcounters.backfills")).scalar() == 0
    with engine.begin() as conn:  # nothing to do a second time
        assert install_counters(conn, Base.metadata) == []
    with engine.begin() as conn:  # counter triggers disabled by hand: a comment uncounted
        found = conn.execute(
            text(
                "SELECT t.tgname FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid"
                " WHERE t.tgrelid = 'sa_comment'::regclass"
                "   AND p.prosrc LIKE '%-- pgcounters spec fingerprint=%'"
            )
        ).scalars()
        for name in found:
            conn.execute(text(f'ALTER TABLE sa_comment DISABLE TRIGGER "{name}"'))
        conn.execute(insert(Comment), [{"article_id": 1, "status": "public", "score": 1}])
    with engine.begin() as conn:  # installed again, and the rows counted again
        assert install_counters(conn, Base.metadata)
    with engine.connect() as conn:
        assert stored(conn) == exact_values(conn) == truth(conn)


def test_triggers_of_an_earlier_version_are_installed_again_without_counting_again(
    engine: Engine,
) -> None:
    """As docs/sqlalchemy.md says after an upgrade: drift reports triggers compiled by an
    earlier version as outdated, and installing the metadata's counters again replaces
    them without reading the counted rows again."""
    with engine.begin() as conn:
        conn.execute(insert(Article), [{"id": i} for i in range(1, 4)])
        install_counters(conn, Base.metadata)
        conn.execute(
            insert(Comment), [{"article_id": 1 + i % 3, "status": "public"} for i in range(9)]
        )
    with engine.begin() as conn:  # one trigger as an earlier version compiled it
        source = conn.execute(
            text(
                "SELECT pg_get_functiondef(t.tgfoid) FROM pg_trigger t"
                " JOIN pg_proc p ON p.oid = t.tgfoid WHERE t.tgrelid = 'sa_comment'::regclass"
                "   AND p.prosrc LIKE '%-- pgcounters spec fingerprint=%event=insert%'"
                " ORDER BY t.tgname LIMIT 1"
            )
        ).scalar_one()
        conn.execute(text(source.replace("RETURN NULL;", "RETURN NULL; -- earlier", 1)))
    with engine.begin() as conn:
        driver = conn.connection.driver_connection
        assert isinstance(driver, psycopg.Connection)
        states = [d.state for d in triggers.drift(driver)]
        assert states.count("outdated") == 1
        assert install_counters(conn, Base.metadata) == []  # its definition is unchanged
        scans = text("SELECT pg_stat_get_xact_numscans('sa_comment'::regclass)")
        before = conn.execute(scans).scalar()
        triggers.install(driver, counter_specs(Base.metadata))  # as the docs write it
        assert conn.execute(scans).scalar() == before  # the comments were not read again
        assert {d.state for d in triggers.drift(driver)} == {"installed"}
    check(engine)


def test_a_writer_beside_the_install_is_counted_once(engine: Engine, dsn: str) -> None:
    """Rows a transaction writes while the counters are installed: the install waits for it
    (its CREATE TRIGGER needs the table), then counts its rows, exactly once."""
    with engine.begin() as conn:
        conn.execute(insert(Article), [{"id": 1}, {"id": 2}])
        conn.execute(insert(Comment), [{"article_id": 1, "score": 2}] * 5)
    errors: list[BaseException] = []
    with (
        psycopg.connect(dsn) as writer,
        psycopg.connect(dsn, autocommit=True) as observer,
        engine.connect() as conn,
    ):
        pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
        conn.commit()
        writer.execute(
            "INSERT INTO sa_comment (article_id, status, score, amount)"
            " VALUES (1, 'public', 3, 1.50), (2, 'hidden', 4, 2.25)"
        )

        def install() -> None:
            try:
                with conn.begin():
                    install_counters(conn, Base.metadata)
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        thread = threading.Thread(target=install)
        thread.start()
        wait_for_lock_wait(observer, pid)  # the install waits for the writer
        writer.commit()
        thread.join()
    assert not errors
    expected = check(engine)
    assert expected[1]["comment_count"] == 6
    assert expected[2]["score_total"] == 4
    with psycopg.connect(dsn, autocommit=True) as raw:
        Counters(raw).drain()
    with engine.connect() as conn:
        assert stored(conn) == expected


def test_a_failed_install_leaves_nothing(engine: Engine) -> None:
    metadata = MetaData()
    Table("broken_src", metadata, Column("id", Integer, primary_key=True), Column("k", Integer))
    declare_counter(
        metadata,
        CounterSpec("sa.broken", "broken_src", NamedTarget(("bigint",)), keys=("no_such_column",)),
    )
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE broken_src (id int PRIMARY KEY, k int)"))
    with pytest.raises(InvalidCounterDefinition, match="no_such_column"), engine.begin() as conn:
        install_counters(conn, [Base.metadata, metadata])
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM pgcounters.specs")).scalar() == 0
        assert (
            conn.execute(text("SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'pgc_%'")).scalar()
            == 0
        )


def test_a_named_counter_declared_beside_the_models(engine: Engine, dsn: str) -> None:
    metadata = MetaData()
    declare_counter(
        metadata,
        CounterSpec(
            "sa.comments.by_status", "sa_comment", NamedTarget(("text",)), keys=("status",)
        ),
    )
    with engine.begin() as conn:
        conn.execute(insert(Article), [{"id": 1}])
        conn.execute(insert(Comment), [{"article_id": 1, "status": s} for s in "aabbbc"])
        install_counters(conn, [Base.metadata, metadata])
    with psycopg.connect(dsn, autocommit=True) as raw:
        counters = Counters(raw)
        assert [counters.get("sa.comments.by_status", s) for s in "abc"] == [2, 3, 1]
        raw.execute(
            "INSERT INTO sa_comment (article_id, status, score, amount) VALUES (1, 'c', 0, 0)"
        )
        assert counters.get("sa.comments.by_status", "c") == 2


def test_the_database_keeps_the_column_to_itself(engine: Engine) -> None:
    with engine.begin() as conn:
        install_counters(conn, Base.metadata)
    with Session(engine) as session:
        article = Article(comment_count=7)  # a new row starts at 0 whatever it says
        session.add(article)
        session.commit()
        assert session.scalar(select(Article.comment_count)) == 0
        article.comment_count = 5
        with pytest.raises(DBAPIError, match="kept by pgcounters"):
            session.commit()


def test_install_needs_the_schema(empty_dsn: str) -> None:
    engine = create_engine(url(empty_dsn))
    try:
        with engine.begin() as conn:
            Base.metadata.create_all(conn)
        with pytest.raises(SchemaNotInstalled), engine.begin() as conn:
            install_counters(conn, Base.metadata)
        with engine.begin() as conn:
            assert install_schema(conn) is None
            install_counters(conn, Base.metadata)
        with engine.begin() as conn:
            assert install_schema(conn) is not None
    finally:
        engine.dispose()


ELSEWHERE = Table("elsewhere", MetaData(), Column("x", Integer))


def _declare(via: str, **options: Any) -> MetaData:
    """Fresh models of a parent and its children with one counted column on the parent (the
    relationship and the column added once both classes exist)."""

    class Other(DeclarativeBase):
        pass

    class Parent(Other):
        __tablename__ = "bad_parent"
        id: Mapped[int] = mapped_column(primary_key=True)
        title: Mapped[str] = mapped_column(String(10))

    class Child(Other):
        __tablename__ = "bad_child"
        id: Mapped[int] = mapped_column(primary_key=True)
        parent_id: Mapped[int] = mapped_column(ForeignKey("bad_parent.id"))
        ratio: Mapped[float] = mapped_column()
        amount: Mapped[Decimal] = mapped_column(Numeric())

    Parent.children = relationship(Child)
    Parent.probe = counted(via, **options)
    Other.metadata.info["classes"] = (Parent, Child)  # alive as long as the test needs them
    return Other.metadata


@pytest.mark.parametrize(
    ("via", "options", "message"),
    [
        ("missing", {}, "no relationship 'missing'"),
        ("children", {"sum": "ratio"}, "floating-point"),
        ("children", {"sum": "nope"}, "no column attribute 'nope'"),
        ("children", {"sum": "parent_id", "decimal_places": 2}, "no decimal_places"),
        ("children", {"sum": "amount", "decimal_places": 2}, r"no scale: give the column"),
        ("children", {"filter": "status = 'x'"}, "the filter is a function"),
        ("children", {"filter": lambda c: ELSEWHERE.c.x == 1}, "its own columns"),
    ],
)
def test_bad_declarations_say_what_is_wrong(
    via: str, options: dict[str, Any], message: str
) -> None:
    metadata = _declare(via, **options)
    with pytest.raises(InvalidCounterDefinition, match=message):
        counter_specs(metadata)


def test_a_many_to_one_relationship_is_refused() -> None:
    with pytest.raises(InvalidCounterDefinition, match="not a one-to-many"):
        counter_specs(_declare_reverse())


def _declare_reverse() -> MetaData:
    class Other(DeclarativeBase):
        pass

    class Parent(Other):
        __tablename__ = "p"
        id: Mapped[int] = mapped_column(primary_key=True)

    class Child(Other):
        __tablename__ = "c"
        id: Mapped[int] = mapped_column(primary_key=True)
        parent_id: Mapped[int] = mapped_column(ForeignKey("p.id"))

    Child.parent = relationship(Parent)
    Child.wrong = counted("parent")
    Other.metadata.info["classes"] = (Parent, Child)
    return Other.metadata


def test_bad_arguments_are_refused_at_once() -> None:
    with pytest.raises(InvalidCounterDefinition, match="mode must be"):
        counted("children", mode="later")  # type: ignore[arg-type]
    with pytest.raises(InvalidCounterDefinition, match="counts rows"):
        counted("children", decimal_places=2)


def test_the_async_engine(dsn: str) -> None:
    async def main() -> None:
        engine = create_async_engine(url(dsn))
        try:
            async with engine.begin() as conn:
                await conn.run_sync(Base.metadata.create_all)
                await conn.run_sync(install_counters, Base.metadata)
            async with AsyncSession(engine) as session:
                article = Article()
                session.add(article)
                await session.flush()
                session.add_all(
                    [
                        Comment(article_id=article.id, score=i, status="public" if i % 2 else "x")
                        for i in range(10)
                    ]
                )
                await session.commit()
                await session.execute(delete(Comment).where(Comment.score > 7))
                await session.commit()
                row = (
                    await session.execute(select(*(exact(getattr(Article, n)) for n in COUNTED)))
                ).one()
                assert tuple(row) == (8, 4, 28, Decimal("0.00"), 8)
                assert [type(v) for v in row] == [int, int, int, Decimal, int]
            async with engine.connect() as conn:
                expected = await conn.run_sync(truth)
                assert await conn.run_sync(exact_values) == expected
        finally:
            await engine.dispose()

    asyncio.run(main())


def test_dropping_a_path_counter_from_the_catalog_leaves_no_trigger_function(
    engine: Engine,
) -> None:
    """A counter through a path has functions for its path's tables too: a drop that finds
    its triggers in the catalog (no previous definition) removes every one of them."""
    from pgcounters import triggers
    from pgcounters.contrib.sqlalchemy import ddl
    from pgcounters.specs import Via

    spec = CounterSpec(
        name="sa.comments_per_author",
        source="sa_comment",
        keys=(Fragment('"sa_article".id % %s', (3,)),),
        via=(Via("sa_article", link="article_id"),),
        target=NamedTarget(("bigint",)),
    )
    functions = (
        "SELECT count(*) FROM pg_proc WHERE proname LIKE 'pgc\\_sa\\_comments\\_per\\_author%%'"
    )
    with engine.begin() as conn:
        dbapi = conn.connection.driver_connection
        assert isinstance(dbapi, psycopg.Connection)
        triggers.install(dbapi, [spec])
        runner = ddl.ConnectionRunner(conn)
        assert runner.fetchall(functions)[0][0] > 4  # the counted table's and the path's
        found = [t[:3] for t in ddl.triggers_of(runner)[spec.name]]
        for statement in ddl.drop_statements(spec.name, None, found):
            runner.execute(statement)
        assert runner.fetchall(functions) == [(0,)]


def test_a_counter_changed_to_other_key_parts_by_a_migration_is_counted_again(
    engine: Engine,
) -> None:
    """What ``op.change_counter`` runs, for a named counter whose key parts changed: the
    old counter's values are keyed otherwise, so it goes and the backfill counts the rows
    again (the migration failed with "already exists with another definition")."""
    from pgcounters.contrib.sqlalchemy import ddl

    with engine.begin() as conn:
        conn.execute(insert(Article), [{"id": 1}, {"id": 2}])
        conn.execute(
            insert(Comment),
            [{"article_id": 1, "status": s} for s in ("public", "public", "hidden")]
            + [{"article_id": 2, "status": "public"}],
        )
    name = "sa.comments.per_article"
    per_article = CounterSpec(
        name=name, source="sa_comment", keys=("article_id",), target=NamedTarget(("bigint",))
    )
    per_status = CounterSpec(
        name=name,
        source="sa_comment",
        keys=("article_id", "status"),
        target=NamedTarget(("bigint", "text")),
    )
    with engine.begin() as conn:
        for statement in ddl.create_statements(per_article):
            conn.execute(text(statement))
    with engine.begin() as conn:
        for statement in ddl.drop_statements(name, per_article):
            conn.execute(text(statement))
        for statement in ddl.create_statements(per_status, changed=True):
            conn.execute(text(statement))
    with engine.begin() as conn:
        conn.execute(insert(Comment), [{"article_id": 2, "status": "hidden"}])
        values = [
            conn.execute(
                text("SELECT pgcounters.get(:n, CAST(:k AS text[]))"), {"n": name, "k": k}
            ).scalar()
            for k in ("{1,public}", "{1,hidden}", "{2,public}", "{2,hidden}")
        ]
    assert values == [2, 1, 1, 1]
