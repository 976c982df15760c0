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


def run_tests(tests: list[str]) -> tuple[int, str, float]:
    """Run the tests; return pytest's exit status, the first failing test and the seconds."""
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    failed = re.search(r"^(?:FAILED|ERROR) (\S+)", proc.stdout, re.MULTILINE)
    return proc.returncode, failed.group(1) if failed else "", time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tests", nargs="*", default=TESTS, help=f"default: {' '.join(TESTS)}")
    args = parser.parse_args(argv)
    original = COMPILER.read_text(encoding="utf-8")
    for mutant in MUTANTS:
        if original.count(mutant.before) != 1:
            print(f"mutation-check: the fault {mutant.name!r} no longer applies to {COMPILER}")
            return 2
    code, failed, seconds = run_tests(args.tests)
    if code != 0:
        print(f"mutation-check: the unmutated suite fails ({failed or f'exit {code}'})")
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
            print(f"killed:   {mutant.name}: {failed} failed ({seconds:.0f} s)")
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
