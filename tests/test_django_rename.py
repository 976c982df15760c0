"""Renaming a counted foreign key and a summed field through Django's own workflow, on a real
database: a copy of a small app in a temporary directory, ``makemigrations`` (answering its
rename questions) and ``migrate`` run as the ``manage.py`` commands a developer runs, then the
counters checked against the truth and a new write counted."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgcounters import Counters
from pgcounters.repair import verify

MODELS = """
from django.db import models

from pgcounters.contrib.django import CountField, SumField


class Shelf(models.Model):
    book_count = CountField("books")
    page_total = SumField("books", "{pages}")


class Book(models.Model):
    {shelf} = models.ForeignKey(Shelf, related_name="books", on_delete=models.CASCADE)
    {pages} = models.IntegerField(default=0)
"""

SETTINGS = """
SECRET_KEY = "test"
USE_TZ = True
INSTALLED_APPS = ["pgtrigger", "pgcounters.contrib.django", "library"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
DATABASES = {{"default": {{"ENGINE": "django.db.backends.postgresql", "NAME": {name!r},
    "HOST": {host!r}, "PORT": {port!r}, "USER": {user!r}}}}}
"""


def _manage(root: Path, *args: str, answers: str = "") -> str:
    env = {**os.environ, "PYTHONPATH": str(root), "DJANGO_SETTINGS_MODULE": "libsettings"}
    done = subprocess.run(
        [sys.executable, "-m", "django", *args],
        cwd=root,
        env=env,
        input=answers,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _values(conn: psycopg.Connection[tuple[object, ...]]) -> list[tuple[object, ...]]:
    return conn.execute(
        "SELECT id, book_count, page_total FROM library_shelf ORDER BY id"
    ).fetchall()


def test_renaming_a_counted_foreign_key_and_a_summed_field(tmp_path: Path, server_dsn: str) -> None:
    name = f"rename_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    params = conninfo_to_dict(server_dsn)
    app = tmp_path / "library"
    (app / "migrations").mkdir(parents=True)
    (app / "__init__.py").write_text("")
    (app / "migrations" / "__init__.py").write_text("")
    (app / "models.py").write_text(MODELS.format(shelf="shelf", pages="pages"))
    (tmp_path / "libsettings.py").write_text(
        SETTINGS.format(
            name=name,
            host=str(params.get("host", "")),
            port=str(params.get("port", "")),
            user=str(params.get("user", "")),
        )
    )
    try:
        _manage(tmp_path, "makemigrations", "library", "--noinput")
        _manage(tmp_path, "migrate", "--noinput")
        params["dbname"] = name
        with psycopg.connect(make_conninfo(**params), autocommit=True) as conn:  # type: ignore[arg-type]
            conn.execute(
                "INSERT INTO library_shelf DEFAULT VALUES; INSERT INTO library_shelf DEFAULT VALUES"
            )
            conn.execute(
                "INSERT INTO library_book (shelf_id, pages) VALUES (1, 100), (1, 20), (2, 7)"
            )
            # rename the counted foreign key and the summed field, as a developer does
            (app / "models.py").write_text(MODELS.format(shelf="case", pages="leaves"))
            made = _manage(tmp_path, "makemigrations", "library", answers="y\ny\n")
            migration = next(p for p in (app / "migrations").glob("0002_*.py")).read_text()
            assert "RenameField" in migration, made
            assert "RemoveTrigger" in migration
            assert "AddTrigger" in migration
            assert migration.index("RemoveTrigger") < migration.index("RenameField")
            assert migration.index("RenameField") < migration.index("AddTrigger")
            _manage(tmp_path, "migrate", "--noinput")
            columns = {
                r[0]
                for r in conn.execute(
                    "SELECT column_name FROM information_schema.columns"
                    " WHERE table_name = 'library_book'"
                ).fetchall()
            }
            assert {"case_id", "leaves"} <= columns
            assert verify(conn, "library.shelf.book_count").mismatches == []
            assert verify(conn, "library.shelf.page_total").mismatches == []
            # a new write is counted by the triggers of the renamed columns
            conn.execute("INSERT INTO library_book (case_id, leaves) VALUES (2, 5)")
            conn.execute("UPDATE library_book SET leaves = leaves + 1 WHERE case_id = 1")
            assert verify(conn, "library.shelf.book_count").mismatches == []
            assert verify(conn, "library.shelf.page_total").mismatches == []
            Counters(conn).drain()
            assert _values(conn) == [(1, 2, 122), (2, 2, 12)]
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


KEYED = """
from django.db import models

from pgcounters.contrib.django import register_counter


class Book(models.Model):
    shelf_id = models.IntegerField()
    genre = models.CharField(max_length=20, default="novel")


per_shelf = register_counter("library.books.per_shelf", Book, keys=({keys}))
"""


def test_changing_a_named_counters_key_parts_recounts_it_and_writes_go_on(
    tmp_path: Path, server_dsn: str
) -> None:
    """The counter's old values are keyed otherwise: ``migrate`` drops them and counts the
    rows again under the new key. Before, it failed with "already exists with another
    definition" and left triggers that refused every write to the counted table."""
    name = f"rekey_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    params = conninfo_to_dict(server_dsn)
    app = tmp_path / "library"
    (app / "migrations").mkdir(parents=True)
    (app / "__init__.py").write_text("")
    (app / "migrations" / "__init__.py").write_text("")
    (app / "models.py").write_text(KEYED.format(keys='"shelf_id",'))
    (tmp_path / "libsettings.py").write_text(
        SETTINGS.format(
            name=name,
            host=str(params.get("host", "")),
            port=str(params.get("port", "")),
            user=str(params.get("user", "")),
        )
    )
    counter = "library.books.per_shelf"
    try:
        _manage(tmp_path, "makemigrations", "library", "--noinput")
        _manage(tmp_path, "migrate", "--noinput")
        params["dbname"] = name
        with psycopg.connect(make_conninfo(**params), autocommit=True) as conn:  # type: ignore[arg-type]
            conn.execute(
                "INSERT INTO library_book (shelf_id, genre)"
                " VALUES (1, 'novel'), (1, 'poem'), (2, 'novel')"
            )
            assert Counters(conn).get(counter, 1) == 2
            (app / "models.py").write_text(KEYED.format(keys='"shelf_id", "genre"'))
            _manage(tmp_path, "makemigrations", "library", "--noinput")
            _manage(tmp_path, "migrate", "--noinput")
            # the table takes writes, counted under the new key
            conn.execute("INSERT INTO library_book (shelf_id, genre) VALUES (1, 'novel')")
            pc = Counters(conn)
            assert [pc.get(counter, k) for k in ((1, "novel"), (1, "poem"), (2, "novel"))] == [
                2,
                1,
                1,
            ]
            assert verify(conn, counter).mismatches == []
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


BROKEN = {
    "no such relation": 'book_count = CountField("nothing")',
    "no such key field": 'per = register_counter("library.per", Shelf, keys=("nope",))',
    # two counters under one name kept one counter (the last one recorded) silently
    "one name twice": 'a = register_counter("library.all", Shelf)\n'
    'b = register_counter("library.all", Shelf, filter=models.Q(id__gt=1))',
}


@pytest.mark.parametrize("declaration", BROKEN.values(), ids=BROKEN.keys())
def test_a_declaration_that_does_not_compile_is_a_system_check_error(
    tmp_path: Path, declaration: str
) -> None:
    """It raised from the app's ready(), so every command (check, runserver, migrate) died
    with a traceback (or, for a name declared twice, passed and kept one counter); the
    system check now reports it, as the docs say."""
    app = tmp_path / "library"
    (app / "migrations").mkdir(parents=True)
    (app / "__init__.py").write_text("")
    (app / "migrations" / "__init__.py").write_text("")
    (app / "models.py").write_text(
        "from django.db import models\n"
        "from pgcounters.contrib.django import CountField, register_counter\n\n\n"
        "class Shelf(models.Model):\n"
        + (
            f"    {declaration}\n"
            if "CountField" in declaration
            else f"    pass\n\n\n{declaration}\n"
        )
    )
    (tmp_path / "libsettings.py").write_text(
        SETTINGS.format(name="unused", host="127.0.0.1", port="1", user="nobody")
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "DJANGO_SETTINGS_MODULE": "libsettings"}
    done = subprocess.run(
        [sys.executable, "-m", "django", "check"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert "(pgcounters.E001)" in done.stderr
    assert "Traceback" not in done.stderr


RENAMED = """
from django.db import models

from pgcounters.contrib.django import CountField


class Shelf(models.Model):
    book_count = CountField("books")


class {book}(models.Model):
    shelf = models.ForeignKey(Shelf, related_name="books", on_delete=models.CASCADE)
"""


def test_renaming_a_counted_model(tmp_path: Path, server_dsn: str) -> None:
    """Django writes RenameModel before the trigger operations; the counter's triggers on the
    renamed table named it, and the rename was refused ("this change to table ... breaks
    counter ..."). makemigrations now removes them before the rename, adds them after."""
    name = f"renmodel_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    params = conninfo_to_dict(server_dsn)
    app = tmp_path / "library"
    (app / "migrations").mkdir(parents=True)
    (app / "__init__.py").write_text("")
    (app / "migrations" / "__init__.py").write_text("")
    (app / "models.py").write_text(RENAMED.format(book="Book"))
    (tmp_path / "libsettings.py").write_text(
        SETTINGS.format(
            name=name,
            host=str(params.get("host", "")),
            port=str(params.get("port", "")),
            user=str(params.get("user", "")),
        )
    )
    try:
        _manage(tmp_path, "makemigrations", "library", "--noinput")
        _manage(tmp_path, "migrate", "--noinput")
        params["dbname"] = name
        with psycopg.connect(make_conninfo(**params), autocommit=True) as conn:  # type: ignore[arg-type]
            conn.execute("INSERT INTO library_shelf DEFAULT VALUES")
            conn.execute("INSERT INTO library_book (shelf_id) VALUES (1), (1)")
            (app / "models.py").write_text(RENAMED.format(book="Volume"))
            _manage(tmp_path, "makemigrations", "library", answers="y\n")
            migration = next(p for p in (app / "migrations").glob("0002_*.py")).read_text()
            assert migration.index("RemoveTrigger") < migration.index("RenameModel")
            assert migration.index("RenameModel") < migration.index("AddTrigger")
            _manage(tmp_path, "migrate", "--noinput")
            conn.execute("INSERT INTO library_volume (shelf_id) VALUES (1)")
            assert verify(conn, "library.shelf.book_count").mismatches == []
            Counters(conn).drain()
            assert conn.execute("SELECT book_count FROM library_shelf").fetchone() == (3,)
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
