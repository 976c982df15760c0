"""Measurements, scenarios and their reports (Markdown table and JSON)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

# (variant, baseline it is compared with, target ratio or None)
Comparison = tuple[str, str, float | None]


@dataclass
class Measurement:
    """One run of one variant: how long, how many operations, and whether it was exact."""

    seconds: float
    operations: int
    exact: bool = True
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.operations / self.seconds if self.seconds else 0.0


@dataclass
class Scenario:
    """The runs of every variant of a scenario, and its ratios against the reference technique."""

    name: str
    description: str
    unit: str = "operations"
    runs: dict[str, list[Measurement]] = field(default_factory=dict)
    comparisons: list[dict[str, object]] = field(default_factory=list)
    extra_aggregate: Literal["sum", "median"] = "sum"
    """How the ``extra`` figures of a variant's runs are combined (counts add up, times don't)."""
    headline: tuple[str, str] | None = None
    """(variant, baseline) of the scenario's headline ratio: pgcounters vs the reference
    technique. None: the first comparison with a target."""
    series: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    """Time series of a long run (name -> (seconds since the start, value)): charted as
    lines instead of the bars of the variants' rates."""

    def _combine(self, values: Sequence[float]) -> float:
        if self.extra_aggregate == "median":
            return statistics.median(values) if values else 0.0
        return sum(values)

    def add(self, variant: str, measurement: Measurement) -> None:
        if not measurement.exact:
            raise AssertionError(f"{self.name}/{variant}: the result is not exact")
        self.runs.setdefault(variant, []).append(measurement)
        for listener in list(LISTENERS):
            listener(self.name, variant)

    def median(self, variant: str) -> float:
        return statistics.median(r.seconds for r in self.runs[variant])

    def per_operation(self, variant: str) -> float:
        """Median seconds per operation (variants may run different numbers of operations)."""
        return self.median(variant) / max(self.runs[variant][0].operations, 1)

    def rate(self, variant: str) -> float:
        """Operations per second at the median time."""
        per = self.per_operation(variant)
        return 1 / per if per else 0.0

    def compare(self, spec: Sequence[Comparison]) -> None:
        """Ratios of median times per operation (baseline / variant: higher is better)."""
        for variant, baseline, target in spec:
            ratio = self.per_operation(baseline) / self.per_operation(variant)
            self.comparisons.append(
                {
                    "variant": variant,
                    "baseline": baseline,
                    "ratio": round(ratio, 3),
                    "target": target,
                    "met": None if target is None else ratio >= target,
                }
            )

    def _extra_keys(self) -> list[str]:
        keys: dict[str, None] = {}
        for runs in self.runs.values():
            for run in runs:
                keys.update(dict.fromkeys(run.extra))
        return list(keys)

    def as_json(self) -> dict[str, object]:
        extra_keys = self._extra_keys()
        head = self.headline_comparison()
        return {
            "name": self.name,
            "description": self.description,
            "unit": self.unit,
            "variants": {
                v: {
                    "runs": len(runs),
                    "median_seconds": round(self.median(v), 4),
                    "min_seconds": round(min(r.seconds for r in runs), 4),
                    "max_seconds": round(max(r.seconds for r in runs), 4),
                    self.unit: runs[0].operations,
                    "rate": round(self.rate(v), 1),
                    "exact": all(r.exact for r in runs),
                    **{k: self._combine([r.extra.get(k, 0) for r in runs]) for k in extra_keys},
                }
                for v, runs in self.runs.items()
            },
            "ratio": None if head is None else head["ratio"],
            "target": None if head is None else head["target"],
            "met": None if head is None else head["met"],
            "headline": None if head is None else f"{head['variant']} vs {head['baseline']}",
            "ratios": self.comparisons,
            **(
                {"series": {k: [list(p) for p in v] for k, v in self.series.items()}}
                if self.series
                else {}
            ),
        }

    def headline_comparison(self) -> dict[str, object] | None:
        """The comparison of :attr:`headline` (else the first with a target, else the first)."""
        if self.headline is not None:
            variant, baseline = self.headline
            for c in self.comparisons:
                if (c["variant"], c["baseline"]) == (variant, baseline):
                    return c
        with_target = [c for c in self.comparisons if c["target"] is not None]
        chosen = with_target or self.comparisons
        return chosen[0] if chosen else None

    def table(self) -> str:
        extra_keys = self._extra_keys()
        lines = [f"## {self.name}", self.description, ""]
        head = ["variant", "median s", "min-max s", f"{self.unit}/s", *extra_keys, "exact"]
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|---|" + "---:|" * (len(head) - 2) + "---|")
        for v, runs in self.runs.items():
            med = self.median(v)
            cells = [
                v,
                f"{med:.3f}",
                f"{min(r.seconds for r in runs):.3f}-{max(r.seconds for r in runs):.3f}",
                f"{self.rate(v):,.0f}",
                *(f"{self._combine([r.extra.get(k, 0) for r in runs]):g}" for k in extra_keys),
                "yes" if all(r.exact for r in runs) else "NO",
            ]
            lines.append("| " + " | ".join(cells) + " |")
        if self.comparisons:
            lines += [
                "",
                "| variant | vs | ratio (higher is better) | target | met |",
                "|---|---|---:|---:|---|",
            ]
            for c in self.comparisons:
                target = "" if c["target"] is None else f">= {c['target']}x"
                met = "" if c["met"] is None else ("yes" if c["met"] else "no")
                lines.append(
                    f"| {c['variant']} | {c['baseline']} | {c['ratio']}x | {target} | {met} |"
                )
        top = self.headline_comparison()
        if top is not None:
            verdict = "" if top["met"] is None else (", met" if top["met"] else ", NOT met")
            target = "" if top["target"] is None else f" (target >= {top['target']}x{verdict})"
            lines += [
                "",
                f"Headline: {top['variant']} vs {top['baseline']}: {top['ratio']}x{target}.",
            ]
        return "\n".join(lines)


# A scenario runner: (dsn, repeat, quick) -> the filled scenario
Runner = Callable[[str, int, bool], Scenario]

# Called with (scenario name, variant) whenever a run is added (the progress bar listens)
LISTENERS: list[Callable[[str, str], None]] = []
