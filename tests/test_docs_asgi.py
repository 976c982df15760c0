"""docs/asgi.md's first program, run as it is against a real database.

The code is read from the page itself: every line must run, and each ``print`` must show
what its comment promises.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[1] / "docs" / "asgi.md"


def _program() -> str:
    block = re.search(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), re.S)
    assert block is not None, "docs/asgi.md has no python block"
    return block.group(1)


def test_the_asgi_page_program_runs_and_prints_what_it_promises(
    dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    program = _program()
    assert program.count('"dbname=app"') == 1
    promised = [
        ast.literal_eval(line.split("#", 1)[1].strip())
        for line in program.splitlines()
        if line.strip().startswith("print(")
    ]
    assert len(promised) == 4
    code = compile(program.replace('"dbname=app"', repr(dsn)), str(PAGE), "exec")
    exec(code, {"__name__": "__main__"})
    printed = [ast.literal_eval(line) for line in capsys.readouterr().out.splitlines()]
    assert printed == promised
