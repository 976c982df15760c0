"""The ``pgcounters`` command line. One parser, reused by ``manage.py pgcounters``.

Exit codes: 0 success; 1 a pgcounters error (the message says which);
2 bad usage; 3 ``drain`` stopped by its bound with deltas still queued;
130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import psycopg

from pgcounters import __version__, demo, schema
from pgcounters.client import MODES, Counters
from pgcounters.config import connect, database
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
    with connect(dsn) as conn:
        dropped = Counters(conn).drop_counter(args.name)
    print(f"dropped {args.name}" if dropped else f"no counter named {args.name}")
    return EXIT_OK if dropped else EXIT_ERROR


def _cmd_list(args: argparse.Namespace, dsn: str) -> int:
    with connect(dsn) as conn:
        found = Counters(conn).counters()
    if args.json:
        print(json.dumps([
            {"name": c.name, "key": list(c.key_types), "mode": c.mode,
             "table": f"{c.table_schema}.{c.table}" if c.table else None, "column": c.column}
            for c in found
        ]))  # fmt: skip
        return EXIT_OK
    for c in found:
        where = f" -> {c.table_schema}.{c.table}.{c.column}" if c.table else ""
        print(f"{c.name}  key=({', '.join(c.key_types)})  mode={c.mode}{where}")
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
            "stopped_by_signal": signals.received > 0, "exit_code": code,
        }))  # fmt: skip
    elif not args.quiet:
        print(
            f"applied {result.deltas} deltas to {result.keys} keys in {result.batches} batches, "
            f"{result.seconds:.3f}s ({result.rate:,.0f} deltas/s); "
            f"{logged + unlogged} still queued"
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
    return bench.main(dsn, args.scenario, repeat=args.repeat, quick=args.quick, as_json=args.json)


def _cmd_server(args: argparse.Namespace, dsn: str) -> int:
    print(f"PGCOUNTERS_DSN='{dsn}'")
    print("serving; press Ctrl-C to stop", flush=True)
    while True:
        time.sleep(3600)


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
    p.add_argument("--table", help="keep values in a column of this table (S2)")
    p.add_argument("--column", help="the counter column (default: the counter name)")
    p.add_argument("--key-column", default="id", help="the column identifying a row (default: id)")

    p = add("drop", _cmd_drop, "forget a counter, its values and pending deltas")
    p.add_argument("name")

    p = add("list", _cmd_list, "list declared counters")
    p.add_argument("--json", action="store_true")

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

    add("server", _cmd_server, "run the embedded PostgreSQL until Ctrl-C and print its DSN")
    _add_operations(add)
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
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def main() -> Any:
    sys.exit(run())


# -- operations: worker, status, wake-ups ------------------------------------------

LOG_LEVELS = ("debug", "info", "warning", "error")


def _cmd_worker(args: argparse.Namespace, dsn: str) -> int:
    import logging

    from pgcounters.worker import GracefulSignals, Worker, WorkerSettings

    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    settings = WorkerSettings(
        batch_size=args.batch_size,
        min_interval=args.min_interval,
        max_interval=args.max_interval,
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
