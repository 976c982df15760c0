"""Smoke test of the drain-keys and top-named benchmarks with tiny sizes: every variant
runs, every total is exact, the ratios are computed."""

from __future__ import annotations

import pytest

from pgcounters.demos.bench import SCENARIOS, drain_keys


def test_the_drain_keys_scenario_is_exact(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(drain_keys, "BATCH", 700)
    monkeypatch.setattr(drain_keys, "_size", lambda quick: (3000, (10, 1000)))
    scenario = drain_keys.drain_keys(dsn, 1, True)
    assert set(scenario.runs) == {
        f"{v} {k}" for v in drain_keys.VARIANTS for k in ("10 keys", "1k keys")
    }
    assert all(r.exact for runs in scenario.runs.values() for r in runs)
    run = scenario.runs["pgcounters 1k keys"][0]
    assert run.operations == 3000
    # the backlog in one batch, against batches of 700
    assert run.extra["batches"] == 1
    assert scenario.runs["fixed batches 1k keys"][0].extra["batches"] >= 5
    assert scenario.runs["value index 1k keys"][0].extra["batches"] >= 5
    assert scenario.runs["pgcounters column 1k keys"][0].extra["batches"] == 1
    assert scenario.runs["column fixed batches 1k keys"][0].extra["batches"] >= 5
    # the value index keeps every update of pgcounters.counters off the heap-only path
    assert scenario.runs["value index 1k keys"][0].extra["heap-only updates %"] == 0
    assert scenario.runs["fixed batches 1k keys"][0].extra["heap-only updates %"] > 0
    assert {c["baseline"] for c in scenario.comparisons} >= {
        "value index 1k keys",
        "fixed batches 1k keys",
        "column fixed batches 1k keys",
        "between-claim 1k keys",
        "textbook column 1k keys",
    }
    assert SCENARIOS["drain-keys"] is drain_keys.drain_keys


def test_the_top_named_scenario_is_exact(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    scenario = drain_keys.top_named(dsn, 1, True)
    assert set(scenario.runs) == set(drain_keys.TOP_VARIANTS)
    assert all(r.exact for runs in scenario.runs.values() for r in runs)
    assert SCENARIOS["top-named"] is drain_keys.top_named
