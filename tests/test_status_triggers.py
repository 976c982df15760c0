"""The ``triggers`` section of ``pgcounters status``: installed vs declared trigger drift."""

from __future__ import annotations

import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

import blog_schema
from pgcounters import cli, status, triggers
from pgcounters.compiler import trigger_name
from pgcounters.connection import Conn
from pgcounters.specs import CounterSpec, Fragment
from pgcounters.status import TriggersSection, get_status

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def drift_of(got: Samples, counter: str) -> dict[str, float]:
    """The state gauges of one counter: {state: 0 or 1}."""
    return {
        dict(labels)["state"]: value
        for (name, labels), value in got.items()
        if name == "pgcounters_trigger_drift" and dict(labels)["counter"] == counter
    }


def section(conn: Conn) -> TriggersSection:
    found = [s for s in get_status(conn).sections if s.name == "triggers"]
    assert len(found) == 1
    assert isinstance(found[0], TriggersSection)
    return found[0]


@pytest.fixture
def specs(conn: Conn) -> list[CounterSpec]:
    blog_schema.create(conn)
    chosen = blog_schema.specs()
    triggers.install(conn, chosen)
    return chosen


def test_the_section_is_registered_by_default(conn: Conn) -> None:
    assert "triggers" in status._SECTIONS
    found = section(conn)
    assert found.counters == ()
    assert found.lines() == ["triggers: no declared counters"]
    assert samples(status.prometheus(get_status(conn)))[("pgcounters_triggers_drifted", ())] == 0


def test_all_installed(conn: Conn, specs: list[CounterSpec]) -> None:
    found = section(conn)
    assert {(c.counter, c.state) for c in found.counters} == {(s.name, "installed") for s in specs}
    assert found.lines() == ["triggers: 5 declared counters, all installed"]
    got = samples(status.prometheus(get_status(conn)))
    assert drift_of(got, specs[0].name) == {
        "installed": 1, "outdated": 0, "missing": 0, "disabled": 0, "broken": 0, "stale": 0,
        "undeclared": 0,
    }  # fmt: skip
    assert got[("pgcounters_triggers_drifted", ())] == 0


def test_every_kind_of_drift_in_text_json_and_prometheus(
    dsn: str,
    conn: Conn,
    specs: list[CounterSpec],
    capsys: pytest.CaptureFixture[str],
) -> None:
    article, user, score, per_day, total = (s.name for s in specs)
    # outdated: the recorded declaration changed, its triggers were not reinstalled
    changed = CounterSpec(
        name=article,
        source=specs[0].source,
        keys=specs[0].keys,
        target=specs[0].target,
        where=Fragment("publish_status IN (%s, %s)", ("public", "Public")),
    )
    triggers.record(conn, changed)
    conn.execute(f'DROP TRIGGER "{trigger_name(user, "delete")}" ON blog_comment')  # missing
    conn.execute(f'ALTER TABLE blog_comment DISABLE TRIGGER "{trigger_name(score, "insert")}"')
    conn.execute("DELETE FROM pgcounters.specs WHERE name = %s", (per_day,))  # undeclared
    expected = {
        article: "outdated",
        user: "missing",
        score: "disabled",
        per_day: "undeclared",
        total: "installed",
    }
    assert {c.counter: c.state for c in section(conn).counters} == expected

    assert cli.run(["--dsn", dsn, "status"]) == 0
    text = capsys.readouterr().out
    assert "triggers: 4 declared counters, 4 drifted" in text
    rows = [line.split() for line in text.splitlines() if line.startswith("  blog.")]
    lines = {row[0]: row[1] for row in rows}
    assert lines[article] == "outdated"
    assert lines[user] == "missing"
    assert lines[score] == "disabled"
    assert lines[per_day] == "undeclared"
    assert total not in lines
    assert "no trigger for delete" in text

    assert cli.run(["--dsn", dsn, "status", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["triggers"]
    assert (report["available"], report["ok"], report["drifted"]) == (True, False, 4)
    assert {c["counter"]: c["state"] for c in report["counters"]} == expected

    assert cli.run(["--dsn", dsn, "status", "--prometheus"]) == 0
    got = samples(capsys.readouterr().out)
    assert got[("pgcounters_triggers_drifted", ())] == 4
    for counter, state in expected.items():
        states = drift_of(got, counter)
        assert states[state] == 1
        assert sum(states.values()) == 1
        assert set(states) == set(status.TRIGGER_STATES)

    # reinstalling the declarations repairs every drift
    triggers.install(conn, [changed, *specs[1:]])
    assert {c.state for c in section(conn).counters} == {"installed"}


def test_an_older_schema_reports_the_section_as_unknown(conn: Conn) -> None:
    found = status.collect_triggers(conn)
    assert found.available
    conn.execute("UPDATE pgcounters.migrations SET version = -version WHERE version >= 2")
    try:
        old = status.collect_triggers(conn)
    finally:
        conn.execute("UPDATE pgcounters.migrations SET version = -version WHERE version <= -2")
    assert not old.available
    assert "not known" in old.lines()[0]
    assert old.as_json() == {"available": False, "ok": True, "drifted": 0, "counters": []}
