"""No delta can stop the drain of another: what cannot be applied is set aside in
``pgcounters.quarantine`` with its error, listed, replayed after a fix or discarded."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from pgcounters import Counters
from pgcounters.connection import Conn
from pgcounters.dberrors import translated
from pgcounters.errors import InvalidKey, UnknownCounter
from pgcounters.keys import BIGINT_MAX

ENQUEUE = "INSERT INTO pgcounters.{} (target_id, key, delta) VALUES (%s, %s, %s)"


def quarantined(conn: Conn) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT counter, key, delta, unlogged, sqlstate FROM pgcounters.quarantine ORDER BY id"
    ).fetchall()


@pytest.mark.parametrize("mode", ["queued", "unlogged"])
def test_an_overflowing_counter_is_set_aside_and_the_others_drain(
    conn: Conn, pc: Counters, mode: str
) -> None:
    """incr('a', 1, 2**63-1) twice, then incr('b', 7, 1): the drain used to raise
    CounterOverflow for ever, and b was never stored."""
    pc.create_counter("a", key=int, mode=mode)  # type: ignore[arg-type]
    pc.create_counter("b", key=int, mode=mode)  # type: ignore[arg-type]
    pc.incr("a", 1, BIGINT_MAX)
    pc.incr("a", 1, BIGINT_MAX)
    pc.incr("b", 7, 1)
    result = pc.drain()
    assert (result.deltas, result.quarantined) == (1, 2)
    assert pc.get("b", 7, exact=False) == 1
    unlogged = mode == "unlogged"
    assert quarantined(conn) == [
        ("a", "{1}", BIGINT_MAX, unlogged, "22003"),
        ("a", "{1}", BIGINT_MAX, unlogged, "22003"),
    ]
    assert pc.pending() == (0, 0)
    pc.incr("b", 7, 1)
    assert pc.drain().deltas == 1  # nothing is stuck any more
    assert pc.get("b", 7) == 2


def test_a_column_key_that_does_not_cast_is_set_aside(conn: Conn, pc: Counters) -> None:
    """A key 'abc' for a bigint-keyed column counter used to fail every drain with
    InvalidTextRepresentation."""
    conn.execute(
        "CREATE TABLE article (id bigint PRIMARY KEY, n bigint NOT NULL DEFAULT 0);"
        " INSERT INTO article VALUES (1), (2)"
    )
    col = pc.create_column_counter("col_counter", "article", "n").id
    pc.create_counter("other")
    conn.execute(ENQUEUE.format("queue"), (col, "{abc}", 1))
    conn.execute(ENQUEUE.format("queue"), (col, "{2}", 5))
    pc.incr("other")
    result = pc.drain()
    assert (result.deltas, result.quarantined) == (2, 1)
    assert conn.execute("SELECT id, n FROM article ORDER BY id").fetchall() == [(1, 0), (2, 5)]
    assert pc.get("other") == 1
    assert quarantined(conn) == [("col_counter", "{abc}", 1, False, "22P02")]
    # the SQL entry point now refuses such a key at once
    with pytest.raises(InvalidKey, match="not a valid bigint"), translated():
        conn.execute("SELECT pgcounters.incr('col_counter', ARRAY['abc'], 1)")


def test_malformed_keys_and_unknown_counters_are_set_aside(conn: Conn, pc: Counters) -> None:
    n = pc.create_counter("n", key=int).id
    pc.create_counter("g")
    conn.execute(ENQUEUE.format("queue_unlogged"), (n, "{1", 1))  # not an array
    conn.execute(ENQUEUE.format("queue_unlogged"), (n, "{1,2}", 1))  # two parts, not one
    conn.execute(ENQUEUE.format("queue_unlogged"), (987654, "{}", 4))  # no such counter
    conn.execute(ENQUEUE.format("queue_unlogged"), (n, "{3}", 1))
    pc.incr("g")
    result = pc.drain()
    assert (result.deltas, result.quarantined) == (2, 3)
    assert pc.get("n", 3) == 1
    assert pc.get("g") == 1
    assert sorted(quarantined(conn), key=str) == sorted(
        [
            ("n", "{1", 1, True, "22P02"),
            ("n", "{1,2}", 1, True, "PC004"),
            (None, "{}", 4, True, "PC003"),
        ],
        key=str,
    )


def test_a_fixed_cause_is_replayed_and_a_hopeless_delta_discarded(conn: Conn, pc: Counters) -> None:
    conn.execute(
        "CREATE TABLE article (id bigint PRIMARY KEY, n integer NOT NULL DEFAULT 0);"
        " INSERT INTO article VALUES (1), (2)"
    )
    pc.create_column_counter("article.n", "article", "n")
    pc.incr("article.n", 1, 3_000_000_000)  # too big for the integer column
    pc.incr("article.n", 2, 1)
    assert pc.drain().quarantined == 1
    assert conn.execute("SELECT id, n FROM article ORDER BY id").fetchall() == [(1, 0), (2, 1)]
    # the fix: a bigint column; then the replay applies the delta
    conn.execute("ALTER TABLE article ALTER COLUMN n TYPE bigint")
    assert conn.execute("SELECT pgcounters.replay_quarantined()").fetchone() == (1,)
    assert pc.drain().deltas == 1
    assert conn.execute("SELECT id, n FROM article ORDER BY id").fetchall() == [
        (1, 3_000_000_000),
        (2, 1),
    ]
    conn.execute(ENQUEUE.format("queue"), (424242, "{}", 1))
    assert pc.drain().quarantined == 1
    assert conn.execute("SELECT pgcounters.discard_quarantined(NULL, NULL)").fetchone() == (1,)
    assert quarantined(conn) == []


def test_increments_committed_after_their_counter_was_dropped_and_recreated_are_kept(
    dsn: str, conn: Conn, pc: Counters
) -> None:
    """A transaction wrote to the counter before another program dropped and re-created
    it, and committed after: the deltas used to vanish in the drain. They are set aside
    under the counter's name, and a replay by name sends them to the counter of that
    name now. (A client's later increments reach the new counter at once: see
    test_redeclared_counters.)"""
    pc.create_counter("visits")
    with psycopg.connect(dsn) as other:
        in_flight = Counters(other)
        for _ in range(5):
            in_flight.incr("visits")
        pc.drop_counter("visits")  # waits for nothing: the queued rows are not locked
        pc.create_counter("visits")
        other.commit()
    pc.incr("visits", None, 7)
    result = pc.drain()
    assert (result.deltas, result.quarantined) == (1, 5)
    assert [row[:3] for row in quarantined(conn)] == [("visits", "{}", 1)] * 5
    assert conn.execute("SELECT pgcounters.replay_quarantined(NULL, 'visits')").fetchone() == (5,)
    pc.drain()
    assert pc.get("visits") == 12


def test_a_dropped_counters_deltas_stay_set_aside_until_it_is_declared_again(
    dsn: str, conn: Conn, pc: Counters, capsys: pytest.CaptureFixture[str]
) -> None:
    """Replayed before the counter was declared again, they went back to the queue, the
    replay said so, and the next drain set them aside again: they stay set aside."""
    from pgcounters import cli

    pc.create_counter("g2", key=int)
    with psycopg.connect(dsn) as other:
        in_flight = Counters(other)
        in_flight.incr("g2", 1, 4)
        pc.drop_counter("g2")
        other.commit()  # committed after the drop
    assert pc.drain().quarantined == 1
    code = cli.run(["--dsn", dsn, "quarantine", "replay", "--counter", "g2"])
    out = capsys.readouterr().out
    assert code == cli.EXIT_ERROR
    assert "0 deltas moved back into their queues (the deltas of a dropped counter" in out
    assert [row[:3] for row in quarantined(conn)] == [("g2", "{1}", 4)]
    assert conn.execute("SELECT count(*) FROM pgcounters.queue").fetchone() == (0,)
    pc.create_counter("g2", key=int)
    assert cli.run(["--dsn", dsn, "quarantine", "replay", "--counter", "g2"]) == cli.EXIT_OK
    assert quarantined(conn) == []
    pc.drain()
    assert pc.get("g2", 1) == 4


def test_a_long_lived_clients_reads_follow_a_dropped_and_recreated_counter(
    dsn: str, conn: Conn, pc: Counters
) -> None:
    """A client that cached a counter's id read the dropped counter's leftovers (0, or
    its own increments still queued for the old id) instead of the counter of that name:
    its reads now find the counter again, or are told it is gone, as a new client's."""
    pc.create_counter("g2", key=int)
    pc.create_counter("n", key=int)
    conn.execute("CREATE TABLE post (id bigint PRIMARY KEY, hits bigint NOT NULL DEFAULT 0)")
    conn.execute("INSERT INTO post VALUES (1)")
    pc.create_column_counter("post.hits", "post", "hits")
    with psycopg.connect(dsn, autocommit=True) as other:
        old = Counters(other)
        old.incr("g2", 1, 1)  # caches the ids
        old.incr("post.hits", 1, 2)
        assert (old.get("g2", 1), old.get("post.hits", 1), old.get("n", 1)) == (1, 2, 0)
        assert old.top("g2", 3) == []
        pc.drop_counter("g2")
        pc.drop_counter("n")
        pc.drop_counter("post.hits")
        for read in (
            lambda: old.get("g2", 1),
            lambda: old.get("g2", 1, exact=False),
            lambda: old.get_many("g2", [1, 2]),
            lambda: old.get_many("n", [1], exact=False),
            lambda: old.top("g2", 3),
            lambda: old.get("post.hits", 1),
        ):
            with pytest.raises(UnknownCounter):
                read()
        pc.create_counter("g2", key=int)
        pc.create_counter("n", key=int)
        old.incr("g2", 1, 0)  # caches the new id
        pc.drop_counter("g2")
        pc.create_counter("g2", key=int)
        pc.incr("g2", 1, 100)
        old.get_many("n", [1])  # caches n's new id
        pc.drop_counter("n")
        pc.create_counter("n", key=int)
        pc.incr("n", 1, 7)
        assert old.get("g2", 1) == 100
        assert old.get_many("n", [1, 2]) == [7, 0]
        pc.drain()
        old.incr("g2", 2, 0)
        pc.drop_counter("g2")
        pc.create_counter("g2", key=int)
        pc.incr("g2", 5, 9)
        pc.drain()
        assert old.top("g2", 3) == [((5,), 9)]
        assert old.get("g2", 5, exact=False) == 9
        # a direct counter: its increments are told the counter is gone (they were told
        # the role lacked a right), then reach the counter created again under that name
        pc.create_counter("d", key=int, mode="direct")
        assert old.incr("d", 1) == 1
        pc.drop_counter("d")
        with pytest.raises(UnknownCounter):
            old.incr("d", 1)
        pc.create_counter("d", key=int, mode="direct")
        assert old.incr("d", 1) == 1
        pc.drop_counter("d")
        pc.create_counter("d", key=int, mode="direct")
        assert old.incr("d", 1, 4) == 4
        assert pc.get("d", 1) == 4
        # created again with other key parts: the key the cached declaration refuses is
        # the new counter's (it raised InvalidKey until the process restarted)
        pc.create_counter("t", key=int)
        old.incr("t", 1, 10)
        assert old.get("t", 1) == 10
        pc.drop_counter("t")
        pc.create_counter("t", key=str)
        pc.incr("t", "x", 6)
        assert old.get("t", "x") == 6
        pc.drop_counter("t")
        pc.create_counter("t", key=str)
        assert old.get_many("t", ["x", "y"]) == [0, 0]
        pc.drop_counter("t")
        pc.create_counter("t", key=(int, int))
        old.incr("t", (1, 2), 2)  # a queued increment, through the hot path's refusal
        assert pc.get("t", (1, 2)) == 2
        with pytest.raises(InvalidKey):  # a key the live counter refuses is refused
            old.get("t", ("a", "b"))


def test_status_prometheus_and_the_cli_show_list_replay_and_discard(
    dsn: str, conn: Conn, pc: Counters, capsys: pytest.CaptureFixture[str]
) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from pgcounters import cli, status

    conn.execute(
        "CREATE TABLE article (id bigint PRIMARY KEY, n integer NOT NULL DEFAULT 0);"
        " INSERT INTO article VALUES (1)"
    )
    pc.create_column_counter("article.n", "article", "n")
    pc.incr("article.n", 1, 3_000_000_000)
    pc.incr("article.n", 1, 4_000_000_000)
    conn.execute(ENQUEUE.format("queue"), (424242, "{}", 1))
    pc.drain()
    snapshot = status.get_status(conn)
    text = status.text(snapshot)
    assert "quarantine: 3 deltas set aside" in text
    assert "article.n  2 deltas  [22003]" in text
    families = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(status.prometheus(snapshot))
        for s in f.samples
    }
    assert (
        families[
            ("pgcounters_quarantined_deltas", (("counter", "article.n"), ("sqlstate", "22003")))
        ]
        == 2
    )
    assert families[("pgcounters_quarantined_deltas_total", (("queue", "logged"),))] == 3
    as_json = json.loads(status.to_json(snapshot))
    assert as_json["reliability"]["quarantined_deltas"] == 3

    assert cli.run(["--dsn", dsn, "quarantine", "list"]) == cli.EXIT_OK
    listed = capsys.readouterr().out.splitlines()
    assert len(listed) == 3
    assert "article.n  key {1}  delta 3000000000" in listed[0]
    assert "#424242" in listed[2]
    assert cli.run(["--dsn", dsn, "quarantine", "list", "--json", "--counter", "article.n"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["delta"] for r in rows] == [3_000_000_000, 4_000_000_000]
    # usage: replay needs a choice
    with pytest.raises(SystemExit) as usage:
        cli.run(["--dsn", dsn, "quarantine", "replay"])
    assert usage.value.code == 2
    conn.execute("ALTER TABLE article ALTER COLUMN n TYPE bigint")
    assert cli.run(["--dsn", dsn, "quarantine", "replay", "--counter", "article.n"]) == 0
    assert "2 deltas moved back" in capsys.readouterr().out
    assert pc.drain().deltas == 2
    assert conn.execute("SELECT n FROM article").fetchone() == (7_000_000_000,)
    ident = conn.execute("SELECT id FROM pgcounters.quarantine").fetchone()
    assert ident is not None
    assert cli.run(["--dsn", dsn, "quarantine", "discard", "--id", str(ident[0])]) == 0
    assert cli.run(["--dsn", dsn, "quarantine", "discard", "--all"]) == cli.EXIT_ERROR
    assert "0 deltas discarded" in capsys.readouterr().out
    assert "quarantine: empty" in status.text(status.get_status(conn))
