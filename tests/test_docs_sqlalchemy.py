"""docs/sqlalchemy.md's programs, run as they are against a real database.

The code is read from the page itself: every line must run, and its ``print`` must show
what its comment promises. The database is empty: the program installs the schema.
"""

from __future__ import annotations

import re
import sys
import types

import pytest

from docs_programs import DOCS, first_program, printed, promised
from sqlalchemy_models import url

PLACEHOLDER = '"postgresql+psycopg:///app"'


def test_the_sqlalchemy_page_program_runs_and_prints_what_it_promises(
    empty_dsn: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    page, program = first_program("sqlalchemy.md")
    assert program.count(PLACEHOLDER) == 1
    expected = promised(program)
    assert len(expected) == 1
    real = repr(url(empty_dsn).render_as_string(hide_password=False))
    # a module of its own, as a program's: SQLAlchemy reads the models' annotations there
    module = types.ModuleType("docs_sqlalchemy")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    namespace = module.__dict__
    exec(compile(program.replace(PLACEHOLDER, real), str(page), "exec"), namespace)
    assert printed(capsys) == expected
    engine = namespace["engine"]
    engine.dispose()


def test_the_path_counter_program_runs_and_prints_what_it_promises(
    empty_dsn: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The program of the section on counting through a path: the counts its ``print``
    lines promise are the ones written by hand in the comments (2 public comments on the
    published article, then 3 once the other is published), read exact and stored."""
    text = (DOCS / "sqlalchemy.md").read_text(encoding="utf-8")
    section = text.split("### Counting through a path:", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block is not None
    program = block.group(1)
    assert "via=(Via(" in program
    assert program.count(PLACEHOLDER) == 1
    expected = promised(program)
    assert expected == [2, 3, 3]
    real = repr(url(empty_dsn).render_as_string(hide_password=False))
    module = types.ModuleType("docs_sqlalchemy_path")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    namespace = module.__dict__
    exec(compile(program.replace(PLACEHOLDER, real), "sqlalchemy.md (path)", "exec"), namespace)
    assert printed(capsys) == expected
    namespace["engine"].dispose()
