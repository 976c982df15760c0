"""``pgcounters bench``: the reference techniques and pgcounters measured side by side, in one run.

Each scenario runs every variant ``--repeat`` times, interleaved (variant A, B,
C, then A, B, C again) so that drift of a shared machine hits all alike, and
reports the median, the spread (min-max) and ratios. Absolute times on a shared
machine are noise; the ratios are the result.

A scenario lives in its own module of this package and is registered in
:data:`SCENARIOS` below.
"""

from __future__ import annotations

import json
import platform
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from pgcounters.demos.bench import (
    asyncapi,
    backlog,
    blog,
    changes,
    columns,
    drain,
    drain_keys,
    horizon,
    hot,
    live,
    paths,
    quota,
    ranges,
    sqlincr,
    width,
    worker_cost,
)
from pgcounters.demos.bench.report import LISTENERS, Measurement, Runner, Scenario

__all__ = ["SCENARIOS", "Measurement", "Scenario", "main"]


def _redis_buffer(dsn: str, repeat: int, quick: bool) -> Scenario:
    # imported on use: it needs the redis extra
    from pgcounters.demos.bench.buffers import redis_buffer

    return redis_buffer(dsn, repeat, quick)


def _redis_cluster(dsn: str, repeat: int, quick: bool) -> Scenario:
    # imported on use: it needs the redis extra
    from pgcounters.demos.bench.cluster import redis_cluster

    return redis_cluster(dsn, repeat, quick)


def _sharded(dsn: str, repeat: int, quick: bool) -> Scenario:
    # imported on use: it needs PL/Proxy and PostgreSQL 15 from the distribution
    from pgcounters.demos.bench.sharded import sharded

    return sharded(dsn, repeat, quick)


def _replica_read(dsn: str, repeat: int, quick: bool) -> Scenario:
    # imported on use: it starts embedded servers of its own
    from pgcounters.demos.bench.replica import replica_read

    return replica_read(dsn, repeat, quick)


SCENARIOS: dict[str, Runner] = {
    "hot-counters": hot.hot_counters,
    "hot-counters-txn": hot.hot_counters_txn,
    "redis-buffer": _redis_buffer,
    "quota": quota.quota,
    "drain": drain.drain,
    "drain-lag": drain.drain_lag,
    "drain-busy": drain.drain_busy,
    "backlog-wait": backlog.backlog_wait,
    "drain-keys": drain_keys.drain_keys,
    "top-named": drain_keys.top_named,
    "drain-changes": changes.drain_changes,
    "trigger-overhead": blog.trigger_overhead,
    "top-n": blog.top_n,
    "exact-read": blog.exact_read,
    "exact-read-live": live.exact_read_live,
    "column-guard": columns.column_guard,
    "backfill": columns.backfill_scenario,
    "path-insert": paths.path_insert,
    "replica-read": _replica_read,
    "redis-cluster": _redis_cluster,
    "sharded": _sharded,
    "sql-increment": sqlincr.sql_increment,
    "counters-per-table": width.counters_per_table,
    "worker-cost": worker_cost.worker_cost,
    "async": asyncapi.async_api,
    "soak": live.soak,
    "held-horizon": horizon.held_horizon,
    "range-read": ranges.range_read,
}

ON_REQUEST = frozenset({"sharded", "soak", "held-horizon"})
"""Scenarios run only when named: they need software the others do not (PL/Proxy), or
run for a long time (the soak: 10 minutes; held-horizon: 35)."""

DEFAULT_OUTPUT = "bench-results"


@contextmanager
def _progress(names: Sequence[str]) -> Iterator[Callable[[str], None]]:
    """A progress bar on stderr (tqdm), one step per scenario; off when stderr is no TTY.

    Yields a function to call as each scenario starts; the bar's postfix follows the
    variants measured (through :data:`report.LISTENERS`).
    """
    try:
        from tqdm import tqdm
    except ImportError:
        yield lambda name: None
        return
    # the size from shutil: a terminal that reports 0x0 gets 80x24 (tqdm would hide the bar)
    size = shutil.get_terminal_size()
    bar = tqdm(
        total=len(names),
        unit="scenario",
        file=sys.stderr,
        disable=not sys.stderr.isatty(),
        ncols=size.columns,
        nrows=size.lines,
    )
    state = {"runs": 0, "started": 0}

    def on_run(scenario: str, variant: str) -> None:
        state["runs"] += 1
        bar.set_postfix_str(f"{variant} (run {state['runs']})", refresh=True)

    def on_scenario(name: str) -> None:
        if state["started"]:
            bar.update(1)  # the previous scenario is done
        state["started"] += 1
        state["runs"] = 0
        bar.set_postfix_str("", refresh=False)
        bar.set_description_str(name, refresh=True)

    LISTENERS.append(on_run)
    try:
        yield on_scenario
        if state["started"]:
            bar.update(1)
    finally:
        LISTENERS.remove(on_run)
        bar.close()


def _server_version(dsn: str) -> str:
    from pgcounters.config import connect

    with connect(dsn) as conn:
        version = conn.info.server_version
    return f"{version // 10000}.{version % 10000}"


def main(
    dsn: str,
    names: Sequence[str],
    *,
    repeat: int,
    quick: bool,
    as_json: bool,
    output: str | None = DEFAULT_OUTPUT,
    markdown: str | None = None,
) -> int:
    chosen = list(names) or [n for n in SCENARIOS if n not in ON_REQUEST]
    started = time.perf_counter()
    results: list[Scenario] = []
    with _progress(chosen) as starting:
        for name in chosen:
            starting(name)
            results.append(SCENARIOS[name](dsn, repeat, quick))
    seconds = time.perf_counter() - started
    document: dict[str, object] = {
        "scenarios": [s.as_json() for s in results],
        "repeat": repeat,
        "quick": quick,
        "seconds": round(seconds, 1),
        "postgresql": _server_version(dsn),
        "machine": f"{platform.machine()}, {_cpus()} CPUs, Python {platform.python_version()}",
    }
    if as_json:
        print(json.dumps(document, indent=2))
    else:
        print("\n\n".join(s.table() for s in results))
    if output is not None or markdown is not None:
        from pgcounters.demos.bench import output as out

        header = [
            "# pgcounters bench",
            "",
            f"`pgcounters bench {' '.join(chosen)} --repeat {repeat}{' --quick' if quick else ''}`"
            f": {seconds:.0f} s; PostgreSQL {document['postgresql']}; {document['machine']}.",
        ]
        written = out.write(
            results,
            document,
            Path(output or DEFAULT_OUTPUT),
            header=header,
            markdown_file=Path(markdown) if markdown else None,
        )
        if written.note:
            print(written.note, file=sys.stderr)
        print(
            f"results written to {written.json.parent}/ "
            f"({len(written.charts)} charts, {', '.join(str(p) for p in written.markdown)})",
            file=sys.stderr,
        )
    return 0


def _cpus() -> int:
    import os

    return os.cpu_count() or 1
