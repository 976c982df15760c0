"""What holds back VACUUM: status (text, JSON, Prometheus), the worker's WARNING, a role that
may not see who holds it. Each holder is a real transaction the test opens."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgcounters import horizon, status
from pgcounters.connection import Conn
from pgcounters.embedded import EmbeddedPostgres
from pgcounters.horizon import HorizonHolder, HorizonWatch
from pgcounters.worker import Worker, WorkerSettings
from test_status import samples

REPORT = "nightly report"


class Held:
    """A REPEATABLE READ transaction left idle after its first statement, as a report or a
    forgotten shell leaves it: what it was, read from inside it."""

    def __init__(self, dsn: str) -> None:
        self.conn = psycopg.connect(dsn, application_name=REPORT)
        self.conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        row = self.conn.execute(
            "SELECT pg_backend_pid(), now(), pg_snapshot_xmin(pg_current_snapshot())::text"
        ).fetchone()
        assert row is not None
        self.pid: int = row[0]
        self.started: dt.datetime = row[1]
        self.xmin = int(row[2])

    def close(self) -> None:
        self.conn.rollback()
        self.conn.close()


@pytest.fixture
def held(dsn: str) -> Iterator[Held]:
    h = Held(dsn)
    try:
        yield h
    finally:
        h.close()


def next_xid(conn: Conn) -> int:
    """Spend one transaction id; the next one to be given."""
    row = conn.execute("SELECT pg_current_xact_id()::text").fetchone()
    assert row is not None
    return int(row[0]) + 1


def test_no_open_snapshot(conn: Conn) -> None:
    section = status.collect_horizon(conn)
    assert section.holders == ()
    assert section.lines() == [
        "horizon: no open snapshot (VACUUM can remove what the drain leaves)"
    ]
    assert samples(status.render_metrics(section.metrics())) == {
        ("pgcounters_horizon_xid_age", ()): 0,
        ("pgcounters_horizon_seconds", ()): 0,
    }


def test_a_transaction_idle_in_repeatable_read_is_named_with_its_age(
    conn: Conn, held: Held
) -> None:
    for _ in range(5):
        next_xid(conn)
    expected_age = next_xid(conn) - held.xmin
    snap = status.get_status(conn)
    section = next(s for s in snap.sections if isinstance(s, status.HorizonSection))
    oldest = section.oldest
    assert oldest is not None
    assert (oldest.kind, oldest.pid, oldest.name, oldest.state, oldest.since) == (
        "session", held.pid, REPORT, "idle in transaction", held.started,
    )  # fmt: skip
    assert oldest.xid_age == expected_age
    assert oldest.seconds is not None
    assert oldest.seconds > 0
    # every format says it
    text = status.text(snap)
    assert f"session {held.pid} ({REPORT}, idle in transaction, since " in text
    found = json.loads(status.to_json(snap))["horizon"]
    assert found["xid_age"] == expected_age
    assert found["holders"][0]["pid"] == held.pid
    assert found["holders"][0]["since"] == held.started.isoformat()
    metrics = samples(status.prometheus(snap))
    assert metrics[("pgcounters_horizon_xid_age", ())] == expected_age
    assert metrics[("pgcounters_horizon_seconds", ())] == pytest.approx(oldest.seconds, abs=1)


def test_the_holder_is_gone_once_its_transaction_ends(conn: Conn, dsn: str) -> None:
    h = Held(dsn)
    assert [x.pid for x in horizon.holders(conn)] == [h.pid]
    h.close()
    assert horizon.holders(conn) == ()


def test_a_prepared_transaction_holds_the_horizon_too(tmp_path: Path) -> None:
    # prepared transactions are off by default: a server of the test's own
    server = EmbeddedPostgres(tmp_path / "data", settings={"max_prepared_transactions": "2"})
    with server as pg, psycopg.connect(pg.dsn(), autocommit=True) as c:
        c.execute("CREATE TABLE t (x int)")
        with psycopg.connect(pg.dsn()) as p:
            p.execute("INSERT INTO t VALUES (1)")
            p.execute("PREPARE TRANSACTION 'forgotten'")
        try:
            found = horizon.holders(c)
            assert [(h.kind, h.name, h.state) for h in found] == [
                ("prepared transaction", "forgotten", "prepared")
            ]
        finally:
            c.execute("ROLLBACK PREPARED 'forgotten'")
        assert horizon.holders(c) == ()


@pytest.fixture
def lowly_dsn(conn: Conn, dsn: str) -> Iterator[str]:
    """A role of its own, without pg_read_all_stats."""
    role = f"lowly_{conn.info.dbname}"
    conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    conn.execute(sql.SQL("GRANT USAGE ON SCHEMA pgcounters TO {}").format(sql.Identifier(role)))
    params = conninfo_to_dict(dsn)
    params["user"] = role
    try:
        yield make_conninfo(**params)  # type: ignore[arg-type]
    finally:
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_a_role_without_the_right_sees_the_age_not_the_holder(lowly_dsn: str, held: Held) -> None:
    with psycopg.connect(lowly_dsn, autocommit=True) as lowly:
        expected_age = next_xid(lowly) - held.xmin
        (oldest,) = horizon.holders(lowly)
    assert (oldest.pid, oldest.name, oldest.state, oldest.since, oldest.seconds) == (
        held.pid, REPORT, None, None, None,
    )  # fmt: skip
    assert oldest.xid_age == expected_age
    assert not oldest.visible
    assert oldest.describe() == (
        f"session {held.pid} ({REPORT}, its state hidden from this role: grant it "
        "pg_read_all_stats)"
    )
    section = status.HorizonSection((oldest,))
    # no time to report: the gauge of seconds is left out rather than 0
    assert samples(status.render_metrics(section.metrics())) == {
        ("pgcounters_horizon_xid_age", ()): expected_age
    }


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_watch_warns_once_past_the_threshold_reminds_and_says_when_it_ends(
    conn: Conn, dsn: str
) -> None:
    clock = Clock()
    watch = HorizonWatch(30.0, clock)
    h = Held(dsn)
    try:
        assert watch.due()
        assert not watch.due()  # one look every HORIZON_EVERY seconds
        # the holder's own age decides: the session started a moment ago
        assert watch.seen(horizon.holders(conn)) == []
        found = horizon.holders(conn)
        older = [HorizonHolder(**{**vars(found[0]), "seconds": 31.0})]
        (line,) = watch.seen(older)
        assert line[0] == logging.WARNING
        assert line[1].startswith("the oldest snapshot of the database has been held for 31 s")
        assert f"session {h.pid} ({REPORT}, idle in transaction, since" in line[1]
        clock.now += horizon.HORIZON_REMIND - 1
        assert watch.seen(older) == []
        clock.now += 1
        assert [lvl for lvl, _ in watch.seen(older)] == [logging.WARNING]
    finally:
        h.close()
    assert watch.seen(horizon.holders(conn)) == [
        (logging.INFO, f"the horizon is no longer held by {older[0].describe()}")
    ]


def test_the_watch_times_a_hidden_holder_from_when_it_first_saw_it(
    lowly_dsn: str, held: Held
) -> None:
    clock = Clock()
    watch = HorizonWatch(30.0, clock)
    with psycopg.connect(lowly_dsn, autocommit=True) as lowly:
        assert watch.seen(horizon.holders(lowly)) == []
        clock.now += 29
        assert watch.seen(horizon.holders(lowly)) == []
        clock.now += 1
        (line,) = watch.seen(horizon.holders(lowly))
        assert line[0] == logging.WARNING
        assert "held for 30 s" in line[1]
        assert "its state hidden from this role" in line[1]
        # the same session with a younger snapshot is another transaction: timed anew
        young = horizon.holders(lowly)[0]
        younger = HorizonHolder(**{**vars(young), "xid_age": young.xid_age - 1})
        clock.now += 100
        assert watch.seen([younger]) == []


def test_a_threshold_of_zero_never_looks() -> None:
    watch = HorizonWatch(0.0)
    assert not watch.due()


def test_the_worker_warns_about_a_snapshot_held_past_its_threshold(
    dsn: str, held: Held, caplog: pytest.LogCaptureFixture
) -> None:
    time.sleep(0.6)  # older than the threshold below when the worker first looks
    worker = Worker(dsn, WorkerSettings(horizon_warning=0.5, min_interval=0.05))
    thread = threading.Thread(target=worker.run)
    with caplog.at_level(logging.WARNING, logger="pgcounters.worker"):
        thread.start()
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not any(
                "oldest snapshot" in r.getMessage() for r in caplog.records
            ):
                time.sleep(0.05)
        finally:
            worker.stop()
            thread.join()
    warnings = [r.getMessage() for r in caplog.records if "oldest snapshot" in r.getMessage()]
    assert len(warnings) == 1
    assert f"session {held.pid} ({REPORT}, idle in transaction" in warnings[0]


def test_the_worker_setting_is_validated() -> None:
    from pgcounters.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="horizon_warning"):
        WorkerSettings(horizon_warning=-1).validate()


def test_the_async_worker_warns_too(dsn: str, held: Held, caplog: pytest.LogCaptureFixture) -> None:
    from pgcounters.async_worker import AsyncWorker

    def warned() -> list[str]:
        return [r.getMessage() for r in caplog.records if "oldest snapshot" in r.getMessage()]

    async def main() -> None:
        async with AsyncWorker(dsn, WorkerSettings(horizon_warning=0.5)):
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not warned():
                await asyncio.sleep(0.05)

    time.sleep(0.6)
    with caplog.at_level(logging.WARNING, logger="pgcounters.worker"):
        asyncio.run(main())
    (line,) = warned()
    assert f"session {held.pid} ({REPORT}, idle in transaction" in line
