"""Every fault of ``make mutation-check`` still applies to today's code, as written.

A fault whose anchor no longer matches (the code around it changed) would stop being
injected without anyone noticing: each must match its file exactly as many times as it
says, name tests that exist, and (for Python) leave code that still compiles, so that
a killed mutant means a test saw the fault, not a syntax error.
"""

from __future__ import annotations

import re

import psycopg
import pytest

from mutants import FAULTS, PACKAGE, ROOT, Edit, Fault, by_name

pytestmark = pytest.mark.fast


@pytest.mark.parametrize("fault", FAULTS, ids=[f.name for f in FAULTS])
def test_the_fault_applies_exactly_as_written(fault: Fault) -> None:
    text = fault.file.read_text(encoding="utf-8")
    assert fault.problems(text) == []
    mutated = fault.apply(text)
    assert mutated != text
    if fault.path.endswith(".py"):
        compile(mutated, str(fault.file), "exec")  # a SyntaxError would kill it for nothing


@pytest.mark.parametrize("fault", FAULTS, ids=[f.name for f in FAULTS])
def test_the_fault_names_tests_that_exist(fault: Fault) -> None:
    assert fault.tests
    for test in (*fault.tests, *fault.ignored):
        path, _, function = test.partition("::")
        assert (ROOT / path).is_file(), f"fault {fault.name!r}: no test file {path}"
        if function:
            source = (ROOT / path).read_text(encoding="utf-8")
            name = function.split("[")[0]
            assert re.search(rf"^(async )?def {name}\(", source, re.MULTILINE), (
                f"fault {fault.name!r}: no test {function} in {path}"
            )


SQL_FAULTS = [f for f in FAULTS if f.path.endswith(".sql")]


@pytest.mark.parametrize("fault", SQL_FAULTS, ids=[f.name for f in SQL_FAULTS])
def test_the_schema_with_the_fault_in_still_installs(empty_dsn: str, fault: Fault) -> None:
    # a fault the schema refuses would fail every test for nothing: installed in a
    # transaction rolled back (a fresh install reads schema.sql alone, no migration after
    # it: tests/test_schema_sql.py checks its version is the last one)
    mutated = fault.apply(fault.file.read_text(encoding="utf-8"))
    with psycopg.connect(empty_dsn) as conn, conn.transaction(force_rollback=True):
        conn.execute(mutated.encode())
        # the file leaves the bodies unchecked (a function may name one defined below): each
        # checked now, all of them defined
        conn.execute("SET LOCAL check_function_bodies = on")
        row = conn.execute(
            "SELECT count(*), count(CASE l.lanname WHEN 'plpgsql' THEN plpgsql_validator(p.oid)"
            "                                      ELSE fmgr_sql_validator(p.oid) END),"
            "       bool_or(p.proname = 'drain_queue')"
            "  FROM pg_proc AS p JOIN pg_language AS l ON l.oid = p.prolang"
            " WHERE p.pronamespace = 'pgcounters'::regnamespace"
            "   AND l.lanname IN ('plpgsql', 'sql')"
        ).fetchone()
        assert row is not None
        functions = row[0]
        assert row == (functions, functions, True)


def test_the_faults_have_distinct_names_and_files_of_the_package() -> None:
    names = [f.name for f in FAULTS]
    assert len(set(names)) == len(names)
    assert all(re.fullmatch(r"[a-z0-9-]+", n) for n in names)
    assert all(f.file.is_relative_to(PACKAGE) and f.file.is_file() for f in FAULTS)
    assert [f.name for f in by_name(["sql-drain-subtracts"])] == ["sql-drain-subtracts"]
    with pytest.raises(KeyError, match="no fault named nothing-like-this"):
        by_name(["nothing-like-this"])


def test_an_anchor_that_matches_twice_or_nowhere_is_named() -> None:
    fault = Fault("example", "an example", "compiler.py", (Edit("a = 1\n", "a = 2\n"),), ())
    assert fault.problems("a = 1\nb = 2\n") == []
    assert fault.apply("a = 1\nb = 2\n") == "a = 2\nb = 2\n"
    assert fault.problems("a = 1\na = 1\n") == [
        "fault 'example': edit 1 of 1 should match once in src/pgcounters/compiler.py, "
        "it matches 2 times; anchor: 'a = 1'"
    ]
    assert fault.problems("b = 2\n") == [
        "fault 'example': edit 1 of 1 should match once in src/pgcounters/compiler.py, "
        "it matches 0 times; anchor: 'a = 1'"
    ]
    with pytest.raises(ValueError, match="it matches 0 times"):
        fault.apply("b = 2\n")
    repeated = Fault("twice", "twice", "compiler.py", (Edit("a = 1\n", "a = 2\n", count=2),), ())
    assert repeated.apply("a = 1\na = 1\n") == "a = 2\na = 2\n"
    assert "should match 2 times" in repeated.problems("a = 1\n")[0]
