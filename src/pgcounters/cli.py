"""The ``pgcounters`` command line. One parser, reused by ``manage.py pgcounters``.

Exit codes: 0 success; 1 a pgcounters error (the message says which);
2 bad usage; 3 ``drain`` stopped by its bound with deltas still queued;
4 ``quota call`` refused the call; 5 ``verify`` found drift; 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import psycopg

from pgcounters import __version__, demo, schema
from pgcounters.client import MODES, Counters
from pgcounters.config import connect, database
from pgcounters.connection import Conn
from pgcounters.dberrors import translated
from pgcounters.errors import ConfigurationError, DrainError, InvalidKey, PgCountersError
from pgcounters.keys import KeyType

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_MORE, EXIT_INTERRUPTED = 0, 1, 2, 3, 130

Handler = Callable[[argparse.Namespace, str], int]


def _parse_key(text: str | None, key_types: tuple[KeyType, ...]) -> object:
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


def _cmd_install(args: argparse.Namespace, dsn: str) -> int:
    with connect(dsn) as conn:
        applied = schema.install(conn)
        state = schema.state(conn)
    if applied:
        print(f"installed the pgcounters schema, version {state.installed}")
    elif state.current:
        print(f"the pgcounters schema is already installed (version {state.installed})")
    else:
        print(
            f"the pgcounters schema is installed at version {state.installed}; "
            f"run `pgcounters upgrade` to reach {state.expected}"
        )
    return EXIT_OK


def _cmd_upgrade(args: argparse.Namespace, dsn: str) -> int:
    with connect(dsn) as conn:
        applied = schema.upgrade(conn)
        state = schema.state(conn)
    if applied:
        print(
            f"applied migrations {', '.join(map(str, applied))}; now at version {state.installed}"
        )
    else:
        print(f"already at version {state.installed}")
    return EXIT_OK


def _cmd_version(args: argparse.Namespace, dsn: str) -> int:
    with connect(dsn) as conn:
        state = schema.state(conn)
    print(f"package {__version__}; schema installed {state.installed}, expected {state.expected}")
    return EXIT_OK if state.current else EXIT_ERROR


def _cmd_create(args: argparse.Namespace, dsn: str) -> int:
    with connect(dsn) as conn:
        pc = Counters(conn)
        if args.table:
            counter = pc.create_column_counter(
                args.name, args.table, args.column or args.name, args.key_column, args.mode
            )
        else:
            counter = pc.create_counter(args.name, tuple(args.key or ()), args.mode)
    print(f"counter {counter.name}: key ({', '.join(counter.key_types)}), mode {counter.mode}")
    return EXIT_OK


def _cmd_drop(args: argparse.Namespace, dsn: str) -> int:
    from pgcounters import triggers

    with connect(dsn) as conn:
        # its triggers and recorded declaration go too: nothing keeps counting into it
        uninstalled = triggers.uninstall(conn, args.name, drop_values=True)
        dropped = Counters(conn).drop_counter(args.name) or uninstalled
    print(f"dropped {args.name}" if dropped else f"no counter named {args.name}")
    return EXIT_OK if dropped else EXIT_ERROR


def _cmd_list(args: argparse.Namespace, dsn: str) -> int:
    from pgcounters import backfill

    with connect(dsn) as conn:
        found = Counters(conn).counters()
        filling = {b.name: b.keys_done for b in backfill.pending(conn)}
    if args.json:
        print(json.dumps([
            {"name": c.name, "key": list(c.key_types), "mode": c.mode,
             "table": f"{c.table_schema}.{c.table}" if c.table else None, "column": c.column,
             "backfilling": c.name in filling}
            for c in found
        ]))  # fmt: skip
        return EXIT_OK
    for c in found:
        where = f" -> {c.table_schema}.{c.table}.{c.column}" if c.table else ""
        state = f"  backfilling ({filling[c.name]} keys done)" if c.name in filling else ""
        print(f"{c.name}  key=({', '.join(c.key_types)})  mode={c.mode}{where}{state}")
    return EXIT_OK


def _cmd_backfill(args: argparse.Namespace, dsn: str) -> int:
    from pgcounters import backfill

    if args.batch_size < 1:
        raise ConfigurationError(f"--batch-size must be positive, got {args.batch_size}")
    with connect(dsn) as conn:
        schema.check(conn)
        waiting = [b.name for b in backfill.pending(conn)]
        unknown = [n for n in args.counter if n not in waiting]
        if unknown:
            raise ConfigurationError(f"no backfill is pending for {', '.join(unknown)}")
        if not waiting:
            print("no backfill pending")
            return EXIT_OK
        done = backfill.run(conn, args.counter or None, batch_size=args.batch_size)
    for name, keys in sorted(done.items()):
        print(f"{name}: backfilled, {keys} keys")
    return EXIT_OK


def _cmd_incr(args: argparse.Namespace, dsn: str) -> int:
    with connect(dsn) as conn:
        pc = Counters(conn)
        key = _parse_key(args.key, pc.counter(args.name).key_types)
        value = pc.incr(args.name, key, args.delta)
    if value is not None:
        print(value)
    return EXIT_OK


def _cmd_get(args: argparse.Namespace, dsn: str) -> int:
    with connect(dsn) as conn:
        pc = Counters(conn)
        key = _parse_key(args.key, pc.counter(args.name).key_types)
        print(pc.get(args.name, key, exact=not args.stored))
    return EXIT_OK


def _cmd_top(args: argparse.Namespace, dsn: str) -> int:
    with connect(dsn) as conn:
        rows = Counters(conn).top(args.name, args.n)
    for key, value in rows:
        print(f"{','.join(str(p) for p in key) or '-'}\t{value}")
    return EXIT_OK


def _cmd_drain(args: argparse.Namespace, dsn: str) -> int:
    from pgcounters.worker import GracefulSignals

    if args.batch_size < 1:
        raise ConfigurationError(f"--batch-size must be positive, got {args.batch_size}")
    signals = GracefulSignals(lambda: None)
    with connect(dsn) as conn, signals:
        if args.statement_timeout is not None:
            conn.execute(
                "SELECT set_config('statement_timeout', %s, false)",
                (f"{round(args.statement_timeout * 1000)}ms",),
            )
        pc = Counters(conn)
        try:
            result = pc.drain(
                args.batch_size,
                max_batches=args.max_batches,
                time_limit=args.time_limit,
                stop=lambda: signals.received > 0,
            )
        except psycopg.errors.QueryCanceled as exc:
            raise DrainError(
                "a batch was cancelled by the statement timeout and rolled back (its deltas "
                "stay queued): use a smaller --batch-size or a longer --statement-timeout"
            ) from exc
        logged, unlogged = pc.pending()
    bounded = args.max_batches is not None or args.time_limit is not None or signals.received > 0
    code = EXIT_MORE if bounded and logged + unlogged else EXIT_OK
    if args.json:
        print(json.dumps({
            "deltas": result.deltas, "keys": result.keys, "batches": result.batches,
            "seconds": round(result.seconds, 6), "deltas_per_second": round(result.rate, 1),
            "remaining": {"logged": logged, "unlogged": unlogged},
            "busy": result.busy, "quarantined": result.quarantined,
            "stopped_by_signal": signals.received > 0, "exit_code": code,
        }))  # fmt: skip
    elif not args.quiet:
        print(
            f"applied {result.deltas} deltas to {result.keys} keys in {result.batches} batches, "
            f"{result.seconds:.3f}s ({result.rate:,.0f} deltas/s); "
            f"{logged + unlogged} still queued"
            + (f" ({result.busy} waiting for rows other transactions hold)" if result.busy else "")
            + (
                f"; {result.quarantined} set aside (`pgcounters quarantine list`)"
                if result.quarantined
                else ""
            )
        )
    return code


def _cmd_demo(args: argparse.Namespace, dsn: str) -> int:
    return demo.main(dsn)


def _cmd_bench(args: argparse.Namespace, dsn: str) -> int:
    from pgcounters import bench

    unknown = sorted(set(args.scenario) - set(bench.SCENARIOS))
    if unknown:
        raise ConfigurationError(
            f"unknown scenario {', '.join(unknown)}; choose from {', '.join(bench.SCENARIOS)}"
        )
    return bench.main(
        dsn,
        args.scenario,
        repeat=args.repeat,
        quick=args.quick,
        as_json=args.json,
        output=args.output,
        markdown=args.markdown,
    )


def _cmd_server(args: argparse.Namespace, dsn: str) -> int:
    print(f"PGCOUNTERS_DSN='{dsn}'")
    print("serving; press Ctrl-C to stop", flush=True)
    while True:
        time.sleep(3600)


def _cmd_flush(args: argparse.Namespace, dsn: str) -> int:
    import signal
    import threading

    from pgcounters.redis_buffer import RedisBuffer, describe, run_worker

    if not args.interval > 0:
        raise ConfigurationError(f"--interval must be positive, got {args.interval}")
    with RedisBuffer(dsn, args.redis_url, name=args.buffer, prefix=args.prefix) as buf:
        if not args.worker:
            result = buf.flush()
            keys, inflight = buf.pending()
            print(f"{describe(result)}; {keys} keys pending, {inflight} flushes in flight")
            return EXIT_OK
        stop = threading.Event()

        def request_stop(signum: int, frame: object) -> None:
            stop.set()

        previous = {s: signal.signal(s, request_stop) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            print(
                f"flushing Redis buffer {args.buffer!r} every {args.interval}s; "
                "SIGTERM or Ctrl-C stops after the current flush",
                flush=True,
            )
            total = run_worker(
                buf, stop, interval=args.interval, report=lambda m: print(m, flush=True)
            )
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        print(f"stopped; in all: {describe(total)}", flush=True)
        return EXIT_OK


def _scenario_names() -> list[str]:
    from pgcounters.bench import SCENARIOS

    return list(SCENARIOS)


def build_parser(prog: str = "pgcounters") -> argparse.ArgumentParser:
    """The argument parser of every pgcounters command (also used by the Django command)."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Exact, fast, deadlock-free counters for PostgreSQL.",
        epilog="With no --dsn, PGCOUNTERS_DSN or DATABASE_URL, an embedded PostgreSQL is "
        "started with its data in ./pgcounters-data (or PGCOUNTERS_DATA_DIR).",
    )
    parser.add_argument("--version", action="version", version=f"pgcounters {__version__}")
    parser.add_argument("--dsn", help="PostgreSQL connection string (default: $PGCOUNTERS_DSN)")
    parser.add_argument("--data-dir", help="data directory of the embedded PostgreSQL")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, handler: Handler, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(handler=handler)
        return p

    add("install", _cmd_install, "install the pgcounters schema (idempotent)")
    add("upgrade", _cmd_upgrade, "apply pending schema migrations")
    add("version", _cmd_version, "show package and schema versions (exit 1 if they differ)")

    p = add("create", _cmd_create, "declare a counter")
    p.add_argument("name")
    p.add_argument(
        "--key",
        action="append",
        choices=["bigint", "uuid", "text", "date"],
        help="a key part type; repeat for composite keys; none for a global counter",
    )
    p.add_argument("--mode", choices=MODES, default="queued")
    p.add_argument("--table", help="keep values in a column of this table")
    p.add_argument("--column", help="the counter column (default: the counter name)")
    p.add_argument("--key-column", default="id", help="the column identifying a row (default: id)")

    p = add("drop", _cmd_drop, "forget a counter, its values and pending deltas")
    p.add_argument("name")

    p = add("list", _cmd_list, "list declared counters")
    p.add_argument("--json", action="store_true")

    p = add(
        "backfill",
        _cmd_backfill,
        "count the existing rows into counters added or changed over them, in batches",
    )
    p.add_argument("counter", nargs="*", metavar="COUNTER", help="counters (default: all pending)")
    p.add_argument("--batch-size", type=int, default=1000, help="keys per transaction (1000)")

    p = add("incr", _cmd_incr, "add to a counter")
    p.add_argument("name")
    p.add_argument("key", nargs="?", help="key parts separated by commas; omit for global")
    p.add_argument("--delta", type=int, default=1)

    p = add("get", _cmd_get, "read a counter (exact: stored + pending)")
    p.add_argument("name")
    p.add_argument("key", nargs="?")
    p.add_argument("--stored", action="store_true", help="stored value only")

    p = add("top", _cmd_top, "keys with the highest stored values")
    p.add_argument("name")
    p.add_argument("-n", type=int, default=10)

    p = add("drain", _cmd_drain, "apply queued deltas (one transaction per batch)")
    p.add_argument("--batch-size", type=int, default=10_000)
    p.add_argument("--max-batches", type=int)
    p.add_argument("--time-limit", type=float, help="stop starting batches after this many seconds")
    p.add_argument(
        "--statement-timeout", type=float, metavar="S", help="abort a batch running longer than S"
    )
    out = p.add_mutually_exclusive_group()
    out.add_argument("--quiet", "-q", action="store_true", help="print nothing unless it fails")
    out.add_argument("--json", action="store_true", help="print one JSON object")

    add("demo", _cmd_demo, "run the seed's hot-counter workload, naive vs pgcounters")
    p = add("bench", _cmd_bench, "measure pgcounters against the seed's techniques, side by side")
    p.add_argument(
        "scenario",
        nargs="*",
        metavar="SCENARIO",
        help="scenarios to run (default: all): " + ", ".join(_scenario_names()),
    )
    p.add_argument("--repeat", type=int, default=3, help="runs of each variant (median reported)")
    p.add_argument("--quick", action="store_true", help="smaller workloads, for a smoke run")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--output",
        default="bench-results",
        metavar="DIR",
        help="write results.json, results.md and PNG charts here (default: bench-results)",
    )
    p.add_argument("--markdown", metavar="FILE", help="also write the Markdown report to FILE")

    add("server", _cmd_server, "run the embedded PostgreSQL until Ctrl-C and print its DSN")

    p = add("flush", _cmd_flush, "move increments buffered in Redis to PostgreSQL (exactly once)")
    p.add_argument("--redis-url", help="Redis URL (default: $PGCOUNTERS_REDIS_URL)")
    p.add_argument("--buffer", default="default", help="buffer name (default: default)")
    p.add_argument("--prefix", default="pgcounters", help="Redis key prefix (default: pgcounters)")
    p.add_argument("--worker", action="store_true", help="keep flushing until SIGTERM or Ctrl-C")
    p.add_argument(
        "--interval", type=float, default=1.0, help="worker: seconds between flushes (default: 1)"
    )

    _add_quota_commands(sub)
    _add_quarantine_commands(sub)
    _add_operations(add)
    _add_repair(add)
    _add_security(add)
    return parser


def run(argv: Sequence[str] | None = None, *, prog: str = "pgcounters") -> int:
    args = build_parser(prog).parse_args(argv)
    handler: Handler = args.handler
    try:
        with database(
            args.dsn, args.data_dir, quiet=args.command not in ("demo", "server", "bench")
        ) as dsn:
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


def main() -> Any:
    try:
        code = run()
        sys.stdout.flush()
    except BrokenPipeError:
        # the reader went away (`pgcounters status | head`): stop quietly, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = EXIT_ERROR
    sys.exit(code)


# -- quotas -------------------------------------------------------------------

EXIT_REFUSED = 4


def _instant(text: str) -> Any:
    """An ISO 8601 instant; without an offset it is taken as UTC."""
    import datetime as dt

    try:
        value = dt.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 date or time: {text!r}") from None
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)


def _details(text: str) -> Any:
    try:
        value = json.loads(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not JSON: {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("details must be a JSON object")
    return value


def _iso(value: Any) -> str | None:
    return None if value is None else str(value.isoformat())


def _cmd_quota_define(args: argparse.Namespace, dsn: str) -> int:
    from pgcounters.quotas import Quotas

    with connect(dsn) as conn:
        quota = Quotas(conn).define_quota(
            args.name, args.limit, window=args.window, time_zone=args.time_zone, log=args.log
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
        print(json.dumps([
            {"name": q.name, "window": q.window, "time_zone": q.time_zone,
             "default_limit": q.default_limit, "log": q.log_calls}
            for q in found
        ]))  # fmt: skip
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
    span = f"[{_iso(limit.valid_from) or '-inf'}, {_iso(limit.valid_until) or 'inf'})"
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
        print(json.dumps([
            {"id": x.id, "subject": x.subject, "limit": x.limit,
             "valid_from": _iso(x.valid_from), "valid_until": _iso(x.valid_until)}
            for x in found
        ]))  # fmt: skip
        return EXIT_OK
    for x in found:
        span = f"[{_iso(x.valid_from) or '-inf'}, {_iso(x.valid_until) or 'inf'})"
        print(f"{x.id}\t{x.subject}\t{x.limit}\t{span}")
    return EXIT_OK


def _cmd_quota_call(args: argparse.Namespace, dsn: str) -> int:
    from pgcounters.quotas import Quotas

    with connect(dsn) as conn:
        r = Quotas(conn).register_call(
            args.name, args.subject, args.cost, at=args.at, details=args.details
        )
    if args.json:
        print(json.dumps({
            "allowed": r.allowed, "used": r.used, "attempts": r.attempts, "limit": r.limit,
            "remaining": r.remaining, "window_start": _iso(r.window_start),
            "window_end": _iso(r.window_end), "retry_after": r.retry_after,
        }))  # fmt: skip
    else:
        verdict = "allowed" if r.allowed else "refused"
        print(
            f"{verdict}: used {r.used}/{r.limit}, attempt {r.attempts} in the window "
            f"[{_iso(r.window_start)}, {_iso(r.window_end)}), resets in {r.retry_after:.0f}s"
        )
    return EXIT_OK if r.allowed else EXIT_REFUSED


def _cmd_quota_status(args: argparse.Namespace, dsn: str) -> int:
    from pgcounters.quotas import Quotas

    with connect(dsn) as conn:
        s = Quotas(conn).status(args.name, args.subject, at=args.at)
    if args.json:
        print(json.dumps({
            "used": s.used, "attempts": s.attempts, "rejected": s.rejected, "limit": s.limit,
            "remaining": s.remaining, "window_start": _iso(s.window_start),
            "window_end": _iso(s.window_end),
        }))  # fmt: skip
    else:
        print(
            f"used {s.used}/{s.limit}, {s.attempts} attempts, {s.rejected} refused in the window "
            f"[{_iso(s.window_start)}, {_iso(s.window_end)})"
        )
    return EXIT_OK


def _cmd_quota_report(args: argparse.Namespace, dsn: str) -> int:
    from pgcounters.quotas import Quotas

    with connect(dsn) as conn:
        quotas = Quotas(conn)
        if args.top is not None:
            top = quotas.top_rejected(args.name, since=args.since, until=args.until, n=args.top)
            if args.json:
                print(json.dumps([
                    {"subject": t.subject, "rejected": t.rejected, "attempts": t.attempts,
                     "windows": t.windows}
                    for t in top
                ]))  # fmt: skip
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
        print(json.dumps([
            {"subject": r.subject, "window_start": _iso(r.window_start),
             "window_end": _iso(r.window_end), "limit": r.limit, "used": r.used,
             "attempts": r.attempts, "rejected": r.rejected}
            for r in rows
        ]))  # fmt: skip
        return EXIT_OK
    print("window_start\tsubject\tlimit\tused\tattempts\trejected")
    for r in rows:
        print(
            f"{_iso(r.window_start)}\t{r.subject}\t{r.limit}\t{r.used}\t{r.attempts}\t{r.rejected}"
        )
    return EXIT_OK


def _cmd_quota_purge(args: argparse.Namespace, dsn: str) -> int:
    import datetime as dt

    from pgcounters.quotas import Quotas, parse_window

    before = args.before
    if args.older_than is not None:
        _period, seconds = parse_window(args.older_than)
        if seconds is None:
            raise ConfigurationError(
                f"--older-than takes a duration such as 30d or 12h, got {args.older_than!r}"
            )
        before = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=seconds)
    with connect(dsn) as conn:
        result = Quotas(conn).purge(before, args.quota)
    print(
        f"removed {result.windows} window(s) ended by {_iso(before)} "
        f"and {result.log_rows} log row(s) older"
    )
    return EXIT_OK


def _verb_group(
    sub: Any, command: str, help_text: str, description: str
) -> Callable[[str, Handler, str], argparse.ArgumentParser]:
    """``pgcounters COMMAND VERB``: the group's parser; returns the function adding a verb."""
    group = sub.add_parser(command, help=help_text, description=description)
    verbs = group.add_subparsers(dest=f"{command}_command", required=True, metavar="VERB")

    def add(name: str, handler: Handler, verb_help: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = verbs.add_parser(name, help=verb_help, description=verb_help)
        p.set_defaults(handler=handler)
        return p

    return add


def _add_quota_commands(sub: Any) -> None:
    """``pgcounters quota VERB``: define quotas and limits, register calls, report, purge."""
    add = _verb_group(
        sub,
        "quota",
        "quotas and rate limits (define, limit, call, report, purge, ...)",
        "Quotas and rate limits: calls per subject per window, decided exactly. "
        "Instants are ISO 8601; without an offset they are UTC. "
        "Exit codes: 0 success (call: allowed), 1 error, 2 bad usage, 4 call refused.",
    )

    p = add("define", _cmd_quota_define, "define a quota, or change its default limit and log")
    p.add_argument("name")
    p.add_argument("--limit", type=int, help="default calls per window (none: only subjects "
                   "with a limit of their own may call)")  # fmt: skip
    p.add_argument(
        "--window",
        default="day",
        help="day (default), week, month (calendar, in --time-zone), hour, minute, or a "
        "duration such as 90s, 15m, 2h (fixed, aligned to the Unix epoch)",
    )
    p.add_argument("--time-zone", help="IANA zone of calendar windows (default UTC)")
    p.add_argument("--log", action=argparse.BooleanOptionalAction, default=False,
                   help="keep one row per call in the request log")  # fmt: skip

    p = add("drop", _cmd_quota_drop, "forget a quota with its limits, usage and log")
    p.add_argument("name")

    p = add("list", _cmd_quota_list, "list the defined quotas")
    p.add_argument("--json", action="store_true")

    p = add("limit", _cmd_quota_limit, "give a subject its own limit over a time range")
    p.add_argument("name")
    p.add_argument("subject")
    p.add_argument("calls", type=int, help="calls per window")
    p.add_argument("--from", dest="valid_from", type=_instant, help="start (default: unbounded)")
    p.add_argument("--until", type=_instant, help="end, excluded (default: unbounded)")

    p = add("unlimit", _cmd_quota_unlimit, "remove a subject's limits (or one, by --id)")
    p.add_argument("name")
    p.add_argument("subject")
    p.add_argument("--id", type=int)

    p = add("limits", _cmd_quota_limits, "list the limits of a quota (or of one subject)")
    p.add_argument("name")
    p.add_argument("subject", nargs="?")
    p.add_argument("--json", action="store_true")

    p = add("call", _cmd_quota_call, "register one call; exit 0 if allowed, 4 if refused")
    p.add_argument("name")
    p.add_argument("subject")
    p.add_argument("--cost", type=int, default=1)
    p.add_argument("--at", type=_instant, help="when the call happens (default: now)")
    p.add_argument("--details", type=_details, help="a JSON object for the request log")
    p.add_argument("--json", action="store_true")

    p = add("status", _cmd_quota_status, "a subject's usage in the current window, no call made")
    p.add_argument("name")
    p.add_argument("subject")
    p.add_argument("--at", type=_instant)
    p.add_argument("--json", action="store_true")

    p = add("report", _cmd_quota_report, "usage per subject and window (or --top refusers)")
    p.add_argument("name")
    p.add_argument("--subject")
    p.add_argument("--since", type=_instant, help="windows ending after this instant")
    p.add_argument("--until", type=_instant, help="windows starting before this instant")
    p.add_argument("--rejected", action="store_true", help="only windows with refused calls")
    p.add_argument("--top", type=int, help="the N subjects with the most refused calls")
    p.add_argument("--limit", type=int, default=1000, help="at most this many rows")
    p.add_argument("--json", action="store_true")

    p = add("purge", _cmd_quota_purge, "remove ended windows and old log rows")
    when = p.add_mutually_exclusive_group(required=True)
    when.add_argument("--before", type=_instant, help="windows ended by this instant")
    when.add_argument("--older-than", help="a duration back from now, such as 30d or 12h")
    p.add_argument("--quota", help="only this quota (default: all)")


# -- operations: worker, status, wake-ups ------------------------------------------

LOG_LEVELS = ("debug", "info", "warning", "error")


def configure_worker_logging(level: str) -> None:
    """Log to stderr at ``level``, unless the program already configured the ``pgcounters``
    logger (Django's LOGGING, for ``manage.py pgcounters worker``): a handler added to the
    root logger as well would print each line twice."""
    import logging

    if logging.getLogger("pgcounters").handlers:
        return
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def _cmd_worker(args: argparse.Namespace, dsn: str) -> int:
    from pgcounters.worker import GracefulSignals, Worker, WorkerSettings

    configure_worker_logging(args.log_level)
    settings = WorkerSettings(
        batch_size=args.batch_size,
        min_interval=args.min_interval,
        max_interval=args.max_interval,
        linger=args.linger,
        listen=args.listen,
        statement_timeout=args.statement_timeout,
        idle_in_transaction_timeout=args.idle_timeout,
        reconnect_max=args.reconnect_max,
        log_every=args.log_every,
    )
    worker = Worker(dsn, settings)
    with GracefulSignals(worker.stop):
        worker.run()
    return EXIT_OK


def _cmd_status(args: argparse.Namespace, dsn: str) -> int:
    from pgcounters import status

    if args.serve is not None:
        server = status.make_server(dsn, args.bind, args.serve)
        host, port = server.server_address[:2]
        print(f"serving /metrics, /status.json and / on http://{host!s}:{port}", flush=True)
        try:
            server.serve_forever()
        finally:
            server.server_close()
        return EXIT_OK
    with connect(dsn) as conn:
        snapshot = status.get_status(conn)
    if args.prometheus:
        sys.stdout.write(status.prometheus(snapshot))
    elif args.json:
        print(status.to_json(snapshot))
    else:
        print(status.text(snapshot))
    return EXIT_OK


def _cmd_wakeup(args: argparse.Namespace, dsn: str) -> int:
    from pgcounters.sqlfiles import named

    ops = named("operations.sql")
    with connect(dsn) as conn:
        schema.check(conn)
        if args.state == "on":
            if not args.interval > 0:
                raise ConfigurationError(f"--interval must be positive, got {args.interval}")
            with translated():
                conn.execute(ops["enable_wakeups"], {"seconds": args.interval})
        elif args.state == "off":
            conn.execute(ops["disable_wakeups"])
        row = conn.execute(ops["wakeup_interval"]).fetchone()
    ms = row[0] if row else None
    print("wake-ups are off" if ms is None else f"wake-ups are on: at most one every {ms} ms")
    return EXIT_OK


def _add_operations(add: Callable[[str, Handler, str], argparse.ArgumentParser]) -> None:
    p = add("worker", _cmd_worker, "drain continuously until SIGTERM (one transaction per batch)")
    p.add_argument("--batch-size", type=int, default=10_000, help="deltas per batch")
    p.add_argument(
        "--min-interval", type=float, default=0.05, metavar="S", help="first wait when idle"
    )
    p.add_argument(
        "--max-interval", type=float, default=2.0, metavar="S", help="longest wait when idle"
    )
    p.add_argument(
        "--linger", type=float, default=0.02, metavar="S",
        help="wait after a batch that was not full, to gather more deltas (0: none)",
    )  # fmt: skip
    p.add_argument("--listen", action="store_true", help="also wake on notifications (`wakeup on`)")
    p.add_argument("--statement-timeout", type=float, default=60.0, metavar="S")
    p.add_argument(
        "--idle-timeout", type=float, default=60.0, metavar="S",
        help="idle_in_transaction_session_timeout",
    )  # fmt: skip
    p.add_argument(
        "--reconnect-max", type=float, default=30.0, metavar="S",
        help="longest wait between reconnection attempts",
    )  # fmt: skip
    p.add_argument(
        "--log-every", type=float, default=60.0, metavar="S",
        help="log a summary this often while working (0: never)",
    )  # fmt: skip
    p.add_argument("--log-level", choices=LOG_LEVELS, default="info")

    p = add("status", _cmd_status, "queue depth, lag, apply rate, table sizes and bloat")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print one JSON object")
    fmt.add_argument(
        "--prometheus", action="store_true", help="print the Prometheus text exposition"
    )
    fmt.add_argument(
        "--serve", type=int, metavar="PORT",
        help="serve /metrics (Prometheus), /status.json and / over HTTP",
    )  # fmt: skip
    p.add_argument("--bind", default="127.0.0.1", help="address for --serve (default 127.0.0.1)")

    p = add("wakeup", _cmd_wakeup, "turn worker wake-up notifications on or off")
    p.add_argument("state", nargs="?", choices=["on", "off", "show"], default="show")
    p.add_argument(
        "--interval", type=float, default=0.1, metavar="S",
        help="at most one notification per S seconds (default 0.1)",
    )  # fmt: skip


# -- verify and recount ------------------------------------------------------------

if TYPE_CHECKING:
    from tqdm import tqdm

    from pgcounters.recount import VerifyResult
    from pgcounters.specs import CounterSpec

EXIT_DRIFT = 5


def _chosen_specs(conn: Conn, names: Sequence[str]) -> list[CounterSpec]:
    """The declared counters named (default: all), in the order given, each once."""
    from pgcounters import triggers
    from pgcounters.errors import UnknownCounter

    schema.check(conn)
    declared = {spec.name: spec for spec in triggers.declared(conn)}
    if not names:
        return [declared[name] for name in sorted(declared)]
    unknown = [n for n in names if n not in declared]
    if unknown:
        raise UnknownCounter(
            f"no declared counter named {', '.join(unknown)} is recorded in this database"
            + (f" (declared: {', '.join(sorted(declared))})" if declared else "")
        )
    return [declared[name] for name in dict.fromkeys(names)]


def _key_json(key: Sequence[object]) -> list[object]:
    return [p if isinstance(p, int) else str(p) for p in key]


def _cmd_verify(args: argparse.Namespace, dsn: str) -> int:
    from pgcounters.recount import verify

    if args.sample is not None and args.sample < 1:
        raise ConfigurationError(f"--sample must be a positive number of keys, got {args.sample}")
    if args.show < 0:
        raise ConfigurationError(f"--show must be zero or more, got {args.show}")
    from pgcounters import backfill

    with connect(dsn) as conn:
        specs = _chosen_specs(conn, args.counter)
        # a counter being backfilled is not wrong, it is not ready: said, not verified
        filling = {b.name: b.keys_done for b in backfill.pending(conn)}
        results = [
            verify(conn, spec, sample=args.sample) for spec in specs if spec.name not in filling
        ]
        waiting = [(s.name, filling[s.name]) for s in specs if s.name in filling]
    return report_verify(
        results, show=args.show, as_json=args.json, sample=args.sample, waiting=waiting
    )


def report_verify(
    results: Sequence[VerifyResult],
    *,
    show: int,
    as_json: bool,
    sample: int | None = None,
    truth: str | None = None,
    waiting: Sequence[tuple[str, int]] = (),
) -> int:
    """Print verify's report (text or one JSON object) and return its exit code.

    ``truth``: a name for a truth other than the spec's compiled count, printed with the
    report (``manage.py pgcounters verify --truth orm``). ``waiting``: counters being
    backfilled (name, keys done), reported rather than verified.
    """
    drifted = [r for r in results if not r.ok]
    code = EXIT_DRIFT if drifted else EXIT_OK
    if as_json:
        print(json.dumps({
            "counters": [
                {"name": r.name, "keys_checked": r.keys_checked, "keys_off": len(r.mismatches),
                 "differences": [
                     {"key": _key_json(m.key), "expected": m.expected, "actual": m.actual,
                      "difference": m.actual - m.expected}
                     for m in r.mismatches[: show]]}
                for r in results
            ],
            "backfilling": [name for name, _ in waiting],
            "sampled": sample, "drift": bool(drifted), "exit_code": code,
            **({"truth": truth} if truth else {}),
        }))  # fmt: skip
        return code
    for name, done in waiting:
        print(f"{name}: backfilling ({done} keys done), verified when the backfill ends")
    if not results and not waiting:
        print("no declared counters are recorded in this database")
        return code
    if truth:
        print(f"truth: {truth}")
    for r in results:
        print(f"{r.name}: {r.keys_checked} keys checked, {len(r.mismatches)} off")
        for m in r.mismatches[:show]:
            key = ",".join(str(p) for p in m.key) or "-"
            print(
                f"  key {key}: stored + pending {m.actual}, truth {m.expected} "
                f"({m.actual - m.expected:+d})"
            )
        if len(r.mismatches) > show:
            print(f"  ... and {len(r.mismatches) - show} more")
    what = f"{len(results)} counters" + (f" (samples of {sample} keys)" if sample else "")
    if drifted:
        print(f"drift found in {len(drifted)} of {what}: run `pgcounters recount` to repair")
    else:
        print(f"all exact: {what}")
    return code


def _range_bound(spec: CounterSpec, text: str | None) -> str | None:
    """A --key-from/--key-to value checked against the counter's first key part."""
    from pgcounters.keys import encode_key

    if text is None:
        return None
    key_type = spec.key_types[0]
    return encode_key(_parse_key(text, (key_type,)), (key_type,), spec.name)[0]


class _ProgressBar:
    """A tqdm bar on stderr for one counter, made when the number of keys is known."""

    def __init__(self, name: str, show: bool) -> None:
        self.name, self.show = name, show
        self.bar: tqdm[NoReturn] | None = None

    def start(self, total: int) -> None:
        import os
        import shutil

        from tqdm import tqdm

        # the size of stderr's terminal; one that reports 0x0 gets shutil's (stdout's, or
        # 80x24): with 0 columns tqdm would draw nothing at all
        try:
            columns, lines = os.get_terminal_size(sys.stderr.fileno())
        except (OSError, ValueError):
            columns = lines = 0
        if columns <= 0 or lines <= 0:
            columns, lines = shutil.get_terminal_size()
        self.bar = tqdm(total=total, desc=self.name, unit=" keys", file=sys.stderr,
                        disable=not self.show, ncols=columns, nrows=lines,
                        leave=True)  # fmt: skip

    def update(self, n: int) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _cmd_recount(args: argparse.Namespace, dsn: str) -> int:
    from pgcounters.recount import recount

    if args.batch_size < 1:
        raise ConfigurationError(f"--batch-size must be positive, got {args.batch_size}")
    ranged = args.key_from is not None or args.key_to is not None
    show = not args.no_progress and sys.stderr.isatty()
    with connect(dsn) as conn:
        specs = _chosen_specs(conn, args.counter)
        if ranged:
            global_ = [spec.name for spec in specs if not spec.key_types]
            if global_ and args.counter:
                raise ConfigurationError(
                    f"{', '.join(global_)} has no key: --key-from/--key-to do not apply"
                )
            specs = [spec for spec in specs if spec.key_types]
        bounds = [(_range_bound(s, args.key_from), _range_bound(s, args.key_to)) for s in specs]
        if not specs:
            print("no declared counters to recount")
            return EXIT_OK
        for spec, (low, high) in zip(specs, bounds, strict=True):
            bar = _ProgressBar(spec.name, show)
            try:
                result = recount(
                    conn,
                    spec,
                    batch_size=args.batch_size,
                    resume=args.resume,
                    key_range=(low, high) if ranged else None,
                    progress=bar.update,
                    planned=bar.start,
                )
            except KeyboardInterrupt:
                print(
                    f"{spec.name}: interrupted; its committed batches stay done, "
                    "run the same recount again to resume",
                    file=sys.stderr,
                )
                raise
            finally:
                bar.close()
            span = ""
            if ranged:
                span = f" in [{low if low is not None else '...'}, "
                span += f"{high if high is not None else '...'}]"
            print(
                f"{result.name}: {result.keys_done} keys{span} in {result.batches} batches, "
                f"{result.keys_fixed} fixed" + (" (resumed)" if result.resumed else ""),
                flush=True,
            )
    return EXIT_OK


def _add_repair(add: Callable[[str, Handler, str], argparse.ArgumentParser]) -> None:
    p = add(
        "verify",
        _cmd_verify,
        "compare declared counters with the truth (exit 0 exact, 5 drift found)",
    )
    p.add_argument("counter", nargs="*", metavar="COUNTER", help="declared counters (default: all)")
    p.add_argument("--sample", type=int, metavar="N", help="check N random keys of each counter")
    p.add_argument("--show", type=int, default=5, metavar="N",
                   help="differences shown per counter (default 5)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print one JSON object")

    p = add(
        "recount",
        _cmd_recount,
        "set declared counters to the truth, in batches, while writes and drains go on",
    )
    p.add_argument("counter", nargs="*", metavar="COUNTER", help="declared counters (default: all)")
    p.add_argument("--batch-size", type=int, default=1000, help="keys per transaction (1000)")
    p.add_argument("--key-from", metavar="K", help="first key (of the first key part) to recount")
    p.add_argument("--key-to", metavar="K", help="last key (included) to recount")
    again = p.add_mutually_exclusive_group()
    again.add_argument("--resume", dest="resume", action="store_true", default=True,
                       help="continue an interrupted recount of a counter (default)")  # fmt: skip
    again.add_argument("--restart", dest="resume", action="store_false",
                       help="start over, ignoring an interrupted recount")  # fmt: skip
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (none either when stderr is not a terminal)")  # fmt: skip


# -- least privilege ----------------------------------------------------------


def _cmd_grant(args: argparse.Namespace, dsn: str) -> int:
    from pgcounters import security

    if not (args.app or args.worker or args.pause or args.revoke):
        raise ConfigurationError(
            "name at least one role: --app ROLE, --worker ROLE, --pause ROLE or --revoke ROLE"
        )
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


def _add_security(add: Callable[[str, Handler, str], argparse.ArgumentParser]) -> None:
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


# -- the quarantine ------------------------------------------------------------------


def _cmd_quarantine_list(args: argparse.Namespace, dsn: str) -> int:
    from pgcounters.quarantine import list_quarantined

    with connect(dsn) as conn:
        found = list_quarantined(conn, args.counter, args.limit)
    if args.json:
        print(json.dumps([
            {"id": d.id, "counter": d.counter, "key": d.key, "delta": d.delta,
             "queue": "unlogged" if d.unlogged else "logged",
             "created_at": d.created_at.isoformat(),
             "quarantined_at": d.quarantined_at.isoformat(),
             "sqlstate": d.sqlstate, "error": d.error}
            for d in found
        ], indent=2))  # fmt: skip
        return EXIT_OK
    if not found:
        print("no deltas are set aside")
        return EXIT_OK
    for d in found:
        print(
            f"{d.id}  {d.counter}  key {d.key}  delta {d.delta}  "
            f"({'unlogged' if d.unlogged else 'logged'} queue, set aside "
            f"{d.quarantined_at:%Y-%m-%d %H:%M:%S})  [{d.sqlstate}] {d.error}"
        )
    return EXIT_OK


def _quarantine_choice(args: argparse.Namespace) -> dict[str, Any]:
    return {"ids": args.id or None, "counter": args.counter, "everything": args.all}


def _cmd_quarantine_replay(args: argparse.Namespace, dsn: str) -> int:
    from pgcounters.quarantine import replay

    with connect(dsn) as conn:
        n = replay(conn, **_quarantine_choice(args))
    print(f"{n} deltas moved back into their queues")
    return EXIT_OK if n else EXIT_ERROR


def _cmd_quarantine_discard(args: argparse.Namespace, dsn: str) -> int:
    from pgcounters.quarantine import discard

    with connect(dsn) as conn:
        n = discard(conn, **_quarantine_choice(args))
    print(f"{n} deltas discarded")
    return EXIT_OK if n else EXIT_ERROR


def _add_quarantine_commands(sub: Any) -> None:
    """``pgcounters quarantine VERB``: deltas the drain could not apply."""
    add = _verb_group(
        sub,
        "quarantine",
        "deltas the drain could not apply: list, replay, discard",
        "Deltas the drain could not apply (overflow, a key that does not cast, "
        "a dropped counter) are set aside with their error; the rest keeps draining. "
        "Exit codes: 0 success, 1 error or nothing matched, 2 bad usage.",
    )

    p = add("list", _cmd_quarantine_list, "list the deltas set aside, oldest first")
    p.add_argument("--counter", help="only this counter's")
    p.add_argument("--limit", type=int, default=1000, help="at most this many (default 1000)")
    p.add_argument("--json", action="store_true", help="print one JSON array")
    for name, handler, text in (
        ("replay", _cmd_quarantine_replay,
         "move deltas back into their queues (after fixing the cause)"),
        ("discard", _cmd_quarantine_discard, "delete deltas for good"),
    ):  # fmt: skip
        p = add(name, handler, text)
        choice = p.add_mutually_exclusive_group(required=True)
        choice.add_argument("--id", type=int, action="append", help="this delta (repeatable)")
        choice.add_argument(
            "--counter",
            help="every delta of this counter (a counter re-created under the name gets them)",
        )
        choice.add_argument("--all", action="store_true", help="every delta set aside")
