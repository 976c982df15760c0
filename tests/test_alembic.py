"""The Alembic operations, through real `alembic` commands on a temporary project: a
database whose tables already hold rows gets the schema and its counters (the rows
counted), offline mode writes SQL that does the same, autogenerate notices what
changed, a downgrade puts the previous definitions back, and a migration that fails
half-way leaves nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from pgcounters import Counters
from pgcounters.connection import Conn
from sqlalchemy_models import url

TABLES = """
CREATE TABLE sa_article (id bigserial PRIMARY KEY, title varchar(200) NOT NULL DEFAULT '',
                         comment_count bigint NOT NULL DEFAULT 0,
                         public_comments bigint NOT NULL DEFAULT 0);
CREATE TABLE sa_comment (id bigserial PRIMARY KEY,
                         article_id bigint REFERENCES sa_article (id) ON DELETE CASCADE,
                         status varchar(20) NOT NULL DEFAULT 'public');
CREATE INDEX ix_sa_comment_article_id ON sa_comment (article_id);
INSERT INTO sa_article (id) SELECT generate_series(1, 30);
INSERT INTO sa_comment (article_id, status)
SELECT 1 + i % 30, CASE WHEN i % 3 = 0 THEN 'hidden' ELSE 'public' END
  FROM generate_series(1, 500) AS i;
"""

MODELS = """
from sqlalchemy import BigInteger, ForeignKey, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from pgcounters.contrib.sqlalchemy import counted


class Base(DeclarativeBase):
    pass


class Article(Base):
    __tablename__ = "sa_article"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    title: Mapped[str] = mapped_column(String(200), server_default="")
    comments: Mapped[list["Comment"]] = relationship()
    comment_count: Mapped[int] = {comment_count}
    public_comments: Mapped[int] = counted("comments", filter=lambda c: c.status == {status!r})


class Comment(Base):
    __tablename__ = "sa_comment"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    article_id: Mapped[int | None] = mapped_column(
        BigInteger, ForeignKey("sa_article.id", ondelete="CASCADE"), index=True
    )
    status: Mapped[str] = mapped_column(String(20), server_default="public")
"""

COUNTED = 'counted("comments")'
PLAIN = 'mapped_column(BigInteger, server_default="0")'


def _project(folder: Path, dsn: str, template: str) -> Path:
    folder.mkdir()
    _alembic(folder, "init", "-t", template, "migrations")
    ini = folder / "alembic.ini"
    ini.write_text(
        ini.read_text().replace(
            "driver://user:pass@localhost/dbname",
            url(dsn).render_as_string(hide_password=False).replace("%", "%%"),
        )
    )
    env = folder / "migrations" / "env.py"
    env.write_text(
        env.read_text().replace(
            "target_metadata = None",
            "import pgcounters.contrib.alembic  # noqa: F401\n"
            "from models import Base\n"
            "target_metadata = Base.metadata",
        )
    )
    _models(folder)
    return folder


def _models(folder: Path, *, comment_count: str = COUNTED, status: str = "public") -> None:
    (folder / "models.py").write_text(MODELS.format(comment_count=comment_count, status=status))
    for cached in folder.glob("__pycache__/models*"):
        cached.unlink()


def _alembic(folder: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "alembic", *args],
        cwd=folder,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _failing(folder: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "alembic", *args], cwd=folder, capture_output=True, text=True
    )
    assert done.returncode != 0
    return done.stderr


def _revision(folder: Path, message: str) -> str:
    _alembic(folder, "revision", "--autogenerate", "-m", message)
    (found,) = (folder / "migrations" / "versions").glob(f"*_{message}.py")
    return found.read_text()


def _truth(conn: Conn, status: str = "public") -> list[tuple[int, int, int]]:
    rows = conn.execute(
        "SELECT a.id, count(c.id), count(c.id) FILTER (WHERE c.status = %s)"
        "  FROM sa_article a LEFT JOIN sa_comment c ON c.article_id = a.id"
        " GROUP BY a.id ORDER BY a.id",
        (status,),
    ).fetchall()
    return [(int(a), int(b), int(c)) for a, b, c in rows]


def _stored(conn: Conn) -> list[tuple[int, int, int]]:
    rows = conn.execute(
        "SELECT id, comment_count, public_comments FROM sa_article ORDER BY id"
    ).fetchall()
    return [(int(a), int(b), int(c)) for a, b, c in rows]


def _triggers(conn: Conn) -> int:
    row = conn.execute("SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'pgc\\_%'").fetchone()
    assert row is not None
    return int(row[0])


def _installed(conn: Conn) -> bool:
    row = conn.execute("SELECT to_regclass('pgcounters.migrations') IS NOT NULL").fetchone()
    return bool(row and row[0])


@pytest.mark.parametrize("template", ["generic", "async"])
def test_autogenerate_upgrade_offline_and_downgrade(
    tmp_path: Path, empty_dsn: str, another_empty_dsn: str, template: str
) -> None:
    project = _project(tmp_path / "project", empty_dsn, template)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(TABLES)
    first = _revision(project, "counters")
    assert "op.install_pgcounters()" in first
    assert first.count("op.create_counter(") == 2
    assert "op.drop_counter(" in first  # the downgrade
    assert "op.create_table" not in first  # the tables exist: only the counters are new

    # offline: reviewable SQL, nothing done to the database
    script = _alembic(project, "upgrade", "head", "--sql")
    for piece in ("CREATE TABLE pgcounters.migrations", "CREATE OR REPLACE TRIGGER",
                     "FOR NO KEY UPDATE", "UPDATE \"public\".\"sa_article\" AS x SET"):  # fmt: skip
        assert piece in script
    lines = script.splitlines()
    assert lines.count("BEGIN;") == 1
    assert lines.count("COMMIT;") == 1
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert not _installed(conn)
        assert _triggers(conn) == 0
    # ... and that SQL, run by psql's hand, does what the online upgrade does
    with psycopg.connect(another_empty_dsn, autocommit=True) as other:
        other.execute(TABLES)
        other.execute(script.encode())
        assert _stored(other) == _truth(other)

    _alembic(project, "upgrade", "head")
    _alembic(project, "check")  # the database is what the models declare
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        expected = _truth(conn)
        assert _stored(conn) == expected  # the rows already there are counted
        assert sum(row[1] for row in expected) == 500
        conn.execute("INSERT INTO sa_comment (article_id, status) VALUES (1, 'public')")
        Counters(conn).drain()
        assert _stored(conn) == _truth(conn)
    nothing = _revision(project, "nothing")
    assert "op.create_counter(" not in nothing
    assert "op.change_counter(" not in nothing
    _alembic(project, "upgrade", "head")

    # the models change: one filter is another, one column is no longer counted
    _models(project, comment_count=PLAIN, status="hidden")
    differences = _failing(project, "check")
    assert "('change_counter', 'sa_article.public_comments')" in differences
    assert "('drop_counter', 'sa_article.comment_count')" in differences
    second = _revision(project, "changed")
    assert second.count("op.change_counter(") == 2  # the upgrade, and its downgrade
    assert "op.drop_counter(\n        'sa_article.comment_count'" in second
    _alembic(project, "upgrade", "head")
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM sa_comment WHERE article_id = 2")
        Counters(conn).drain()
        kept, hidden = _stored(conn), _truth(conn, "hidden")
        assert [(a, c) for a, _, c in kept] == [(a, c) for a, _, c in hidden]
        assert kept[1][1] > 0  # comment_count is no longer kept
        _, pending = Counters(conn).pending()
        assert pending == 0

    # down again: the previous definitions, counted from the rows as they are now
    _alembic(project, "downgrade", "-1")
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert _stored(conn) == _truth(conn)
    undo = _alembic(project, "downgrade", "head:base", "--sql")  # offline, the way back too
    assert "DROP TRIGGER IF EXISTS" in undo
    assert "DELETE FROM pgcounters.specs" in undo
    _alembic(project, "downgrade", "base")
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert _triggers(conn) == 0
        assert conn.execute("SELECT count(*) FROM pgcounters.specs").fetchone() == (0,)
        assert _installed(conn)  # the schema stays: it holds the counters' values


def test_a_migration_failing_half_way_leaves_nothing(tmp_path: Path, empty_dsn: str) -> None:
    project = _project(tmp_path / "project", empty_dsn, "generic")
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(TABLES)
    text = _revision(project, "counters")
    (path,) = (project / "migrations" / "versions").glob("*_counters.py")
    marker = "    # ### end Alembic commands ###"
    upgrade_end = text.index(marker)
    path.write_text(text[:upgrade_end] + '    op.execute("SELECT 1 / 0")\n' + text[upgrade_end:])
    assert "division by zero" in _failing(project, "upgrade", "head")
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert not _installed(conn)
        assert _triggers(conn) == 0
        assert conn.execute("SELECT count(*) FROM alembic_version").fetchone() == (0,)


def test_new_tables_and_their_counters_in_one_revision(tmp_path: Path, empty_dsn: str) -> None:
    project = _project(tmp_path / "project", empty_dsn, "async")
    first = _revision(project, "everything")
    upgrade = first[: first.index("def downgrade")]
    # the tables first, then the schema and the counters over them
    assert upgrade.index("op.create_table('sa_comment'") < upgrade.index("op.install_pgcounters()")
    assert upgrade.index("op.install_pgcounters()") < upgrade.index("op.create_counter(")
    downgrade = first[first.index("def downgrade") :]
    assert downgrade.index("op.drop_counter(") < downgrade.index("op.drop_table('sa_comment')")
    _alembic(project, "upgrade", "head")
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO sa_article (id) VALUES (1)")
        conn.execute("INSERT INTO sa_comment (article_id, status) VALUES (1, 'public'), (1, 'x')")
        Counters(conn).drain()
        assert _stored(conn) == _truth(conn) == [(1, 2, 1)]
    _alembic(project, "downgrade", "base")
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT to_regclass('sa_article')").fetchone() == (None,)


def test_a_disabled_counter_trigger_is_a_difference_and_its_migration_recounts(
    tmp_path: Path, empty_dsn: str
) -> None:
    project = _project(tmp_path / "project", empty_dsn, "generic")
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(TABLES)
    _revision(project, "counters")
    _alembic(project, "upgrade", "head")
    _alembic(project, "check")
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        (trigger,) = conn.execute(
            "SELECT t.tgname FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid"
            " WHERE t.tgrelid = 'sa_comment'::regclass AND p.prosrc LIKE"
            " '%event=insert name=sa_article.public_comments%'"
        ).fetchone() or ("",)
        conn.execute(f'ALTER TABLE sa_comment DISABLE TRIGGER "{trigger}"')
        conn.execute("INSERT INTO sa_comment (article_id, status) VALUES (3, 'public')")
        Counters(conn).drain()
        assert _stored(conn) != _truth(conn)  # the comment went uncounted
    differences = _failing(project, "check")
    assert "('change_counter', 'sa_article.public_comments')" in differences
    assert "comment_count" not in differences  # its triggers are all enabled
    repair = _revision(project, "repair")
    assert repair.count("op.change_counter(") == 2  # the upgrade, and its downgrade
    _alembic(project, "upgrade", "head")
    _alembic(project, "check")
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert _stored(conn) == _truth(conn)  # counted again from the rows
        row = conn.execute(
            "SELECT count(*) FROM pg_trigger WHERE tgenabled = 'D' AND tgname LIKE 'pgc\\_%'"
        ).fetchone()
        assert row == (0,)
