"""``pgcounters status``: figures checked against known queue contents; JSON; Prometheus."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pgcounters import Counters, cli, status
from pgcounters.connection import Conn
from pgcounters.errors import SchemaNotInstalled
from pgcounters.status import Metric, Status, get_status
from pgcounters.worker import Worker, WorkerSettings


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus exposition, parsed by the reference client library."""
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def types(text: str) -> dict[str, str]:
    return {f.name: f.type for f in text_string_to_metric_families(text)}


@pytest.fixture
def loaded(conn: Conn, pc: Counters) -> Counters:
    """Known queue contents: 'a' 30 deltas (5 of them an hour old), 'b' 12 unlogged, 'g' 0."""
    pc.create_counter("a", int)
    pc.create_counter("b", int, mode="unlogged")
    pc.create_counter("g")
    for i in range(25):
        pc.incr("a", i % 4)
    a = pc.counter("a").id
    conn.execute(
        "INSERT INTO pgcounters.queue (target_id, key, delta, created_at)"
        " SELECT %s, '{9}', 2, now() - interval '1 hour' FROM generate_series(1, 5)",
        (a,),
    )
    for i in range(12):
        pc.incr("b", i % 3, -1)
    return pc


def test_queue_depth_and_lag_per_queue_and_per_counter(loaded: Counters) -> None:
    snap = get_status(loaded.conn)
    assert snap.schema_current
    assert (snap.queue("logged").depth, snap.queue("unlogged").depth, snap.depth) == (30, 12, 42)
    logged_age = snap.queue("logged").oldest_age
    assert logged_age is not None
    assert 3600 <= logged_age < 3600 + 300
    unlogged_age = snap.queue("unlogged").oldest_age
    assert unlogged_age is not None
    assert 0 <= unlogged_age < 300
    assert snap.lag == logged_age
    a, b, g = snap.counter("a"), snap.counter("b"), snap.counter("g")
    assert (a.mode, a.pending_logged, a.pending_unlogged, a.pending) == ("queued", 30, 0, 30)
    assert a.oldest_age is not None
    assert a.oldest_age >= 3600
    assert (b.mode, b.pending_logged, b.pending_unlogged) == ("unlogged", 0, 12)
    assert (g.pending, g.oldest_age) == (0, None)


def test_drain_statistics_count_what_was_applied(loaded: Counters) -> None:
    assert get_status(loaded.conn).drain[0].deltas_total == 0
    assert loaded.drain_batch(20) == (20, 4)
    loaded.drain_batch(100)
    loaded.drain_batch(100, unlogged=True)
    loaded.drain_batch(100)  # empty: not recorded
    snap = get_status(loaded.conn)
    logged, unlogged = snap.drain
    assert (logged.queue, logged.batches_total, logged.deltas_total) == ("logged", 2, 30)
    assert (unlogged.queue, unlogged.batches_total, unlogged.deltas_total) == ("unlogged", 1, 12)
    assert logged.keys_total == 4 + 5  # keys 0-3, then 0-3 and 9
    assert logged.seconds_total > 0
    assert logged.last_minute is not None
    # every window holds the 30 deltas; the rate is what they make over its span
    for minutes in status.WINDOWS_MINUTES:
        assert 30 / ((minutes + 1) * 60) <= logged.rates[minutes] <= 30 / (minutes * 60)
    assert snap.depth == 0
    assert snap.queue("logged").oldest_age is None


def test_old_statistics_fold_into_the_totals(conn: Conn, pc: Counters) -> None:
    conn.execute(
        "INSERT INTO pgcounters.drain_stats VALUES"
        " (date_trunc('minute', now()) - interval '3 hours', false, 12345, 7, 700, 70, 1.5),"
        " (date_trunc('minute', now()) - interval '2 hours', false, 12346, 3, 300, 30, 0.5)"
    )
    pc.create_counter("c")
    pc.incr("c")
    pc.drain()
    rows = conn.execute(
        "SELECT bucket = '-infinity', pid, batches, deltas, keys, seconds"
        " FROM pgcounters.drain_stats ORDER BY bucket"
    ).fetchall()
    assert rows[0] == (True, 0, 10, 1000, 100, 2.0)
    assert [r[1] for r in rows[1:]] == [conn.info.backend_pid]
    logged = get_status(conn).drain[0]
    assert (logged.batches_total, logged.deltas_total, logged.keys_total) == (11, 1001, 101)
    assert logged.rates[15] == pytest.approx(1 / 960, rel=0.1)


def test_tables_show_size_tuples_and_dead_tuples(conn: Conn, loaded: Counters) -> None:
    conn.execute("CREATE TABLE article (id bigint PRIMARY KEY, n bigint NOT NULL DEFAULT 0)")
    loaded.create_column_counter("article.n", "article", "n")
    loaded.drain()
    if conn.info.server_version >= 150000:
        conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT pg_stat_clear_snapshot()")
    snap = get_status(conn)
    roles = {t.qualified: t.role for t in snap.tables}
    assert roles["pgcounters.queue"] == roles["pgcounters.queue_unlogged"] == "queue"
    assert roles["pgcounters.counters"] == "counters"
    assert roles["public.article"] == "counter columns"
    queue = snap.table("pgcounters.queue")
    assert not queue.unlogged
    assert snap.table("pgcounters.queue_unlogged").unlogged
    assert queue.total_bytes >= queue.table_bytes > 0
    assert 0 <= queue.dead_ratio <= 1
    if conn.info.server_version < 150000:
        pytest.skip(
            "tuple counts not checked: flushing the statistics at once needs"
            " pg_stat_force_next_flush() (PostgreSQL 15+); the rest of the test passed"
        )
    assert queue.dead_tuples == 30  # the drain deleted the 30 logged deltas
    assert snap.table("pgcounters.counters").live_tuples == 8  # keys 0-3 and 9 of a, 0-2 of b


def test_connected_workers_and_wakeups_are_shown(dsn: str, conn: Conn, pc: Counters) -> None:
    assert get_status(conn).workers == ()
    assert get_status(conn).wakeup_interval is None
    conn.execute("SELECT pgcounters.enable_wakeups(interval '250 ms')")
    worker = Worker(dsn, WorkerSettings(max_interval=0.1, log_every=0))
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        deadline = 600
        while not get_status(conn).workers and deadline:
            deadline -= 1
            threading.Event().wait(0.05)
        snap = get_status(conn)
    finally:
        worker.stop()
        thread.join(timeout=60)
    assert [w.application_name for w in snap.workers] == ["pgcounters worker"]
    assert snap.wakeup_interval == 0.25


def test_json_report(loaded: Counters) -> None:
    report = json.loads(status.to_json(get_status(loaded.conn)))
    assert report["schema"]["current"] is True
    assert report["depth"] == 42
    assert report["lag_seconds"] >= 3600
    assert {q["queue"]: q["depth"] for q in report["queues"]} == {"logged": 30, "unlogged": 12}
    assert {c["counter"]: c["pending"] for c in report["counters"]} == {"a": 30, "b": 12, "g": 0}
    assert {t["table"] for t in report["tables"]} >= {"queue", "queue_unlogged", "counters"}
    assert [d["queue"] for d in report["drain"]] == ["logged", "unlogged"]


def test_prometheus_exposition_parses_and_matches(loaded: Counters) -> None:
    loaded.drain_batch(20)
    text = status.prometheus(get_status(loaded.conn))
    got = samples(text)
    assert got[("pgcounters_up", ())] == 1
    assert got[("pgcounters_schema_version", ())] == got[("pgcounters_schema_expected_version", ())]
    assert got[("pgcounters_queue_depth", (("queue", "logged"),))] == 10
    assert got[("pgcounters_queue_depth", (("queue", "unlogged"),))] == 12
    assert got[("pgcounters_queue_oldest_age_seconds", (("queue", "logged"),))] >= 3600
    assert (
        got[("pgcounters_counter_pending_deltas", (("counter", "b"), ("queue", "unlogged")))] == 12
    )
    assert got[("pgcounters_counter_oldest_age_seconds", (("counter", "g"),))] == 0
    assert got[("pgcounters_drained_deltas_total", (("queue", "logged"),))] == 20
    assert got[("pgcounters_drain_batches_total", (("queue", "logged"),))] == 1
    assert (
        got[("pgcounters_drain_rate_deltas_per_second", (("queue", "logged"), ("window", "5m")))]
        > 0
    )
    assert (
        got[("pgcounters_table_size_bytes", (("role", "queue"), ("table", "pgcounters.queue")))] > 0
    )
    assert got[("pgcounters_workers", ())] == 0
    kinds = types(text)
    assert kinds["pgcounters_drained_deltas"] == "counter"
    assert kinds["pgcounters_queue_depth"] == "gauge"
    for line in text.splitlines():
        if line.startswith("#"):
            assert line.split()[1] in ("HELP", "TYPE")
            assert line.split()[2].startswith("pgcounters_")
        else:
            assert line.startswith("pgcounters_")


def test_label_values_are_escaped() -> None:
    tricky = 'a"b\\c\nd'
    text = status.render_metrics(
        [Metric("pgcounters_x", "help with \\ and\nnewline", "gauge", (((("k", tricky),), 1.5),))]
    )
    assert samples(text) == {("pgcounters_x", (("k", tricky),)): 1.5}


@dataclass
class _DriftSection:
    """A stand-in for one of the sections of the report."""

    name: str = "triggers"

    def as_json(self) -> object:
        return {"drifted": ["t1"]}

    def lines(self) -> list[str]:
        return ["triggers: 1 drifted (t1)"]

    def metrics(self) -> list[Metric]:
        return [Metric("pgcounters_triggers_drifted", "Triggers whose definition drifted.",
                       "gauge", (((), 1),))]  # fmt: skip


def test_a_section_renders_in_every_format(conn: Conn, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(status, "_SECTIONS", {"triggers": lambda c: _DriftSection()})
    snap = get_status(conn)
    assert "triggers: 1 drifted (t1)" in status.text(snap)
    assert json.loads(status.to_json(snap))["triggers"] == {"drifted": ["t1"]}
    assert samples(status.prometheus(snap))[("pgcounters_triggers_drifted", ())] == 1


def test_status_needs_the_schema(empty_dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    with psycopg.connect(empty_dsn, autocommit=True) as conn, pytest.raises(SchemaNotInstalled):
        get_status(conn)
    assert cli.run(["--dsn", empty_dsn, "status"]) == 1
    assert "pgcounters install" in capsys.readouterr().err


def test_the_status_command(dsn: str, loaded: Counters, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.run(["--dsn", dsn, "status"]) == 0
    out = capsys.readouterr().out
    assert "schema version" in out
    assert "a  30 pending (logged 30, unlogged 0)" in out
    assert cli.run(["--dsn", dsn, "status", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["depth"] == 42
    assert cli.run(["--dsn", dsn, "status", "--prometheus"]) == 0
    assert (
        samples(capsys.readouterr().out)[("pgcounters_queue_depth", (("queue", "logged"),))] == 30
    )


@pytest.fixture
def http(dsn: str) -> Iterator[str]:
    server = status.make_server(dsn, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.headers["Content-Type"], r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


def test_the_http_endpoint(http: str, loaded: Counters) -> None:
    code, kind, body = _get(http + "/metrics")
    assert (code, kind) == (200, status.PROMETHEUS_CONTENT_TYPE)
    assert samples(body)[("pgcounters_queue_depth", (("queue", "unlogged"),))] == 12
    code, kind, body = _get(http + "/status.json")
    assert (code, kind, json.loads(body)["depth"]) == (200, "application/json", 42)
    assert _get(http + "/")[0] == 200
    assert _get(http + "/nope")[0] == 404


def test_the_http_endpoint_reports_down() -> None:
    server = status.make_server("host=127.0.0.1 port=1 connect_timeout=1", "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        code, _, body = _get(base + "/metrics")
        assert (code, samples(body)) == (200, {("pgcounters_up", ()): 0})
        assert _get(base + "/status.json")[0] == 503
    finally:
        server.shutdown()
        server.server_close()


def test_status_type_is_a_frozen_snapshot(conn: Conn) -> None:
    snap = get_status(conn)
    assert isinstance(snap, Status)
    with pytest.raises(AttributeError):
        snap.schema_installed = 0  # type: ignore[misc]
