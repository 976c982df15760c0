"""``pgcounters bench``: the seeds' measurements, naive technique and pgcounters in one run.

Each scenario runs every variant ``--repeat`` times, interleaved (variant A, B,
C, then A, B, C again) so that drift of a shared machine hits all alike, and
reports the median, the spread (min-max) and ratios. Absolute times on a shared
machine are noise; the ratios are the result.

A scenario lives in its own module of this package and is registered in
:data:`SCENARIOS` below.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from pgcounters.bench import drain, hot, quota
from pgcounters.bench.report import Measurement, Runner, Scenario

__all__ = ["SCENARIOS", "Measurement", "Scenario", "main"]


def _redis_buffer(dsn: str, repeat: int, quick: bool) -> Scenario:
    # imported on use: it needs the redis extra
    from pgcounters.bench.buffers import redis_buffer

    return redis_buffer(dsn, repeat, quick)


SCENARIOS: dict[str, Runner] = {
    "hot-counters": hot.hot_counters,
    "hot-counters-txn": hot.hot_counters_txn,
    "redis-buffer": _redis_buffer,
    "quota": quota.quota,
    "drain": drain.drain,
    "drain-lag": drain.drain_lag,
}


def main(dsn: str, names: Sequence[str], *, repeat: int, quick: bool, as_json: bool) -> int:
    chosen = list(names) or list(SCENARIOS)
    results = [SCENARIOS[name](dsn, repeat, quick) for name in chosen]
    if as_json:
        print(json.dumps({"scenarios": [s.as_json() for s in results]}, indent=2))
    else:
        print("\n\n".join(s.table() for s in results))
    return 0
