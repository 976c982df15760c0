"""The first program of a guide, read from the page itself so that the test runs what a
reader copies: its code, and the output each ``print`` promises in its comment."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"


def first_program(page: str) -> tuple[Path, str]:
    """The path of ``docs/<page>`` and its first ``python`` block."""
    path = DOCS / page
    block = re.search(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), re.S)
    assert block is not None, f"docs/{page} has no python block"
    return path, block.group(1)


def promised(program: str) -> list[Any]:
    """The values the program's ``print`` lines promise in their comments."""
    return [
        ast.literal_eval(line.split("#", 1)[1].strip())
        for line in program.splitlines()
        if line.strip().startswith("print(")
    ]


def printed(capsys: pytest.CaptureFixture[str]) -> list[Any]:
    """The values the program printed, a line each."""
    return [ast.literal_eval(line) for line in capsys.readouterr().out.splitlines()]
