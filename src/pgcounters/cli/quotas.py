"""``pgcounters quota VERB``: define quotas and limits, register calls, report, purge."""

from __future__ import annotations

import argparse
from typing import Any

from pgcounters.cli.common import EXIT_ERROR, EXIT_OK, EXIT_REFUSED, iso, print_json, verb_group
from pgcounters.cli.types import (
    duration,
    instant,
    json_object,
    non_negative_int,
    positive_int,
    window,
)
from pgcounters.config import connect


def _cmd_quota_define(args: argparse.Namespace, dsn: str) -> int:
    from pgcounters.quotas import Quotas

    with connect(dsn) as conn:
        quota = Quotas(conn).define_quota(
            args.name,
            args.limit,
            window=args.window,
            time_zone=args.time_zone,
            log=args.log,
            granularity=args.granularity,
        )
    print(quota.describe())
    return EXIT_OK


def _cmd_quota_drop(args: argparse.Namespace, dsn: str) -> int:
    from pgcounters.quotas import Quotas

    with connect(dsn) as conn:
        dropped = Quotas(conn).drop_quota(args.name)
    print(f"dropped quota {args.name}" if dropped else f"no quota named {args.name}")
    return EXIT_OK if dropped else EXIT_ERROR


def _cmd_quota_list(args: argparse.Namespace, dsn: str) -> int:
    from pgcounters.quotas import Quotas

    with connect(dsn) as conn:
        found = Quotas(conn).quotas()
    if args.json:
        print_json([
            {"name": q.name, "window": q.window, "time_zone": q.time_zone,
             "default_limit": q.default_limit, "log": q.log_calls}
            for q in found
        ])  # fmt: skip
        return EXIT_OK
    for q in found:
        print(q.describe())
    return EXIT_OK


def _cmd_quota_limit(args: argparse.Namespace, dsn: str) -> int:
    from pgcounters.quotas import Quotas

    with connect(dsn) as conn:
        limit = Quotas(conn).set_limit(
            args.name, args.subject, args.calls, valid_from=args.valid_from, valid_until=args.until
        )
    span = f"[{iso(limit.valid_from) or '-inf'}, {iso(limit.valid_until) or 'inf'})"
    print(f"limit {limit.id}: {args.name} {limit.subject} {limit.limit} calls per window {span}")
    return EXIT_OK


def _cmd_quota_unlimit(args: argparse.Namespace, dsn: str) -> int:
    from pgcounters.quotas import Quotas

    with connect(dsn) as conn:
        removed = Quotas(conn).remove_limits(args.name, args.subject, args.id)
    print(f"removed {removed} limit(s)")
    return EXIT_OK if removed else EXIT_ERROR


def _cmd_quota_limits(args: argparse.Namespace, dsn: str) -> int:
    from pgcounters.quotas import Quotas

    with connect(dsn) as conn:
        found = Quotas(conn).limits(args.name, args.subject)
    if args.json:
        print_json([
            {"id": x.id, "subject": x.subject, "limit": x.limit,
             "valid_from": iso(x.valid_from), "valid_until": iso(x.valid_until)}
            for x in found
        ])  # fmt: skip
        return EXIT_OK
    for x in found:
        span = f"[{iso(x.valid_from) or '-inf'}, {iso(x.valid_until) or 'inf'})"
        print(f"{x.id}\t{x.subject}\t{x.limit}\t{span}")
    return EXIT_OK


def _cmd_quota_call(args: argparse.Namespace, dsn: str) -> int:
    from pgcounters.quotas import Quotas

    with connect(dsn) as conn:
        r = Quotas(conn).register_call(
            args.name, args.subject, args.cost, at=args.at, details=args.details
        )
    if args.json:
        print_json({
            "allowed": r.allowed, "used": r.used, "attempts": r.attempts, "limit": r.limit,
            "remaining": r.remaining, "window_start": iso(r.window_start),
            "window_end": iso(r.window_end), "retry_after": r.retry_after,
        })  # fmt: skip
    else:
        verdict = "allowed" if r.allowed else "refused"
        print(
            f"{verdict}: used {r.used}/{r.limit}, attempt {r.attempts} in the window "
            f"[{iso(r.window_start)}, {iso(r.window_end)}), resets in {r.retry_after:.0f}s"
        )
    return EXIT_OK if r.allowed else EXIT_REFUSED


def _cmd_quota_status(args: argparse.Namespace, dsn: str) -> int:
    from pgcounters.quotas import Quotas

    with connect(dsn) as conn:
        s = Quotas(conn).status(args.name, args.subject, at=args.at)
    if args.json:
        print_json({
            "used": s.used, "attempts": s.attempts, "rejected": s.rejected, "limit": s.limit,
            "remaining": s.remaining, "window_start": iso(s.window_start),
            "window_end": iso(s.window_end),
        })  # fmt: skip
    else:
        print(
            f"used {s.used}/{s.limit}, {s.attempts} attempts, {s.rejected} refused in the window "
            f"[{iso(s.window_start)}, {iso(s.window_end)})"
        )
    return EXIT_OK


def _cmd_quota_report(args: argparse.Namespace, dsn: str) -> int:
    from pgcounters.quotas import Quotas

    with connect(dsn) as conn:
        quotas = Quotas(conn)
        if args.top is not None:
            top = quotas.top_rejected(args.name, since=args.since, until=args.until, n=args.top)
            if args.json:
                print_json([
                    {"subject": t.subject, "rejected": t.rejected, "attempts": t.attempts,
                     "windows": t.windows}
                    for t in top
                ])  # fmt: skip
            else:
                print("subject\trejected\tattempts\twindows")
                for t in top:
                    print(f"{t.subject}\t{t.rejected}\t{t.attempts}\t{t.windows}")
            return EXIT_OK
        rows = quotas.report(
            args.name,
            subject=args.subject,
            since=args.since,
            until=args.until,
            rejected_only=args.rejected,
            limit=args.limit,
        )
    if args.json:
        print_json([
            {"subject": r.subject, "window_start": iso(r.window_start),
             "window_end": iso(r.window_end), "limit": r.limit, "used": r.used,
             "attempts": r.attempts, "rejected": r.rejected}
            for r in rows
        ])  # fmt: skip
        return EXIT_OK
    print("window_start\tsubject\tlimit\tused\tattempts\trejected")
    for r in rows:
        print(
            f"{iso(r.window_start)}\t{r.subject}\t{r.limit}\t{r.used}\t{r.attempts}\t{r.rejected}"
        )
    return EXIT_OK


def _cmd_quota_purge(args: argparse.Namespace, dsn: str) -> int:
    import datetime as dt

    from pgcounters.quotas import Quotas

    before = args.before
    if args.older_than is not None:
        before = dt.datetime.now(dt.UTC) - args.older_than
    with connect(dsn) as conn:
        result = Quotas(conn).purge(before, args.quota)
    print(
        f"removed {result.windows} window(s) ended by {iso(before)} "
        f"and {result.log_rows} log row(s) older"
    )
    return EXIT_OK


def configure_quotas(sub: Any) -> None:
    """``pgcounters quota VERB``: define quotas and limits, register calls, report, purge."""
    add = verb_group(
        sub,
        "quota",
        "quotas and rate limits (define, limit, call, report, purge, ...)",
        "Quotas and rate limits: calls per subject per window, decided exactly. "
        "Instants are ISO 8601; without an offset they are UTC. "
        "Exit codes: 0 success (call: allowed), 1 error, 2 bad usage, 4 call refused.",
    )

    p = add("define", _cmd_quota_define, "define a quota, or change its default limit and log")
    p.add_argument("name")
    p.add_argument("--limit", type=positive_int, help="default calls per window (none: only "
                   "subjects with a limit of their own may call)")  # fmt: skip
    p.add_argument(
        "--window",
        type=window,
        default="day",
        help="day (default), week, month (calendar, in --time-zone), hour, minute, or a "
        "duration such as 90s, 15m, 2h (fixed, aligned to the Unix epoch); sliding:hour, "
        "sliding:15m... for a sliding window of that length",
    )
    p.add_argument("--time-zone", help="IANA zone of calendar windows (default UTC)")
    p.add_argument("--granularity", type=window,
                   help="width of a sliding window's buckets, such as 1s or 1m (default: a "
                   "sixtieth of the window)")  # fmt: skip
    p.add_argument("--log", action=argparse.BooleanOptionalAction, default=False,
                   help="keep one row per call in the request log")  # fmt: skip

    p = add("drop", _cmd_quota_drop, "forget a quota with its limits, usage and log")
    p.add_argument("name")

    p = add("list", _cmd_quota_list, "list the defined quotas")
    p.add_argument("--json", action="store_true")

    p = add("limit", _cmd_quota_limit, "give a subject its own limit over a time range")
    p.add_argument("name")
    p.add_argument("subject")
    p.add_argument("calls", type=positive_int, help="calls per window")
    p.add_argument("--from", dest="valid_from", type=instant, help="start (default: unbounded)")
    p.add_argument("--until", type=instant, help="end, excluded (default: unbounded)")

    p = add("unlimit", _cmd_quota_unlimit, "remove a subject's limits (or one, by --id)")
    p.add_argument("name")
    p.add_argument("subject")
    p.add_argument("--id", type=non_negative_int)

    p = add("limits", _cmd_quota_limits, "list the limits of a quota (or of one subject)")
    p.add_argument("name")
    p.add_argument("subject", nargs="?")
    p.add_argument("--json", action="store_true")

    p = add("call", _cmd_quota_call, "register one call; exit 0 if allowed, 4 if refused")
    p.add_argument("name")
    p.add_argument("subject")
    p.add_argument("--cost", type=positive_int, default=1)
    p.add_argument("--at", type=instant, help="when the call happens (default: now)")
    p.add_argument("--details", type=json_object, help="a JSON object for the request log")
    p.add_argument("--json", action="store_true")

    p = add("status", _cmd_quota_status, "a subject's usage in the current window, no call made")
    p.add_argument("name")
    p.add_argument("subject")
    p.add_argument("--at", type=instant)
    p.add_argument("--json", action="store_true")

    p = add("report", _cmd_quota_report, "usage per subject and window (or --top refusers)")
    p.add_argument("name")
    p.add_argument("--subject")
    p.add_argument("--since", type=instant, help="windows ending after this instant")
    p.add_argument("--until", type=instant, help="windows starting before this instant")
    p.add_argument("--rejected", action="store_true", help="only windows with refused calls")
    p.add_argument(
        "--top", type=non_negative_int, help="the N subjects with the most refused calls"
    )
    p.add_argument("--limit", type=non_negative_int, default=1000, help="at most this many rows")
    p.add_argument("--json", action="store_true")

    p = add("purge", _cmd_quota_purge, "remove ended windows and old log rows")
    when = p.add_mutually_exclusive_group(required=True)
    when.add_argument("--before", type=instant, help="windows ended by this instant")
    when.add_argument(
        "--older-than", type=duration, help="a duration back from now, such as 30d or 12h"
    )
    p.add_argument("--quota", help="only this quota (default: all)")
