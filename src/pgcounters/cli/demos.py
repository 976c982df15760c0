"""The demo, the benchmarks and the embedded server: ``demo``, ``bench``, ``server``.

The demo and benchmark modules are imported here only, inside the verbs (and the bench's
argument type and help), so that no other command loads them.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from pgcounters.cli.common import EXIT_OK, verbs
from pgcounters.cli.types import positive_int


def _scenarios() -> list[str]:
    from pgcounters.demos.bench import SCENARIOS

    return list(SCENARIOS)


def scenario(text: str) -> str:
    """A benchmark scenario's name."""
    names = _scenarios()
    if text not in names:
        raise argparse.ArgumentTypeError(f"unknown scenario {text}; choose from {', '.join(names)}")
    return text


class _ScenarioHelp(argparse.HelpFormatter):
    """``bench --help`` lists the scenarios, read from the bench package only then."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help
        if action.dest == "scenario" and text is not None:
            return f"{text}: {', '.join(_scenarios())}"
        return text


def _cmd_demo(args: argparse.Namespace, dsn: str) -> int:
    from pgcounters.demos import demo

    return demo.main(dsn)


def _cmd_bench(args: argparse.Namespace, dsn: str) -> int:
    from pgcounters.demos import bench

    return bench.main(
        dsn,
        args.scenario,
        repeat=args.repeat,
        quick=args.quick,
        as_json=args.json,
        output=args.output,
        markdown=args.markdown,
    )


def _listen_to_stop_signals(received: list[int]) -> dict[int, Any]:
    """SIGINT and SIGTERM raise KeyboardInterrupt, the signal appended to ``received``; the
    handlers they had. A shell starts a background job with SIGINT ignored, and a Python
    started so keeps it ignored: the handler is set here whatever it was. Nothing outside
    the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return {}

    def stop(signum: int, frame: object) -> None:
        received.append(signum)
        raise KeyboardInterrupt

    return {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}


def _ignore_stop_signals() -> None:
    """While the server stops: a second signal must not leave it half stopped (``pg_ctl
    stop`` is bounded by its own timeout)."""
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)


def _write_dsn_file(path: Path, dsn: str) -> None:
    """``dsn`` and a newline in ``path``, at once: a reader finds no file or the whole DSN."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(dsn + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise


def _remove_dsn_file(path: Path, dsn: str) -> None:
    """Remove ``path`` if it still holds ``dsn`` (not a file another server wrote since)."""
    with contextlib.suppress(OSError):
        if path.read_text() == dsn + "\n":
            path.unlink()


def _serve(dsn: str, dsn_file: Path | None) -> None:
    """Check that ``dsn`` accepts connections, say it (stdout, the DSN file), then wait for
    a signal."""
    from pgcounters.config import connect

    with connect(dsn) as conn:
        conn.execute("SELECT 1")
    try:
        if dsn_file is not None:
            _write_dsn_file(dsn_file, dsn)
        print(f"PGCOUNTERS_DSN='{dsn}'")
        print("serving; Ctrl-C (SIGINT) or SIGTERM stops it", flush=True)
        while True:
            time.sleep(3600)
    finally:
        if dsn_file is not None:
            _remove_dsn_file(dsn_file, dsn)


def _cmd_server(args: argparse.Namespace, dsn: str) -> int:
    from pgcounters.config import data_dir, dsn_from_env
    from pgcounters.embedded import EmbeddedPostgres

    received: list[int] = []
    previous = _listen_to_stop_signals(received)
    dsn_file = None if args.dsn_file is None else Path(args.dsn_file).absolute()
    try:
        if dsn_file is not None:
            dsn_file.unlink(missing_ok=True)  # the DSN of a server killed before it removed it
        external = args.dsn or dsn_from_env()
        if external:
            _serve(external, dsn_file)
        else:
            server = EmbeddedPostgres(data_dir(args.data_dir))
            adopted = server.is_running()  # another's to stop
            try:
                server.start()
                _serve(server.dsn(), dsn_file)
            finally:
                if not adopted:
                    # also when a signal came while it started (before it was known as ours)
                    _ignore_stop_signals()
                    server.stop()
    except KeyboardInterrupt:
        if received[:1] != [signal.SIGTERM]:
            raise  # Ctrl-C, SIGINT: an interruption (exit 130)
        print("stopped", flush=True)
        return EXIT_OK
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return EXIT_OK  # not reached: serving ends by a signal


def _check_server(args: argparse.Namespace) -> str | None:
    if args.dsn_file is not None:
        folder = Path(args.dsn_file).absolute().parent
        if not folder.is_dir():
            return f"--dsn-file {args.dsn_file}: no folder {folder}"
    return None


def configure_demos(sub: Any) -> None:
    """demo, bench, server."""
    add = verbs(sub)
    add("demo", _cmd_demo, "run the seed's hot-counter workload, naive vs pgcounters")
    p = add("bench", _cmd_bench, "measure pgcounters against the seed's techniques, side by side")
    p.formatter_class = _ScenarioHelp
    p.add_argument(
        "scenario",
        nargs="*",
        type=scenario,
        metavar="SCENARIO",
        help="scenarios to run (default: all)",
    )
    p.add_argument("--repeat", type=positive_int, default=3,
                   help="runs of each variant (median reported)")  # fmt: skip
    p.add_argument("--quick", action="store_true", help="smaller workloads, for a smoke run")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--output",
        default="bench-results",
        metavar="DIR",
        help="write results.json, results.md and PNG charts here (default: bench-results)",
    )
    p.add_argument("--markdown", metavar="FILE", help="also write the Markdown report to FILE")

    p = add(
        "server",
        _cmd_server,
        "run the embedded PostgreSQL until Ctrl-C or SIGTERM and print its DSN",
    )
    p.add_argument(
        "--dsn-file",
        metavar="PATH",
        help="also write the DSN to PATH (atomically, once the server accepts connections; "
        "removed when it stops)",
    )
    # the verb opens its database itself: its signals must be its own before the server starts
    p.set_defaults(no_database=True, check=_check_server)
