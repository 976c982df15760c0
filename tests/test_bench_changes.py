"""Smoke test of the drain-changes benchmark with tiny sizes: both variants run, every
total is exact, the changes name every key, the ratios are computed."""

from __future__ import annotations

import pytest

from pgcounters.demos.bench import SCENARIOS, changes


def test_the_drain_changes_scenario_is_exact(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # batches of 1500 keys at 3k keys: above the cap of 1000, the counter is "many keys"
    monkeypatch.setattr(changes, "BATCH", 1500)
    monkeypatch.setattr(changes, "_size", lambda quick: (6000, (10, 3000)))
    scenario = changes.drain_changes(dsn, 1, True)
    assert set(scenario.runs) == {
        f"{v} {k}" for v in changes.VARIANTS for k in ("10 keys", "3k keys")
    }
    assert all(r.exact for runs in scenario.runs.values() for r in runs)
    assert scenario.runs["drain+changes 3k keys"][0].extra["batches"] >= 4
    assert {c["baseline"] for c in scenario.comparisons} == {"drain 10 keys", "drain 3k keys"}
    assert SCENARIOS["drain-changes"] is changes.drain_changes
