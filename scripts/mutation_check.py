"""Show that the suite fails when the trigger compiler is wrong.

Applies, one at a time, a deliberate fault to src/pgcounters/compiler.py (the
code that writes the triggers' deltas and, through ``truth_query``, the truth
``verify`` and ``recount`` use), runs the tests that judge declared counters,
and reports whether each mutant was killed (the tests failed). The file is
restored after each run, whatever happens. Not run by CI: ``make mutation-check``.

Exit status: 0 when every mutant is killed, 1 when one survives, 2 when the
unmutated suite does not pass or a fault no longer applies to the compiler.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMPILER = ROOT / "src" / "pgcounters" / "compiler.py"
TESTS = [
    "tests/test_triggers.py",
    "tests/test_truth.py",
    "tests/test_django.py",
    "tests/test_django_orm_truth.py",
]
# a changed trigger body changes the fingerprint Django's migrations record: this test fails
# on any change of the compiler, right or wrong, so it proves nothing about the counts
IGNORED = ["tests/test_django.py::test_makemigrations_has_nothing_to_add"]
SHOWN = 3


@dataclass(frozen=True)
class Mutant:
    name: str
    before: str
    after: str


MUTANTS = [
    Mutant(
        "drop the condition",
        "    if spec.where is not None:\n        parts.append(",
        "    if False:\n        parts.append(",
    ),
    Mutant(
        "swap OLD and NEW signs on UPDATE",
        "            contributions(spec, old, typed=typed, negate=True),\n"
        "            contributions(spec, new, typed=typed),\n",
        "            contributions(spec, old, typed=typed),\n"
        "            contributions(spec, new, typed=typed, negate=True),\n",
    ),
    Mutant(
        "ignore a NULL key part (only the last part of a key is tested)",
        'parts += [sql.SQL("({}) IS NOT NULL").format(_expr(k)) for k in spec.keys]',
        'parts += [sql.SQL("({}) IS NOT NULL").format(_expr(k)) for k in spec.keys[-1:]]',
    ),
    Mutant(
        "sum the wrong column (the first key column instead of the summed one)",
        'return sql.SQL("coalesce(sum({}), 0)").format(_expr(spec.sum))',
        'return sql.SQL("coalesce(sum({}), 0)").format(_expr(spec.keys[0]))',
    ),
]


def run_tests(tests: list[str]) -> tuple[int, list[str], float]:
    """Run the tests; return pytest's exit status, the failing tests and the seconds."""
    started = time.monotonic()
    deselect = [arg for test in IGNORED for arg in ("--deselect", test)]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *deselect, *tests],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", proc.stdout, re.MULTILINE)
    return proc.returncode, failed, time.monotonic() - started


def _named(failed: list[str]) -> str:
    shown = ", ".join(failed[:SHOWN])
    return shown + (f" and {len(failed) - SHOWN} more" if len(failed) > SHOWN else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tests", nargs="*", default=TESTS, help=f"default: {' '.join(TESTS)}")
    parser.add_argument("--verbose", action="store_true", help="list every failing test")
    args = parser.parse_args(argv)
    original = COMPILER.read_text(encoding="utf-8")
    for mutant in MUTANTS:
        if original.count(mutant.before) != 1:
            print(f"mutation-check: the fault {mutant.name!r} no longer applies to {COMPILER}")
            return 2
    code, failed, seconds = run_tests(args.tests)
    if code != 0:
        print(f"mutation-check: the unmutated suite fails ({_named(failed) or f'exit {code}'})")
        return 2
    print(f"unmutated: passed ({seconds:.0f} s)")
    survivors = 0
    for mutant in MUTANTS:
        try:
            COMPILER.write_text(original.replace(mutant.before, mutant.after), encoding="utf-8")
            code, failed, seconds = run_tests(args.tests)
        finally:
            COMPILER.write_text(original, encoding="utf-8")
        if code == 1:
            print(f"killed:   {mutant.name}: {len(failed)} tests failed ({seconds:.0f} s)")
            for test in failed if args.verbose else failed[:SHOWN]:
                print(f"          {test}")
            if not args.verbose and len(failed) > SHOWN:
                print(f"          ... and {len(failed) - SHOWN} more (--verbose lists them)")
        elif code == 0:
            survivors += 1
            print(f"SURVIVED: {mutant.name}: every test passed ({seconds:.0f} s)")
        else:
            survivors += 1
            print(f"ERROR:    {mutant.name}: pytest exited with {code}, not a test failure")
    print(f"{len(MUTANTS) - survivors} of {len(MUTANTS)} mutants killed")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
