"""Writing a run's results: JSON, a Markdown report, and one PNG bar chart per scenario.

Charts are drawn with matplotlib (the ``bench`` extra) on a bare ``Figure``
(no pyplot, no display needed). Without matplotlib the JSON and Markdown are
still written and the charts are skipped with a note.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pgcounters.demos.bench.report import Scenario

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_COLORS = {"headline": "#1f77b4", "baseline": "#7f7f7f", "other": "#aec7e8"}


@dataclass(frozen=True)
class Written:
    """The files written for a run."""

    json: Path
    markdown: list[Path]
    charts: list[Path]
    note: str = ""


def chart_name(scenario: Scenario) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", scenario.name.lower()).strip("-") + ".png"


def headline_text(scenario: Scenario) -> str:
    head = scenario.headline_comparison()
    if head is None:
        return scenario.name
    text = f"{head['variant']} vs {head['baseline']}: {head['ratio']}x"
    if head["target"] is not None:
        text += f" (target >= {head['target']}x: {'met' if head['met'] else 'not met'})"
    return text


def chart(scenario: Scenario, path: Path) -> None:
    """A horizontal bar chart of the variants' rates (median; whiskers: min-max)."""
    from matplotlib.figure import Figure

    variants = list(scenario.runs)
    rates = [scenario.rate(v) for v in variants]
    low, high = [], []
    for v, rate in zip(variants, rates, strict=True):
        ops = scenario.runs[v][0].operations
        fastest = min(r.seconds for r in scenario.runs[v])
        slowest = max(r.seconds for r in scenario.runs[v])
        low.append(max(0.0, rate - (ops / slowest if slowest else 0.0)))
        high.append(max(0.0, (ops / fastest if fastest else 0.0) - rate))
    head = scenario.headline_comparison()
    colors = []
    for v in variants:
        if head is not None and v == head["variant"]:
            colors.append(_COLORS["headline"])
        elif head is not None and v == head["baseline"]:
            colors.append(_COLORS["baseline"])
        else:
            colors.append(_COLORS["other"])
    fig = Figure(figsize=(9, 1.6 + 0.45 * len(variants)), layout="constrained")
    ax = fig.subplots()
    ax.barh(variants, rates, xerr=[low, high], color=colors, capsize=3)
    ax.invert_yaxis()
    positive = [r for r in rates if r > 0]
    if positive and max(positive) / min(positive) > 50:
        ax.set_xscale("log")
    ax.set_xlabel(f"{scenario.unit} per second (median of the runs; whiskers: min-max)")
    ax.set_title(f"{scenario.name}\n{headline_text(scenario)}", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    fig.savefig(path, dpi=100)


def series_chart(scenario: Scenario, path: Path) -> None:
    """Line charts of a long run's time series, one panel per kind (the text before the
    colon of a series' name: "size MB: queue" and "size MB: counters" share a panel)."""
    from matplotlib.figure import Figure

    panels: dict[str, list[str]] = {}
    for name in scenario.series:
        panels.setdefault(name.split(":", 1)[0], []).append(name)
    fig = Figure(figsize=(9, 2.0 * len(panels) + 0.6), layout="constrained")
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (kind, names) in zip(axes, panels.items(), strict=True):
        for name in names:
            points = scenario.series[name]
            label = name.split(":", 1)[1].strip() if ":" in name else name
            ax.plot([t for t, _ in points], [v for _, v in points], label=label)
        ax.set_ylabel(kind, fontsize=9)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        if len(names) > 1:
            ax.legend(fontsize=8, loc="upper left")
    axes[-1].set_xlabel("seconds since the start")
    axes[0].set_title(scenario.name, fontsize=10)
    fig.savefig(path, dpi=100)


def markdown(scenarios: Sequence[Scenario], header: Sequence[str], charts_dir: str | None) -> str:
    """The report: header lines, a summary of headline ratios, then every scenario's tables."""
    lines = [
        *header,
        "",
        "| scenario | headline | ratio | target | met |",
        "|---|---|---:|---:|---|",
    ]
    for s in scenarios:
        head = s.headline_comparison()
        if head is None:
            lines.append(f"| {s.name} | | | | |")
            continue
        target = "" if head["target"] is None else f">= {head['target']}x"
        met = "" if head["met"] is None else ("yes" if head["met"] else "no")
        lines.append(
            f"| {s.name} | {head['variant']} vs {head['baseline']} | {head['ratio']}x "
            f"| {target} | {met} |"
        )
    for s in scenarios:
        lines += ["", s.table()]
        if charts_dir is not None:
            lines += ["", f"![{s.name}]({charts_dir}/{chart_name(s)})"]
    return "\n".join(lines) + "\n"


def write(
    scenarios: Sequence[Scenario],
    document: dict[str, object],
    out_dir: Path,
    *,
    header: Sequence[str] = (),
    markdown_file: Path | None = None,
) -> Written:
    """Write ``results.json``, ``results.md`` and the charts to ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / "results.json"
    json_path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    charts: list[Path] = []
    note = ""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        note = "charts skipped: matplotlib is not installed (pip install 'pgcounters[bench]')"
    else:
        for s in scenarios:
            if s.runs:
                path = out_dir / chart_name(s)
                (series_chart if s.series else chart)(s, path)
                charts.append(path)
    drawn = bool(charts)
    md_paths = [out_dir / "results.md"]
    (out_dir / "results.md").write_text(
        markdown(scenarios, header, "." if drawn else None), encoding="utf-8"
    )
    if markdown_file is not None:
        markdown_file.parent.mkdir(parents=True, exist_ok=True)
        relative = os.path.relpath(out_dir, markdown_file.parent).replace(os.sep, "/")
        markdown_file.write_text(
            markdown(scenarios, header, relative if drawn else None), encoding="utf-8"
        )
        md_paths.append(markdown_file)
    return Written(json_path, md_paths, charts, note)
