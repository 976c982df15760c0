"""docs/sqlalchemy.md's first program, run as it is against a real database.

The code is read from the page itself: every line must run, and its ``print`` must show
what its comment promises. The database is empty: the program installs the schema.
"""

from __future__ import annotations

import ast
import re
import sys
import types
from pathlib import Path

import pytest

from sqlalchemy_models import url

PAGE = Path(__file__).resolve().parents[1] / "docs" / "sqlalchemy.md"
PLACEHOLDER = '"postgresql+psycopg:///app"'


def _program() -> str:
    block = re.search(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), re.S)
    assert block is not None, "docs/sqlalchemy.md has no python block"
    return block.group(1)


def test_the_sqlalchemy_page_program_runs_and_prints_what_it_promises(
    empty_dsn: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    program = _program()
    assert program.count(PLACEHOLDER) == 1
    promised = [
        ast.literal_eval(line.split("#", 1)[1].strip())
        for line in program.splitlines()
        if line.strip().startswith("print(")
    ]
    assert len(promised) == 1
    real = repr(url(empty_dsn).render_as_string(hide_password=False))
    # a module of its own, as a program's: SQLAlchemy reads the models' annotations there
    module = types.ModuleType("docs_sqlalchemy")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    namespace = module.__dict__
    exec(compile(program.replace(PLACEHOLDER, real), str(PAGE), "exec"), namespace)
    printed = [ast.literal_eval(line) for line in capsys.readouterr().out.splitlines()]
    assert printed == promised
    engine = namespace["engine"]
    engine.dispose()
