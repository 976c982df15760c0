"""Least privilege: ``pgcounters grant``."""

from __future__ import annotations

import argparse
from typing import Any

from pgcounters.cli.common import EXIT_OK, verbs
from pgcounters.config import connect


def _check_grant(args: argparse.Namespace) -> str | None:
    if args.app or args.worker or args.pause or args.revoke:
        return None
    return "name at least one role: --app ROLE, --worker ROLE, --pause ROLE or --revoke ROLE"


def _cmd_grant(args: argparse.Namespace, dsn: str) -> int:
    from pgcounters import security

    with connect(dsn) as conn:
        done: list[str] = []
        for role in args.revoke or []:
            done += security.revoke(conn, role)
        for role in args.app or []:
            done += security.grant_app(conn, role)
        for role in args.worker or []:
            done += security.grant_worker(conn, role)
        for role in args.pause or []:
            done += security.grant_pause(conn, role)
    if not args.quiet:
        for statement in done:
            print(statement + ";")
    return EXIT_OK


def configure_security(sub: Any) -> None:
    """grant."""
    add = verbs(sub)
    p = add(
        "grant",
        _cmd_grant,
        "grant an application or worker role its rights on pgcounters (roles must exist)",
    )
    p.add_argument("--app", action="append", metavar="ROLE", help="enqueue, quota calls, reads")
    p.add_argument(
        "--worker", action="append", metavar="ROLE", help="drain, recount, purge (and app rights)"
    )
    p.add_argument(
        "--pause",
        action="append",
        metavar="ROLE",
        help="may pause counting in its own sessions (bulk imports followed by a recount)",
    )
    p.add_argument(
        "--revoke",
        action="append",
        metavar="ROLE",
        help="take back what --app, --worker and --pause gave",
    )
    p.add_argument("--quiet", "-q", action="store_true", help="do not print the statements")
    p.set_defaults(check=_check_grant)
