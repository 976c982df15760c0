"""The replica-read and redis-cluster benchmark scenarios run every variant and check every
value (not speed)."""

from __future__ import annotations

from pgcounters.demos.bench import SCENARIOS, cluster, replica


def test_the_scenarios_are_registered() -> None:
    assert {"replica-read", "redis-cluster"} <= set(SCENARIOS)


def test_a_quick_replica_read_run_is_exact(dsn: str) -> None:
    scenario = replica.replica_read(dsn, 1, True)
    assert list(scenario.runs) == list(replica.VARIANTS)
    for variant, runs in scenario.runs.items():
        assert [r.exact for r in runs] == [True], variant
        assert runs[0].operations == (400 if "incr" in variant else 200)
    assert len(scenario.comparisons) == len(replica.COMPARISONS)


def test_a_quick_redis_cluster_run_is_exact(dsn: str) -> None:
    scenario = cluster.redis_cluster(dsn, 1, True)
    assert list(scenario.runs) == list(cluster.VARIANTS)
    for variant, runs in scenario.runs.items():
        assert [r.exact for r in runs] == [True], variant
    assert scenario.runs["incr: one server"][0].operations == 2000
    flushed = {runs[0].operations for v, runs in scenario.runs.items() if v.startswith("flush")}
    assert len(flushed) == 1  # the same keys on every path
    assert 0 < flushed.pop() <= cluster.KEYS
    assert len(scenario.comparisons) == len(cluster.COMPARISONS)
