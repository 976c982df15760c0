"""docs/asgi.md's first program, run as it is against a real database.

The code is read from the page itself: every line must run, and each ``print`` must show
what its comment promises.
"""

from __future__ import annotations

import pytest

from docs_programs import first_program, printed, promised


def test_the_asgi_page_program_runs_and_prints_what_it_promises(
    dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    page, program = first_program("asgi.md")
    assert program.count('"dbname=app"') == 1
    expected = promised(program)
    assert len(expected) == 5
    code = compile(program.replace('"dbname=app"', repr(dsn)), str(page), "exec")
    exec(code, {"__name__": "__main__"})
    assert printed(capsys) == expected
