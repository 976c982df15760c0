"""Faults put into pgcounters one at a time: the suite must fail on each.

Each fault is a text edit of one file of the package: the trigger compiler, the SQL engine
(``sql/schema.sql``, which a fresh install reads) or the Python side. An edit is anchored:
its ``before`` text must occur in the file exactly ``count`` times (once, unless the same
code is repeated on purpose), so a fault cannot silently stop applying when the code around
it changes. ``tests/test_mutants.py`` checks every anchor on every run of the suite;
``make mutation-check`` (``scripts/mutation_check.py``) runs, for each fault, the tests it
names against a copy of the package with the fault in it, and reports which faults
survived.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "pgcounters"


@dataclass(frozen=True)
class Edit:
    before: str
    after: str
    count: int = 1
    """How many times ``before`` occurs in the file: all of them are replaced."""


@dataclass(frozen=True)
class Fault:
    name: str
    """Short and unique: ``--only NAME`` runs this fault alone."""
    what: str
    path: str
    """The file, relative to ``src/pgcounters``."""
    edits: tuple[Edit, ...]
    tests: tuple[str, ...]
    """The tests that should fail with the fault in (files or node ids, from the root)."""
    ignored: tuple[str, ...] = field(default=())
    """Tests left out of the run: they fail on any change of the file, right or wrong."""

    @property
    def file(self) -> Path:
        return PACKAGE / self.path

    def problems(self, text: str) -> list[str]:
        """What keeps the fault from applying to ``text`` exactly as written (none: it
        applies)."""
        out = []
        for number, edit in enumerate(self.edits, start=1):
            found = text.count(edit.before)
            if found != edit.count:
                times = "once" if edit.count == 1 else f"{edit.count} times"
                out.append(
                    f"fault {self.name!r}: edit {number} of {len(self.edits)} should match "
                    f"{times} in src/pgcounters/{self.path}, it matches {found} times; "
                    f"anchor: {edit.before.strip()[:80]!r}"
                )
            if edit.before == edit.after:
                out.append(f"fault {self.name!r}: edit {number} changes nothing")
        return out

    def apply(self, text: str) -> str:
        """``text`` with the fault in (ValueError when an anchor does not match)."""
        problems = self.problems(text)
        if problems:
            raise ValueError("; ".join(problems))
        for edit in self.edits:
            text = text.replace(edit.before, edit.after)
        return text


# tests of declared counters, judged against truths written in the test
COMPILER_TESTS = ("tests/test_triggers.py", "tests/test_truth.py")

# the drain's upsert of named counters: four static statements (logged or unlogged queue,
# sole drainer or not) and a dynamic one (a counter whose table is gone), indented deeper
_UPSERT = (
    "{i} ORDER BY s.target_id, s.key\n"
    "{i}ON CONFLICT (target_id, key) DO UPDATE SET value = k.value + excluded.value\n"
    "{i}RETURNING 1\n"
)
_STATIC = " " * 16
_DYNAMIC = " " * 20


def _upsert(indent: str, *, ordered: bool = True, sign: str = "+") -> str:
    text = _UPSERT.format(i=indent)
    if not ordered:
        text = text.replace(f"{indent} ORDER BY s.target_id, s.key\n", "")
    return text.replace("k.value + excluded.value", f"k.value {sign} excluded.value")


FAULTS: tuple[Fault, ...] = (
    # -- the trigger compiler ------------------------------------------------------------
    Fault(
        "compiler-where-dropped",
        "a counter's condition (where) is left out of the triggers and the truth",
        "compiler.py",
        (
            Edit(
                "    if spec.where is not None:\n"
                '        parts.append(sql.SQL("({})").format(spec.where.composed()))\n'
                '    parts += [sql.SQL("({}) IS NOT NULL").format(_expr(k)) for k in spec.keys]',
                "    if False:\n"
                '        parts.append(sql.SQL("({})").format(spec.where.composed()))\n'
                '    parts += [sql.SQL("({}) IS NOT NULL").format(_expr(k)) for k in spec.keys]',
            ),
        ),
        COMPILER_TESTS,
    ),
    Fault(
        "compiler-update-signs-swapped",
        "an UPDATE statement adds the old rows and takes the new ones away",
        "compiler.py",
        (
            Edit(
                "            contributions(spec, old, typed=typed, negate=True),\n"
                "            contributions(spec, new, typed=typed),\n",
                "            contributions(spec, old, typed=typed),\n"
                "            contributions(spec, new, typed=typed, negate=True),\n",
            ),
        ),
        COMPILER_TESTS,
    ),
    Fault(
        "compiler-null-key-part",
        "a row with a NULL key part counts unless it is the last part",
        "compiler.py",
        (
            Edit(
                'parts += [sql.SQL("({}) IS NOT NULL").format(_expr(k)) for k in spec.keys]',
                'parts += [sql.SQL("({}) IS NOT NULL").format(_expr(k)) for k in spec.keys[-1:]]',
            ),
        ),
        COMPILER_TESTS,
    ),
    Fault(
        "compiler-sum-wrong-column",
        "a statement of several rows sums the first key column instead of the summed one",
        "compiler.py",
        (
            Edit(
                'return _summed(spec, sql.SQL("sum({})").format(_sum_expr(spec)))',
                'return _summed(spec, sql.SQL("sum({})").format('
                "_expr(spec.keys[0]) if spec.keys else _sum_expr(spec)))",
            ),
        ),
        COMPILER_TESTS,
    ),
    Fault(
        "compiler-one-row-delete-adds",
        "a DELETE of one row adds its contribution instead of taking it away",
        "compiler.py",
        (
            Edit(
                'return sql.SQL("{}({})::bigint").format(sql.SQL("-") if negate '
                'else sql.SQL(""), value)',
                'return sql.SQL("{}({})::bigint").format(sql.SQL(""), value)',
            ),
        ),
        ("tests/test_single_row_statements.py", "tests/test_triggers.py"),
    ),
    Fault(
        "compiler-column-guard-open",
        "the guard of a counter column lets anyone write the column",
        "compiler.py",
        (
            Edit(
                "            \"    IF current_setting({applying}, true) = 'on' THEN\\n\"\n",
                "            \"    IF current_setting({applying}, true) = 'on' OR true THEN\\n\"\n",
            ),
        ),
        ("tests/test_django_current_triggers.py", "tests/test_sqlalchemy.py"),
    ),
    # -- the SQL engine (schema.sql) --------------------------------------------------------
    Fault(
        "sql-get-ignores-unlogged-queue",
        "SQL get, get_many and get_decimal leave out the unlogged queue's pending deltas",
        "sql/schema.sql",
        (
            Edit(
                "    IF NOT v_standby THEN\n"
                "        v_pending := v_pending + coalesce((SELECT sum(delta) "
                "FROM pgcounters.queue_unlogged",
                "    IF false THEN\n"
                "        v_pending := v_pending + coalesce((SELECT sum(delta) "
                "FROM pgcounters.queue_unlogged",
            ),
        ),
        ("tests/test_sql_reads.py", "tests/test_sql_interface.py"),
    ),
    Fault(
        "sql-hour-in-session-zone",
        "an hour bucket starts at the hour of the session's time zone, not the counter's",
        "sql/schema.sql",
        (
            Edit(
                "SELECT pgcounters.bucket_text('hour', p_zone, "
                "date_trunc('hour', p_value, p_zone))",
                "SELECT pgcounters.bucket_text('hour', p_zone, date_trunc('hour', p_value))",
            ),
        ),
        ("tests/test_sql_reads.py", "tests/test_buckets.py"),
    ),
    Fault(
        "sql-drain-all-stops-on-busy",
        "drain_all stops at a batch left wholly busy although deltas wait behind it",
        "sql/schema.sql",
        (
            Edit(
                "    v_done[i] := r.deltas = 0 AND r.quarantined = 0 "
                "AND (r.busy = 0 OR NOT r.ahead);",
                "    v_done[i] := r.deltas = 0 AND r.quarantined = 0;",
            ),
        ),
        ("tests/test_drain_busy_batch.py", "tests/test_sql_interface.py"),
    ),
    Fault(
        "sql-drain-upsert-unordered",
        "the drain upserts named counters without their key order (drainers may deadlock)",
        "sql/schema.sql",
        (
            Edit(_upsert(_STATIC), _upsert(_STATIC, ordered=False), count=4),
            Edit(_upsert(_DYNAMIC), _upsert(_DYNAMIC, ordered=False)),
        ),
        ("tests/test_drain_key_order.py",),
    ),
    Fault(
        "sql-drain-subtracts",
        "the drain takes a batch's delta away from a stored value instead of adding it",
        "sql/schema.sql",
        (
            Edit(_upsert(_STATIC), _upsert(_STATIC, sign="-"), count=4),
            Edit(_upsert(_DYNAMIC), _upsert(_DYNAMIC, sign="-")),
        ),
        ("tests/test_sql_interface.py", "tests/test_drain_edges.py"),
    ),
    Fault(
        "sql-quarantine-skipped",
        "the careful drain drops the deltas it cannot apply instead of setting them aside",
        "sql/schema.sql",
        (
            Edit(
                "             WHERE r.id = ANY (g.ids)\n             ORDER BY r.id;\n",
                "             WHERE false AND r.id = ANY (g.ids)\n             ORDER BY r.id;\n",
            ),
        ),
        ("tests/test_quarantine.py",),
    ),
    Fault(
        "sql-busy-column-deltas-dropped",
        "deltas of a parent row an application holds are dropped instead of queued again",
        "sql/schema.sql",
        (
            Edit(
                "                      FROM held AS h\n                     ORDER BY h.key\n",
                "                      FROM held AS h WHERE false\n"
                "                     ORDER BY h.key\n",
            ),
        ),
        ("tests/test_nonblocking_drain.py",),
    ),
    Fault(
        "sql-quota-decided-from-a-prior-read",
        "a fixed-window quota decides from a read made before its row is locked",
        "sql/schema.sql",
        (
            # the usage read first (into a variable the fixed windows leave unused) ...
            Edit(
                "        window_end := pgcounters.quota_window_end("
                "v_period, v_seconds, v_zone, window_start);\n",
                "        window_end := pgcounters.quota_window_end("
                "v_period, v_seconds, v_zone, window_start);\n"
                "        v_bucket := coalesce((SELECT p.used FROM pgcounters.quota_usage AS p\n"
                "                               WHERE p.quota_id = v_id AND p.subject = p_subject\n"
                "                                 AND p.window_start = "
                "register_call.window_start), 0);\n",
            ),
            # ... then the upsert decides from it, not from the row it locked
            Edit(
                "           SET call_limit = excluded.call_limit,\n"
                "               used = CASE WHEN u.used + p_cost <= excluded.call_limit\n",
                "           SET call_limit = excluded.call_limit,\n"
                "               used = CASE WHEN v_bucket + p_cost <= excluded.call_limit\n",
            ),
            Edit(
                "                          + CASE WHEN u.used + p_cost <= excluded.call_limit "
                "THEN 0 ELSE 1 END,\n"
                "               last_allowed = u.used + p_cost <= excluded.call_limit\n",
                "                          + CASE WHEN v_bucket + p_cost <= excluded.call_limit "
                "THEN 0 ELSE 1 END,\n"
                "               last_allowed = v_bucket + p_cost <= excluded.call_limit\n",
            ),
        ),
        ("tests/test_quotas_concurrency.py",),
    ),
    # -- the Python side -------------------------------------------------------------------
    Fault(
        "backfill-cursor-past-held-row",
        "the backfill's cursor moves past a key whose row an application held",
        "backfill.py",
        (
            Edit(
                "        done = next((i for i, k in enumerate(texts) if k in held_texts), "
                "len(texts))\n",
                "        done = len(texts)\n",
            ),
        ),
        ("tests/test_backfill_held_rows.py", "tests/test_backfill.py"),
    ),
    Fault(
        "redis-flush-prunes-in-doubt",
        "a Redis flush lets the flush log prune the ids of flushes still in doubt",
        "redis_buffer.py",
        (Edit("                    keep=in_doubt,\n", "                    keep=(),\n"),),
        ("tests/test_redis_buffer.py",),
    ),
    Fault(
        "client-drain-stops-on-busy",
        "Counters.drain stops at a batch left wholly busy although deltas wait behind it",
        "client.py",
        (
            Edit(
                "        return self.deltas == 0 and self.quarantined == 0 "
                "and (self.busy == 0 or not self.ahead)\n",
                "        return self.deltas == 0 and self.quarantined == 0\n",
            ),
        ),
        ("tests/test_drain_busy_batch.py", "tests/test_nonblocking_drain.py"),
    ),
    Fault(
        "worker-waits-on-busy",
        "the worker waits its interval after a batch left wholly busy although deltas wait "
        "behind it",
        "worker.py",
        (
            Edit(
                "        got = deltas + (batch.busy if batch.ahead else 0)\n",
                "        got = deltas\n",
            ),
        ),
        ("tests/test_drain_busy_batch.py", "tests/test_worker.py"),
    ),
)


def by_name(names: list[str]) -> list[Fault]:
    """The faults named (KeyError naming the unknown ones)."""
    known = {f.name: f for f in FAULTS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise KeyError(f"no fault named {', '.join(unknown)}; --list lists them")
    return [known[n] for n in names]


# -- the run ---------------------------------------------------------------------------------

GRACE = 60.0  # seconds pytest is given to stop its servers when told to stop


@dataclass(frozen=True)
class Outcome:
    code: int | None
    """pytest's exit status (None: stopped after the time allowed)."""
    failed: list[str]
    first_kind: str | None
    """FAILED (an assertion or an exception in the test) or ERROR (in a fixture)."""
    seconds: float
    tail: str


class Stop(Exception):
    """SIGTERM: stop the run as Ctrl-C does."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise Stop


def _interruptible() -> None:
    """In the child: SIGINT stops pytest (KeyboardInterrupt), even when this run was
    started with SIGINT ignored (in the background of a script)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _stop(proc: subprocess.Popen[str]) -> str:
    """Stop a pytest run and its children: SIGINT first (pytest then stops the PostgreSQL
    servers its fixtures started), SIGKILL if that takes longer than GRACE."""
    try:
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=GRACE)
        return out
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return out
    except ProcessLookupError:
        return ""


def run_tests(
    tests: list[str], ignored: list[str], env: dict[str, str], timeout: float, *, first: bool
) -> Outcome:
    """Run pytest on ``tests`` (stopping at the first failure when ``first``)."""
    started = time.monotonic()
    deselect = [arg for test in ignored for arg in ("--deselect", test)]
    stop_early = ["-x"] if first else []
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *stop_early,
         *deselect, *tests],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        # a group of its own: stopped as a whole, and Ctrl-C reaches it through _stop only
        start_new_session=True,
        preexec_fn=_interruptible,
    )  # fmt: skip
    code: int | None
    try:
        out, _ = proc.communicate(timeout=timeout)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        out, code = _stop(proc), None
    except BaseException:
        _stop(proc)
        raise
    # "FAILED tests/x.py::test[a b] - message": a parametrized id may hold spaces
    found = re.findall(r"^(FAILED|ERROR) (.+?)(?: - .*)?$", out, re.MULTILINE)
    tail = "\n".join(out.strip().splitlines()[-15:])
    return Outcome(
        code,
        [node for _, node in found],
        found[0][0] if found else None,
        time.monotonic() - started,
        tail,
    )


@contextmanager
def package_copy() -> Iterator[tuple[Path, dict[str, str]]]:
    """A copy of the package, and the environment in which pytest (and every process its
    tests start) imports it instead of the worktree's: faults go into the copy, so the
    worktree is never changed, whatever stops the run, and a pytest run beside it in the
    same worktree is not disturbed."""
    with tempfile.TemporaryDirectory(prefix="pgcounters-mutants-") as folder:
        copy = Path(folder) / "src" / "pgcounters"
        shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(copy.parent), env.get("PYTHONPATH", "")) if p
        )
        # a fault may leave a file of the same size within the same second: no stale .pyc
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        found = subprocess.run(
            [sys.executable, "-c", "import pgcounters; print(pgcounters.__file__)"],
            cwd=ROOT, env=env, capture_output=True, text=True, check=False,
        ).stdout.strip()  # fmt: skip
        if Path(found).resolve() != (copy / "__init__.py").resolve():
            raise RuntimeError(f"pytest would import pgcounters from {found}, not from the copy")
        yield copy, env


def _named(failed: list[str], shown: int = 3) -> str:
    more = f" and {len(failed) - shown} more" if len(failed) > shown else ""
    return ", ".join(failed[:shown]) + more


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds // 60:.0f} min {seconds % 60:.0f} s"


def _list() -> None:
    for fault in FAULTS:
        print(f"{fault.name}  (src/pgcounters/{fault.path})")
        print(f"    {fault.what}")
        print(f"    tests: {' '.join(fault.tests)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="mutation_check",
        description="Put each fault into a copy of the package, run the tests it names, and "
        "report whether they failed (killed) or passed (survived). Exit status: 0 when every "
        "fault is killed, 1 when one survives, 2 when a fault no longer applies, or a test a "
        "fault failed fails without it too, or pytest fails otherwise.",
    )
    parser.add_argument("--list", action="store_true", help="list the faults and their tests")
    parser.add_argument(
        "--only", action="append", metavar="NAME", help="run this fault only (repeatable)"
    )
    parser.add_argument(
        "--every-failure",
        action="store_true",
        help="run each mutant's tests to the end and list every failing test (slower: by "
        "default a mutant's run stops at its first failing test)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=900.0,
        metavar="SECONDS",
        help="stop a mutant's tests after this long: the fault is then counted as killed (a "
        "test that hangs on it has seen it); default 900",
    )
    args = parser.parse_args(argv)
    if args.list:
        _list()
        return 0
    try:
        faults = by_name(args.only) if args.only else list(FAULTS)
    except KeyError as exc:
        print(f"mutation-check: {exc.args[0]}")
        return 2
    problems = [p for f in faults for p in f.problems(f.file.read_text(encoding="utf-8"))]
    if problems:
        print("mutation-check: faults that no longer apply:\n  " + "\n  ".join(problems))
        return 2
    signal.signal(signal.SIGTERM, _on_sigterm)
    started = time.monotonic()
    try:
        return _run(faults, first=not args.every_failure, timeout=args.timeout, started=started)
    except (KeyboardInterrupt, Stop):
        print(f"mutation-check: stopped after {_duration(time.monotonic() - started)}")
        return 130


def _say(text: str) -> None:
    print(text, flush=True)


def _confirmed(failed: list[str], env: dict[str, str], timeout: float) -> Outcome:
    """The tests a mutant failed, run again without the fault: they must pass (a test that
    fails anyway killed nothing)."""
    return run_tests(failed, [], env, timeout, first=False)


def _run(faults: list[Fault], *, first: bool, timeout: float, started: float) -> int:
    tests = {t for f in faults for t in f.tests}
    print(f"mutation-check: {len(faults)} faults, {len(tests)} test files", flush=True)
    survived: list[str] = []
    broken: list[str] = []
    with package_copy() as (copy, env):
        for fault in faults:
            target = copy / fault.path
            original = target.read_text(encoding="utf-8")
            try:
                target.write_text(fault.apply(original), encoding="utf-8")
                out = run_tests(list(fault.tests), list(fault.ignored), env, timeout, first=first)
            finally:
                target.write_text(original, encoding="utf-8")
            took = _duration(out.seconds)
            if out.code == 1 and out.failed:
                again = _confirmed(out.failed, env, timeout)
                if again.code == 0:
                    how = "" if out.first_kind == "FAILED" else " (an error, not an assertion)"
                    _say(
                        f"killed:   {fault.name}: {_named(out.failed)} failed{how} ({took}; "
                        f"passes without the fault: {_duration(again.seconds)})"
                    )
                else:
                    broken.append(fault.name)
                    _say(
                        f"ERROR:    {fault.name}: {_named(again.failed or out.failed)} fails "
                        f"without the fault too\n{again.tail}"
                    )
            elif out.code is None:
                _say(f"killed:   {fault.name}: the tests did not end in {took}")
            elif out.code == 0:
                survived.append(fault.name)
                _say(
                    f"SURVIVED: {fault.name}: {fault.what}; every test of "
                    f"{' '.join(fault.tests)} passed ({took})"
                )
            else:
                broken.append(fault.name)
                _say(
                    f"ERROR:    {fault.name}: pytest exited with {out.code}, not a test "
                    f"failure ({took})\n{out.tail}"
                )
    total = _duration(time.monotonic() - started)
    killed = len(faults) - len(survived) - len(broken)
    print(f"{killed} of {len(faults)} faults killed in {total}"
          + (f"; survived: {', '.join(survived)}" if survived else "")
          + (f"; not judged (see ERROR): {', '.join(broken)}" if broken else ""))  # fmt: skip
    return 2 if broken else 1 if survived else 0
