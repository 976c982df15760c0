"""The ``pgcounters`` command line. One parser, reused by ``manage.py pgcounters``.

Each group of verbs lives in a module of its own, with a ``configure_<group>(subparsers)``
adding its verbs: :mod:`~pgcounters.cli.operations` (install, upgrade, version, schema, drain,
worker, status, wakeup, flush), :mod:`~pgcounters.cli.counters` (create, drop, list,
backfill, incr, get, top), :mod:`~pgcounters.cli.quotas` (``quota VERB``),
:mod:`~pgcounters.cli.repair` (verify, recount, ``quarantine VERB``),
:mod:`~pgcounters.cli.security` (grant) and :mod:`~pgcounters.cli.demos` (demo, bench,
server). What they share is in :mod:`~pgcounters.cli.common`; the argument types in
:mod:`~pgcounters.cli.types`.

Exit codes: 0 success; 1 a pgcounters error (the message says which); 2 bad usage (one
line, before any database is opened); 3 ``drain`` stopped by its bound with deltas still
queued; 4 ``quota call`` refused the call; 5 ``verify`` found drift; 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn

from pgcounters import __version__
from pgcounters.cli.common import (
    EXIT_DRIFT,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_MORE,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_USAGE,
    Parser,
    check_usage,
    run_verb,
)
from pgcounters.cli.counters import configure_counters
from pgcounters.cli.demos import configure_demos
from pgcounters.cli.operations import configure_operations, configure_worker_logging
from pgcounters.cli.quotas import configure_quotas
from pgcounters.cli.repair import configure_repair, report_verify
from pgcounters.cli.security import configure_security

if TYPE_CHECKING:
    from pgcounters.notifications import ChangeCallback

__all__ = [
    "EXIT_DRIFT",
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_MORE",
    "EXIT_OK",
    "EXIT_REFUSED",
    "EXIT_USAGE",
    "build_parser",
    "configure_worker_logging",
    "main",
    "report_verify",
    "run",
]


def build_parser(prog: str = "pgcounters") -> argparse.ArgumentParser:
    """The argument parser of every pgcounters command (also used by the Django command)."""
    parser = Parser(
        prog=prog,
        description="Exact, fast counters for PostgreSQL; increments lock no counter row "
        "(queued and unlogged modes).",
        epilog="With no --dsn, PGCOUNTERS_DSN or DATABASE_URL, an embedded PostgreSQL is "
        "started with its data in ./pgcounters-data (or PGCOUNTERS_DATA_DIR).",
    )
    parser.add_argument("--version", action="version", version=f"pgcounters {__version__}")
    parser.add_argument("--dsn", help="PostgreSQL connection string (default: $PGCOUNTERS_DSN)")
    parser.add_argument("--data-dir", help="data directory of the embedded PostgreSQL")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    configure_operations(sub)
    configure_counters(sub)
    configure_quotas(sub)
    configure_repair(sub)
    configure_security(sub)
    configure_demos(sub)
    return parser


def run(
    argv: Sequence[str] | None = None,
    *,
    prog: str = "pgcounters",
    on_change: ChangeCallback | None = None,
) -> int:
    """Run one command; return its exit code. Bad usage raises ``SystemExit(2)``, as
    argparse does, before any database is opened. ``on_change``: the ``worker``
    command's change callback (:class:`pgcounters.Worker`)."""
    parser = build_parser(prog)
    args, extras = parser.parse_known_args(argv)
    if extras:  # named by the verb that was given them, as its other usage errors are
        verb: argparse.ArgumentParser = getattr(args, "verb_parser", None) or parser
        verb.error(f"unrecognized arguments: {' '.join(extras)}")
    check_usage(args)
    args.on_change = on_change
    return run_verb(args, prog)


def reader_gone() -> int:
    """The reader of stdout went away (`pgcounters status | head`): what is left to print
    goes nowhere, quietly, as with cat. Returns the exit code."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_ERROR


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """The console script (and ``python -m pgcounters``): run, then exit with the code."""
    try:
        code = run(argv)
        sys.stdout.flush()
    except BrokenPipeError:
        code = reader_gone()
    sys.exit(code)
