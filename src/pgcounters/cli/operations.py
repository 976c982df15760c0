"""Running pgcounters: the schema (install, upgrade, version, schema --sql), the drain and
the worker, status, wake-ups, and the flush of the Redis buffer."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

from pgcounters import __version__, schema, sqlfiles
from pgcounters.cli.common import EXIT_ERROR, EXIT_MORE, EXIT_OK, print_json, verbs
from pgcounters.cli.types import (
    batch_size,
    non_negative_int,
    non_negative_seconds,
    port,
    positive_int,
    positive_seconds,
    statement_seconds,
)
from pgcounters.client import MAX_BATCH_SIZE
from pgcounters.config import connect
from pgcounters.notifications import MAX_KEYS

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


def _cmd_schema(args: argparse.Namespace, dsn: str) -> int:
    sys.stdout.write(schema.script(args.from_version))
    return EXIT_OK


def _check_schema(args: argparse.Namespace) -> str | None:
    if not args.sql:
        return "schema prints the schema as SQL: give --sql"
    if args.from_version is not None and args.from_version > sqlfiles.latest_version():
        return (
            f"--from must be a version of this package (1 to {sqlfiles.latest_version()}), "
            f"got {args.from_version}"
        )
    return None


def _cmd_version(args: argparse.Namespace, dsn: str) -> int:
    with connect(dsn) as conn:
        state = schema.state(conn)
    installed = "not installed" if state.installed is None else f"installed {state.installed}"
    print(f"package {__version__}; schema {installed}, expected {state.expected}")
    return EXIT_OK if state.current else EXIT_ERROR


def _cmd_drain(args: argparse.Namespace, dsn: str) -> int:
    from pgcounters.client import Counters
    from pgcounters.worker import GracefulSignals

    signals = GracefulSignals(lambda: None)
    with connect(dsn) as conn, signals:
        pc = Counters(conn)
        result = pc.drain(
            args.batch_size,
            max_batch_size=args.max_batch_size,
            max_batches=args.max_batches,
            time_limit=args.time_limit,
            stop=lambda: signals.received > 0,
            statement_timeout=args.statement_timeout,
        )
        logged, unlogged = pc.pending()
    bounded = args.max_batches is not None or args.time_limit is not None or signals.received > 0
    code = EXIT_MORE if bounded and logged + unlogged else EXIT_OK
    if args.json:
        print_json({
            "deltas": result.deltas, "keys": result.keys, "batches": result.batches,
            "seconds": round(result.seconds, 6), "deltas_per_second": round(result.rate, 1),
            "remaining": {"logged": logged, "unlogged": unlogged},
            "busy": result.busy, "quarantined": result.quarantined,
            "stopped_by_signal": signals.received > 0, "exit_code": code,
        })  # fmt: skip
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


def _cmd_worker(args: argparse.Namespace, dsn: str) -> int:
    from pgcounters.worker import GracefulSignals, Worker, WorkerSettings

    configure_worker_logging(args.log_level)
    settings = WorkerSettings(
        batch_size=args.batch_size,
        max_batch_size=args.max_batch_size,
        batch_seconds=args.batch_seconds,
        min_interval=args.min_interval,
        max_interval=args.max_interval,
        linger=args.linger,
        listen=args.listen,
        statement_timeout=args.statement_timeout,
        idle_in_transaction_timeout=args.idle_timeout,
        reconnect_max=args.reconnect_max,
        log_every=args.log_every,
        notify=args.notify,
        notify_interval=args.notify_interval,
        notify_max_keys=args.notify_max_keys,
        horizon_warning=args.horizon_warning,
    )
    worker = Worker(dsn, settings, on_change=getattr(args, "on_change", None))
    with GracefulSignals(worker.stop):
        worker.run()
    return EXIT_OK


def _cmd_status(args: argparse.Namespace, dsn: str) -> int:
    from pgcounters import status

    if args.serve is not None:
        server = status.make_server(dsn, args.bind or "127.0.0.1", args.serve)
        host, port = server.server_address[:2]
        # SIGTERM (a service manager's stop) ends it cleanly; Ctrl-C is an interruption
        stopped = threading.Event()

        def stop_serving(signum: int, frame: object) -> None:
            stopped.set()
            # shutdown() waits for the loop this handler interrupted: from another thread
            threading.Thread(target=server.shutdown, daemon=True).start()

        previous = signal.signal(signal.SIGTERM, stop_serving)
        print(f"serving /metrics, /status.json and / on http://{host!s}:{port}", flush=True)
        try:
            server.serve_forever()
        finally:
            signal.signal(signal.SIGTERM, previous)
            server.server_close()
        if stopped.is_set():
            print("stopped", flush=True)
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


def _check_status(args: argparse.Namespace) -> str | None:
    if args.bind is not None and args.serve is None:
        return "--bind is the address of --serve: give --serve PORT too"
    return None


def _check_wakeup(args: argparse.Namespace) -> str | None:
    if args.interval is not None and args.state != "on":
        return f"--interval applies to `wakeup on`, not to `wakeup {args.state}`"
    from pgcounters.worker import WAKEUP_MAX, WAKEUP_MIN

    if args.interval is not None and not WAKEUP_MIN <= args.interval <= WAKEUP_MAX:
        return f"--interval must be between 1 ms and 1 hour, got {args.interval:g} seconds"
    return None


def _check_worker(args: argparse.Namespace) -> str | None:
    if args.max_interval < args.min_interval:
        return (
            f"--max-interval ({args.max_interval:g}) is below --min-interval "
            f"({args.min_interval:g})"
        )
    return None


def _cmd_wakeup(args: argparse.Namespace, dsn: str) -> int:
    from pgcounters.worker import disable_wakeups, enable_wakeups, wakeup_interval

    with connect(dsn) as conn:
        if args.state == "on":
            enable_wakeups(conn, 0.1 if args.interval is None else args.interval)
        elif args.state == "off":
            disable_wakeups(conn)
        seconds = wakeup_interval(conn)
    print(
        "wake-ups are off"
        if seconds is None
        else f"wake-ups are on: at most one every {round(seconds * 1000)} ms"
    )
    return EXIT_OK


def _cmd_flush(args: argparse.Namespace, dsn: str) -> int:
    from pgcounters.redis_buffer import RedisBuffer, describe, run_worker

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


def configure_operations(sub: Any) -> None:
    """install, upgrade, version, schema, drain, worker, status, wakeup, flush."""
    add = verbs(sub)
    add("install", _cmd_install, "install the pgcounters schema (idempotent)")
    add("upgrade", _cmd_upgrade, "apply pending schema migrations")
    add("version", _cmd_version, "show package and schema versions (exit 1 if they differ)")
    p = add("schema", _cmd_schema, "print the schema as a plain SQL script (needs no database)")
    p.add_argument(
        "--sql", action="store_true", help="the install script (one transaction, versions recorded)"
    )
    p.add_argument(
        "--from",
        dest="from_version",
        type=positive_int,
        metavar="N",
        help="print the upgrade script from version N instead",
    )
    p.set_defaults(no_database=True, check=_check_schema)

    p = add("drain", _cmd_drain, "apply queued deltas (one transaction per batch)")
    p.add_argument("--batch-size", type=batch_size, default=10_000)
    p.add_argument(
        "--max-batch-size", type=batch_size, default=MAX_BATCH_SIZE, metavar="N",
        help="a queue holding more than a batch is applied in one batch of up to N deltas "
        "(default 500000)",
    )  # fmt: skip
    p.add_argument(
        "--max-batches", type=non_negative_int, metavar="N",
        help="stop after N batches (each of up to --max-batch-size deltas)",
    )  # fmt: skip
    p.add_argument(
        "--time-limit",
        type=non_negative_seconds,
        help="stop starting batches after this many seconds",
    )
    p.add_argument(
        "--statement-timeout",
        type=statement_seconds,
        metavar="S",
        help="abort a batch running longer than S",
    )
    out = p.add_mutually_exclusive_group()
    out.add_argument("--quiet", "-q", action="store_true", help="print nothing unless it fails")
    out.add_argument("--json", action="store_true", help="print one JSON object")

    p = add("worker", _cmd_worker, "drain continuously until SIGTERM (one transaction per batch)")
    p.add_argument("--batch-size", type=batch_size, default=10_000, help="deltas per batch")
    p.add_argument(
        "--max-batch-size", type=batch_size, default=MAX_BATCH_SIZE, metavar="N",
        help="a queue holding more than a batch is applied in one batch of up to N deltas "
        "(default 500000)",
    )  # fmt: skip
    p.add_argument(
        "--batch-seconds", type=non_negative_seconds, default=0.5, metavar="S",
        help="a batch larger than --batch-size is sized to take about S seconds (0: no bound "
        "but --max-batch-size)",
    )  # fmt: skip
    p.add_argument("--min-interval", type=positive_seconds, default=0.05, metavar="S",
                   help="first wait when idle")  # fmt: skip
    p.add_argument("--max-interval", type=positive_seconds, default=2.0, metavar="S",
                   help="longest wait when idle")  # fmt: skip
    p.add_argument("--linger", type=non_negative_seconds, default=0.02, metavar="S",
                   help="wait after a batch not full, to gather more (0: none)")  # fmt: skip
    p.add_argument("--listen", action="store_true", help="also wake on notifications (`wakeup on`)")
    p.add_argument("--statement-timeout", type=statement_seconds, default=60.0, metavar="S")
    p.add_argument(
        "--idle-timeout", type=non_negative_seconds, default=60.0, metavar="S",
        help="idle_in_transaction_session_timeout",
    )  # fmt: skip
    p.add_argument(
        "--reconnect-max", type=positive_seconds, default=30.0, metavar="S",
        help="longest wait between reconnection attempts",
    )  # fmt: skip
    p.add_argument(
        "--log-every", type=non_negative_seconds, default=60.0, metavar="S",
        help="log a summary this often while working (0: never)",
    )  # fmt: skip
    p.add_argument(
        "--notify", action="store_true",
        help="after each batch, NOTIFY pgcounters_changes with the keys it changed",
    )  # fmt: skip
    p.add_argument(
        "--notify-interval", type=non_negative_seconds, default=1.0, metavar="S",
        help="at most one change notification every S seconds (0: one per batch)",
    )  # fmt: skip
    p.add_argument(
        "--notify-max-keys", type=non_negative_int, default=MAX_KEYS, metavar="N",
        help="report at most N changed keys of a counter; above, the counter as 'many keys'",
    )  # fmt: skip
    p.add_argument(
        "--horizon-warning", type=non_negative_seconds, default=60.0, metavar="S",
        help="warn when a snapshot keeps VACUUM from removing row versions this long (0: never)",
    )  # fmt: skip
    p.add_argument("--log-level", choices=LOG_LEVELS, default="info")
    p.set_defaults(check=_check_worker)

    p = add("status", _cmd_status, "queue depth, lag, apply rate, table sizes and bloat")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print one JSON object")
    fmt.add_argument(
        "--prometheus", action="store_true", help="print the Prometheus text exposition"
    )
    fmt.add_argument(
        "--serve", type=port, metavar="PORT",
        help="serve /metrics (Prometheus), /status.json and / over HTTP",
    )  # fmt: skip
    p.add_argument("--bind", help="address for --serve (default 127.0.0.1)")
    p.set_defaults(check=_check_status)

    p = add("wakeup", _cmd_wakeup, "turn worker wake-up notifications on or off")
    p.add_argument("state", nargs="?", choices=["on", "off", "show"], default="show")
    p.add_argument(
        "--interval", type=positive_seconds, metavar="S",
        help="with on: at most one notification per S seconds (default 0.1)",
    )  # fmt: skip
    p.set_defaults(check=_check_wakeup)

    p = add("flush", _cmd_flush, "move increments buffered in Redis to PostgreSQL (exactly once)")
    p.add_argument("--redis-url", help="Redis URL (default: $PGCOUNTERS_REDIS_URL)")
    p.add_argument("--buffer", default="default", help="buffer name (default: default)")
    p.add_argument("--prefix", default="pgcounters", help="Redis key prefix (default: pgcounters)")
    p.add_argument("--worker", action="store_true", help="keep flushing until SIGTERM or Ctrl-C")
    p.add_argument("--interval", type=positive_seconds, default=1.0,
                   help="worker: seconds between flushes (default: 1)")  # fmt: skip
