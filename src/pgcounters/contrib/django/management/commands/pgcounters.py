"""``manage.py pgcounters <verb>``: the pgcounters command line on Django's database."""

from __future__ import annotations

from argparse import REMAINDER
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from pgcounters import cli
from pgcounters.contrib.django.db import dsn


class Command(BaseCommand):
    help = "pgcounters commands (install, drain, verify, recount, ...) on Django's database."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--database", default="default", help="Django database alias")
        parser.add_argument("args", nargs=REMAINDER, help="a pgcounters command and its options")

    def handle(self, *args: str, **options: Any) -> None:
        from pgcounters.contrib.django.events import flush_arguments

        argv = ["--dsn", dsn(options["database"]), *flush_arguments(args)]
        code = cli.run(argv, prog="manage.py pgcounters")
        if code:
            raise CommandError(f"pgcounters exited with status {code}", returncode=code)
