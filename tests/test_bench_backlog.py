"""The backlog-wait benchmark with tiny sizes: exact, the application's updates timed, the
worker stopped by SIGTERM."""

from __future__ import annotations

from pgcounters.demos.bench import SCENARIOS, backlog


def test_backlog_wait_drains_exactly_and_times_the_application_and_the_stop(dsn: str) -> None:
    run = backlog._drain_run(dsn, (), 20_000, 2_000)
    assert run.exact
    assert run.operations == 20_000
    assert run.extra["updates"] > 0
    assert run.extra["longest wait ms"] >= run.extra["wait p99 ms"] > 0
    assert run.extra["SIGTERM to exit s"] > 0
    assert SCENARIOS["backlog-wait"] is backlog.backlog_wait
