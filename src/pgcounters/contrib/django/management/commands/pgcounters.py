"""``manage.py pgcounters <verb>``: the pgcounters command line on Django's database.

One option of its own: ``verify --truth orm`` checks the counters declared on
models against the ORM's own count instead of the count compiled from their
specs (see :mod:`pgcounters.contrib.django.orm_truth`).
"""

from __future__ import annotations

import argparse
import sys
from argparse import REMAINDER
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from pgcounters import cli
from pgcounters.cli.types import non_negative_int
from pgcounters.contrib.django.db import dsn
from pgcounters.errors import PgCountersError

PROG = "manage.py pgcounters"
TRUTHS = ("spec", "orm")
ORM_TRUTH = "the ORM's own count (QuerySet.values(key).annotate(Count or Sum))"


def _orm_verify_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"{PROG} verify", exit_on_error=False)
    p.add_argument("counter", nargs="*", metavar="COUNTER")
    p.add_argument("--truth", choices=TRUTHS, required=True)
    p.add_argument("--show", type=non_negative_int, default=5, metavar="N")
    p.add_argument("--json", action="store_true")
    return p


def _truth_of(args: list[str]) -> tuple[str, list[str]]:
    """The --truth of a verify command line, and the command line without it."""
    truth, rest, i = "spec", [], 0
    while i < len(args):
        arg = args[i]
        if arg == "--truth" and i + 1 < len(args):
            truth, i = args[i + 1], i + 2
            continue
        if arg.startswith("--truth="):
            truth = arg.partition("=")[2]
        else:
            rest.append(arg)
        i += 1
    return truth, rest


def verify_with_orm(argv: list[str], database: str) -> int:
    """``verify --truth orm``: the counters declared on models against the ORM's count."""
    from pgcounters.contrib.django.orm_truth import verify_orm

    try:
        args = _orm_verify_parser().parse_args(argv)
    except argparse.ArgumentError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return cli.EXIT_USAGE
    try:
        results = verify_orm(args.counter, using=database)
    except PgCountersError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return cli.EXIT_ERROR
    return cli.report_verify(results, show=args.show, as_json=args.json, truth=ORM_TRUTH)


class Command(BaseCommand):
    help = (
        "pgcounters commands (install, drain, verify, recount, ...) on Django's database; "
        "`verify --truth orm` checks the counters declared on models against the ORM's own count."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--database", default="default", help="Django database alias")
        parser.add_argument("args", nargs=REMAINDER, help="a pgcounters command and its options")

    def handle(self, *args: str, **options: Any) -> None:
        from pgcounters.contrib.django.events import flush_arguments

        code = None
        if args and args[0] == "verify":
            truth, rest = _truth_of(list(args[1:]))
            if truth not in TRUTHS:
                print(
                    f"{PROG}: error: --truth must be one of {', '.join(TRUTHS)}, got {truth!r}",
                    file=sys.stderr,
                )
                code = cli.EXIT_USAGE
            elif truth == "orm":
                code = verify_with_orm([*rest, "--truth", "orm"], options["database"])
            else:
                args = ("verify", *rest)
        if code is None:
            argv = ["--dsn", dsn(options["database"]), *flush_arguments(args)]
            on_change = None
            if args and args[0] == "worker":
                # a worker run through Django sends the counters_changed signal
                from pgcounters.contrib.django.signals import signal_callback

                on_change = signal_callback(options["database"])
            try:
                code = cli.run(argv, prog=PROG, on_change=on_change)
                sys.stdout.flush()
            except BrokenPipeError:  # `manage.py pgcounters list | head`
                code = cli.reader_gone()
        if code:
            raise CommandError(f"pgcounters exited with status {code}", returncode=code)
