"""``pgcounters bench``: the seed's measurements, naive technique and pgcounters in one run.

Each scenario runs every variant ``--repeat`` times, interleaved (variant A, B,
C, then A, B, C again) so that drift of a shared machine hits all alike, and
reports the median, the spread (min-max) and ratios. Absolute times on a shared
machine are noise; the ratios are the result.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from pgcounters import workloads

# (variant, baseline it is compared with, target ratio from DESIGN section 4 or None)
HOT_COMPARISONS: tuple[tuple[str, str, float | None], ...] = (
    ("raw-queue", "update", None),
    ("raw-unlogged", "update", None),
    ("raw-batched", "update", None),
    ("pgcounters-queued", "raw-queue", 0.9),
    ("pgcounters-unlogged", "raw-unlogged", 0.9),
    ("pgcounters-batched", "raw-batched", 0.9),
    ("pgcounters-batched", "update", 10.0),
    ("pgcounters-direct", "update", 0.9),
)
TXN_COMPARISONS: tuple[tuple[str, str, float | None], ...] = (
    ("pgcounters-queued", "update", 8.0),
    ("pgcounters-unlogged", "update", None),
)


@dataclass
class Scenario:
    name: str
    description: str
    runs: dict[str, list[workloads.RunResult]] = field(default_factory=dict)
    comparisons: list[dict[str, object]] = field(default_factory=list)

    def median(self, variant: str) -> float:
        return statistics.median(r.seconds for r in self.runs[variant])

    def compare(self, spec: Sequence[tuple[str, str, float | None]]) -> None:
        for variant, baseline, target in spec:
            ratio = self.median(baseline) / self.median(variant)
            self.comparisons.append(
                {
                    "variant": variant,
                    "baseline": baseline,
                    "ratio": round(ratio, 3),
                    "target": target,
                    "met": None if target is None else ratio >= target,
                }
            )

    def as_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "description": self.description,
            "variants": {
                v: {
                    "median_seconds": round(self.median(v), 4),
                    "min_seconds": round(min(r.seconds for r in runs), 4),
                    "max_seconds": round(max(r.seconds for r in runs), 4),
                    "increments": runs[0].increments,
                    "transactions": runs[0].transactions,
                    "deadlocks": sum(r.deadlocks for r in runs),
                    "lock_wait_samples": sum(r.lock_wait_samples for r in runs),
                    "exact": all(r.exact for r in runs),
                }
                for v, runs in self.runs.items()
            },
            "comparisons": self.comparisons,
        }

    def table(self) -> str:
        lines = [f"## {self.name}", self.description, ""]
        lines.append("| variant | median s | min-max s | incr/s | deadlocks | lock waits | exact |")
        lines.append("|---|---:|---:|---:|---:|---:|---|")
        for v, runs in self.runs.items():
            med = self.median(v)
            lines.append(
                f"| {v} | {med:.3f} | {min(r.seconds for r in runs):.3f}-"
                f"{max(r.seconds for r in runs):.3f} | {runs[0].increments / med:,.0f} | "
                f"{sum(r.deadlocks for r in runs)} | {sum(r.lock_wait_samples for r in runs)} | "
                f"{'yes' if all(r.exact for r in runs) else 'NO'} |"
            )
        lines += [
            "",
            "| variant | vs | ratio (higher is better) | target | met |",
            "|---|---|---:|---:|---|",
        ]
        for c in self.comparisons:
            target = "" if c["target"] is None else f">= {c['target']}x"
            met = "" if c["met"] is None else ("yes" if c["met"] else "no")
            lines.append(f"| {c['variant']} | {c['baseline']} | {c['ratio']}x | {target} | {met} |")
        return "\n".join(lines)


def _run(
    dsn: str,
    scenario: Scenario,
    variants: Sequence[str],
    plan: workloads.Plan,
    repeat: int,
    **kwargs: object,
) -> None:
    for _ in range(repeat):
        for variant in variants:
            result = workloads.run_variant(dsn, variant, plan, **kwargs)  # type: ignore[arg-type]
            if not result.exact:
                raise AssertionError(f"{scenario.name}/{variant}: totals are not exact")
            scenario.runs.setdefault(variant, []).append(result)


def hot_counters(dsn: str, repeat: int, quick: bool) -> Scenario:
    per_writer = 200 if quick else 1000
    scenario = Scenario(
        "hot-counters",
        f"Seed 004: 10 concurrent writers x {per_writer} increments over 10 counters, "
        "each increment its own transaction.",
    )
    plan = workloads.make_plan(10, per_writer, 10)
    _run(dsn, scenario, list(workloads.VARIANTS), plan, repeat)
    scenario.compare(HOT_COMPARISONS)
    return scenario


def hot_counters_txn(dsn: str, repeat: int, quick: bool) -> Scenario:
    per_writer = 10 if quick else 40
    scenario = Scenario(
        "hot-counters-txn",
        f"10 writers x {per_writer} increments; each transaction increments 1-3 of 10 counters "
        "in random order, then works 20 ms before COMMIT.",
    )
    plan = workloads.make_plan(10, per_writer, 10, per_transaction=(1, 3))
    _run(
        dsn,
        scenario,
        ["update", "pgcounters-queued", "pgcounters-unlogged"],
        plan,
        repeat,
        work_seconds=0.02,
        sample_locks=True,
    )
    scenario.compare(TXN_COMPARISONS)
    return scenario


SCENARIOS = {"hot-counters": hot_counters, "hot-counters-txn": hot_counters_txn}


def main(dsn: str, names: Sequence[str], *, repeat: int, quick: bool, as_json: bool) -> int:
    workloads.prepare(dsn, 10)
    chosen = list(names) or list(SCENARIOS)
    results = [SCENARIOS[name](dsn, repeat, quick) for name in chosen]
    if as_json:
        print(json.dumps({"scenarios": [s.as_json() for s in results]}, indent=2))
    else:
        print("\n\n".join(s.table() for s in results))
    return 0
