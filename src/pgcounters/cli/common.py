"""What every verb group of the command line shares: exit codes, the parser, verb
registration, the database a command runs on, and library errors turned into exit codes."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from typing import Any, NoReturn

import psycopg

from pgcounters.config import database
from pgcounters.errors import InvalidKey, PgCountersError
from pgcounters.keys import KeyType

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_MORE = 3
"""``drain``: a bound or a signal stopped it with deltas still queued."""
EXIT_REFUSED = 4
"""``quota call``: the call was refused."""
EXIT_DRIFT = 5
"""``verify``: drift found."""
EXIT_INTERRUPTED = 130

Handler = Callable[[argparse.Namespace, str], int]
"""A verb: the parsed arguments and the DSN of the database, to an exit code."""

AddVerb = Callable[[str, Handler, str], argparse.ArgumentParser]
"""Adds a verb (name, handler, help) and returns its parser, for its options."""

NO_DATABASE_NOTICE = ("demo", "server", "bench")
"""Verbs that say themselves which database they use (no embedded-server notice)."""


class Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line on stderr and exit 2."""

    def error(self, message: str) -> NoReturn:
        # an argparse type says "must be ...": name the option as the subject of it
        message = re.sub(r"^argument ([^:]+): must ", r"\1 must ", " ".join(message.split()))
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def verbs(sub: Any) -> AddVerb:
    """The function adding a verb to the subparsers ``sub``."""

    def add(name: str, handler: Handler, help_text: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(handler=handler, verb_parser=p, check=None)
        return p

    return add


def verb_group(sub: Any, command: str, help_text: str, description: str) -> AddVerb:
    """``pgcounters COMMAND VERB``: the group's parser; returns the function adding a verb."""
    group = sub.add_parser(command, help=help_text, description=description)
    return verbs(group.add_subparsers(dest=f"{command}_command", required=True, metavar="VERB"))


Check = Callable[[argparse.Namespace], str | None]
"""A verb's check of its options taken together: what is wrong with them, or None."""


def check_usage(args: argparse.Namespace) -> None:
    """Run the verb's check before any database is opened: a usage error exits 2."""
    check: Check | None = args.check
    problem = check(args) if check is not None else None
    if problem:
        parser: argparse.ArgumentParser = args.verb_parser
        parser.error(problem)


def print_json(value: object, *, indent: int | None = None) -> None:
    """One JSON document on stdout."""
    print(json.dumps(value, indent=indent))


def iso(value: Any) -> str | None:
    """An instant in ISO 8601, or None."""
    return None if value is None else str(value.isoformat())


def parse_key(text: str | None, key_types: tuple[KeyType, ...]) -> object:
    """Command-line key text (parts separated by commas) as Python values."""
    import datetime as dt

    if not key_types:
        if text:
            raise InvalidKey("this counter is global and takes no key")
        return None
    if text is None:
        raise InvalidKey(f"this counter needs a key of ({', '.join(key_types)})")
    parts = text.split(",") if len(key_types) > 1 else [text]
    if len(parts) != len(key_types):
        raise InvalidKey(f"expected {len(key_types)} comma-separated key parts, got {text!r}")
    out: list[object] = []
    for part, key_type in zip(parts, key_types, strict=True):
        try:
            if key_type == "bigint":
                out.append(int(part))
            elif key_type == "date":
                out.append(dt.date.fromisoformat(part))
            else:
                out.append(part)
        except ValueError:
            raise InvalidKey(f"{part!r} is not a valid {key_type}") from None
    return tuple(out) if len(out) > 1 else out[0]


def run_verb(args: argparse.Namespace, prog: str) -> int:
    """Run the verb the arguments name; library errors become one line and an exit code."""
    handler: Handler = args.handler
    try:
        if getattr(args, "no_database", False):
            # a verb that only prints what the package holds (schema --sql)
            return handler(args, "")
        # with no DSN, an embedded server, said on stderr; demo, bench and server say
        # themselves which database they use
        with database(args.dsn, args.data_dir, quiet=args.command in NO_DATABASE_NOTICE) as dsn:
            return handler(args, dsn)
    except PgCountersError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except psycopg.Error as exc:
        # what pgcounters does not explain itself (a deadlock in a user trigger, a
        # dropped connection): still one line, never a traceback
        message = " ".join(str(exc).split()) or type(exc).__name__
        print(f"{prog}: error: PostgreSQL: {message}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
