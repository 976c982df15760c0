"""The redis-buffer benchmark scenario runs every variant and checks every total (not speed)."""

from __future__ import annotations

import pytest

from pgcounters.demos.bench import SCENARIOS
from pgcounters.demos.bench.buffers import COMPARISONS, FLUSH_VARIANTS, INCR_VARIANTS, redis_buffer


def test_the_scenario_is_registered() -> None:
    assert "redis-buffer" in SCENARIOS


def test_a_tiny_run_is_exact(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGCOUNTERS_REDIS_URL", raising=False)
    scenario = redis_buffer(dsn, 1, True, increments=300, flush_keys=120)
    assert set(scenario.runs) == set(INCR_VARIANTS) | set(FLUSH_VARIANTS)
    for variant, runs in scenario.runs.items():
        assert [r.exact for r in runs] == [True], variant
        expected = 120 if variant.startswith("flush") else 300
        assert runs[0].operations == expected
    assert len(scenario.comparisons) == len(COMPARISONS)
    assert "| incr: redis buffer |" in scenario.table()
