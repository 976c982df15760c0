"""The demo, the benchmarks and the embedded server: ``demo``, ``bench``, ``server``.

The demo and benchmark modules are imported here only, inside the verbs (and the bench's
argument type and help), so that no other command loads them.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from pgcounters.cli.common import verbs
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


def _cmd_server(args: argparse.Namespace, dsn: str) -> int:
    print(f"PGCOUNTERS_DSN='{dsn}'")
    print("serving; press Ctrl-C to stop", flush=True)
    while True:
        time.sleep(3600)


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

    add("server", _cmd_server, "run the embedded PostgreSQL until Ctrl-C and print its DSN")
