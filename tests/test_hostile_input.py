"""Hostile input, fuzzed with hypothesis over the public API.

Names, keys and quota subjects with quotes, semicolons, backslashes, NUL
bytes, lone surrogates, very long strings and non-ASCII text; identifiers at
PostgreSQL's 63-byte limit. Every input either works, and reads back as
written, or raises a PgCountersError subclass, leaving nothing behind.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

import truth
from pgcounters import Counters, triggers
from pgcounters.cli import run
from pgcounters.connection import Conn
from pgcounters.errors import PgCountersError
from pgcounters.keys import NAME_RE
from pgcounters.quotas import Quotas
from pgcounters.repair import recount, verify
from pgcounters.specs import ColumnTarget, CounterSpec, Fragment, NamedTarget, Table
from support import set_clock

FUZZ = settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

NASTY = [*"'\";\\{},()$%_.:/- \t\n\r", "\x00", "é", "中", "🎉", "\u202e", "\ud800"]
characters = st.one_of(st.sampled_from(NASTY), st.characters())
LONG = ["NULL", "x" * 199, "x" * 200, "x" * 201, "é" * 1000, "'" * 1000, "x" * 1001, ";" * 5000]
texts = st.one_of(
    st.text(alphabet=characters, max_size=30),
    st.sampled_from(LONG),
    st.from_regex(NAME_RE, fullmatch=True),
)


def _state(conn: Conn) -> tuple[Any, ...]:
    return tuple(
        conn.execute(s).fetchall()
        for s in (
            "SELECT id, name, key_types, mode FROM pgcounters.targets ORDER BY id",
            "SELECT target_id, key, delta FROM pgcounters.queue ORDER BY id",
            "SELECT target_id, key, delta FROM pgcounters.queue_unlogged ORDER BY id",
            "SELECT target_id, key, value FROM pgcounters.counters ORDER BY 1, 2",
            "SELECT id, name, default_limit FROM pgcounters.quotas ORDER BY id",
            "SELECT quota_id, subject, calls FROM pgcounters.quota_limits ORDER BY id",
            "SELECT quota_id, subject, used, attempts FROM pgcounters.quota_usage ORDER BY 1, 2",
        )
    )


@contextlib.contextmanager
def refused_leaves_nothing(conn: Conn) -> Iterator[list[bool]]:
    """Yields a list that holds True if the body raised a PgCountersError (then the
    database must be as before); any other exception fails the test."""
    before = _state(conn)
    outcome: list[bool] = []
    try:
        yield outcome
        outcome.append(False)
    except PgCountersError as exc:
        message = str(exc)
        outcome.append(True)
        assert message, "an error needs a message"
        assert _state(conn) == before


@FUZZ
@given(name=texts, mode=st.sampled_from(["queued", "unlogged", "direct"]))
def test_counter_names(conn: Conn, name: str, mode: Any) -> None:
    pc = Counters(conn)
    with refused_leaves_nothing(conn) as refused:
        created = pc.create_counter(name, str, mode=mode)
    if refused[0]:
        return
    assert created.name == name
    assert name in [c.name for c in pc.counters()]
    pc.incr(name, name[:1000].replace("\x00", "") or "k", 3)
    assert pc.drop_counter(name) is True
    with refused_leaves_nothing(conn) as refused:
        pc.counter(name)
    assert refused == [True]


@FUZZ
@given(
    parts=st.lists(texts, min_size=1, max_size=3),
    delta=st.integers(min_value=-(2**63), max_value=2**63 - 1),
    mode=st.sampled_from(["queued", "unlogged", "direct"]),
    definer=st.booleans(),
)
def test_text_keys_round_trip(
    conn: Conn, parts: list[str], delta: int, mode: Any, definer: bool
) -> None:
    pc = Counters(conn)
    # direct counters: the plain upsert of a privileged role, or the SECURITY DEFINER
    # function a least-privilege role goes through
    pc._direct_writes = not definer
    name = f"k{len(parts)}.{mode}"
    pc.drop_counter(name)  # each example starts from zero
    pc.create_counter(name, ["text"] * len(parts), mode=mode)
    key: Any = tuple(parts) if len(parts) > 1 else parts[0]
    before = pc.get_many(name, [key]) if _encodable(parts) else None
    with refused_leaves_nothing(conn) as refused:
        pc.incr(name, key, delta)
    if refused[0]:
        with refused_leaves_nothing(conn) as again:
            pc.incr_many([(name, key, 1)])
        assert again == [True]
        return
    assert before is not None
    assert pc.get(name, key) == before[0] + delta
    pc.drain()
    assert pc.get(name, key, exact=False) == before[0] + delta
    ranked = dict(pc.top(name, 10_000))
    if before[0] + delta != 0 or mode == "direct":
        assert ranked[tuple(parts)] == before[0] + delta
    step = -1 if delta > 0 else 1  # stays within the bigint range
    pc.incr_many([(name, key, step), (name, key, step)])
    assert pc.get_many(name, [key, key]) == [delta + 2 * step] * 2


def _encodable(parts: list[str]) -> bool:
    return all(
        "\x00" not in p and len(p) <= 1000 and not any(0xD800 <= ord(ch) <= 0xDFFF for ch in p)
        for p in parts
    )


@pytest.mark.parametrize("bad", ["a\x00b", "\ud800", "x" * 1001])
def test_each_api_refuses_unstorable_text(conn: Conn, bad: str) -> None:
    pc = Counters(conn)
    pc.create_counter("t", str)
    quotas = Quotas(conn)
    quotas.define_quota("api", 10)
    calls: list[Callable[[], object]] = [
        lambda: pc.incr("t", bad),
        lambda: pc.get("t", bad),
        lambda: pc.get_many("t", ["ok", bad]),
        lambda: pc.incr_many([("t", "ok", 1), ("t", bad, 1)]),
        lambda: pc.create_counter(bad),
        lambda: pc.drop_counter(bad),
        lambda: quotas.register_call("api", bad),
        lambda: quotas.register_call(bad, "s"),
        lambda: quotas.set_limit("api", bad, 5),
        lambda: quotas.status("api", bad),
        lambda: quotas.define_quota(bad, 5),
        lambda: pc.create_column_counter("c", bad, "n"),
    ]
    for call in calls:
        with refused_leaves_nothing(conn) as refused:
            call()
        assert refused == [True], call


@FUZZ
@given(quota=texts, subject=texts, cost=st.integers(min_value=-2, max_value=3))
def test_quota_names_and_subjects(conn: Conn, quota: str, subject: str, cost: int) -> None:
    quotas = Quotas(conn)
    for earlier in quotas.quotas():  # nothing of an earlier example is left
        quotas.drop_quota(earlier.name)
    set_clock(conn, dt.datetime(2026, 3, 10, 12, 0, tzinfo=dt.UTC))  # one window for all
    with refused_leaves_nothing(conn) as refused:
        quotas.define_quota(quota, 100)
    if refused[0]:
        quota = "fallback"
        quotas.define_quota(quota, 100)
    with refused_leaves_nothing(conn) as refused:
        quotas.set_limit(quota, subject, 5)
    limited = not refused[0]
    before = quotas.status(quota, subject).used if limited else 0
    assert before == 0  # a new quota: no call yet
    with refused_leaves_nothing(conn) as refused:
        result = quotas.register_call(quota, subject, cost)
    if refused[0]:
        assert not limited or cost <= 0
        return
    assert limited, "a subject refused by set_limit must be refused by register_call too"
    assert result.used == before + (cost if before + cost <= 5 else 0)
    assert quotas.status(quota, subject).used == result.used
    assert subject in {w.subject for w in quotas.report(quota, subject=subject)}
    quotas.remove_limits(quota, subject)
    assert quotas.drop_quota(quota) is True


@FUZZ
@given(identifier=texts, column=texts)
def test_spec_identifiers(identifier: str, column: str) -> None:
    try:
        spec = CounterSpec(
            name="fuzz.spec",
            source=Table(identifier, "public"),
            keys=(column,),
            target=ColumnTarget(Table(identifier), column),
        )
    except PgCountersError as exc:
        message = str(exc)
        assert message
        return
    assert spec.source.name == identifier
    assert len(identifier.encode()) <= 63
    assert "\x00" not in identifier
    assert CounterSpec.from_json(spec.to_json()) == spec


@pytest.mark.parametrize(
    "table",
    [
        "é" * 31 + "a",  # 63 bytes: the limit, multi-byte
        'a"b; DROP TABLE x; --',
        "Ünïcödé tablé",
        "back\\slash",
        "x" * 63,
    ],
)
def test_declared_counter_on_identifiers_that_need_quoting(conn: Conn, table: str) -> None:
    assert len(table.encode()) <= 63
    child = table[:-1] + "c"
    column = "cnt" + table[3:]
    conn.execute(
        sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, {} bigint NOT NULL DEFAULT 0)").format(
            sql.Identifier(table), sql.Identifier(column)
        )
    )
    conn.execute(
        sql.SQL("CREATE TABLE {} (id bigserial PRIMARY KEY, {} bigint, kind text)").format(
            sql.Identifier(child), sql.Identifier(table)
        )
    )
    conn.execute(sql.SQL("INSERT INTO {} (id) VALUES (1), (2)").format(sql.Identifier(table)))
    specs = [
        CounterSpec(
            name="fuzz.parent",
            source=child,
            keys=(table,),
            target=ColumnTarget(table, column),
            where=Fragment("kind = %s", ("it's; \\ ok",)),
        ),
        CounterSpec(name="fuzz.named", source=child, keys=("kind",), target=NamedTarget(("text",))),
    ]
    triggers.install(conn, specs)
    conn.execute(
        sql.SQL("INSERT INTO {} ({}, kind) VALUES (1, %s), (2, %s), (1, %s)").format(
            sql.Identifier(child), sql.Identifier(table)
        ),
        ("it's; \\ ok", "other", "it's; \\ ok"),
    )
    pc = Counters(conn)
    child_id, parent_key = sql.Identifier(child), sql.Identifier(table)
    truth.assert_drained(
        conn,
        [
            truth.from_sql(
                "fuzz.parent",
                sql.SQL(
                    "SELECT {k}, count(*) FROM {c} WHERE kind = %s AND {k} IS NOT NULL GROUP BY {k}"
                ).format(k=parent_key, c=child_id),
                ("it's; \\ ok",),
                stored=sql.SQL("SELECT id, {} FROM {}").format(
                    sql.Identifier(column), sql.Identifier(table)
                ),
            ),
            truth.from_sql(
                "fuzz.named",
                sql.SQL(
                    "SELECT kind, count(*) FROM {} WHERE kind IS NOT NULL GROUP BY kind"
                ).format(child_id),
            ),
        ],
    )
    for spec in specs:
        assert verify(conn, spec).mismatches == []
    assert pc.get("fuzz.parent", 1) == 2
    assert pc.get("fuzz.named", "it's; \\ ok") == 2
    # a column counter declared by hand on the same table, through the client
    pc.create_column_counter("fuzz.column", ("public", table), column, mode="direct")
    assert pc.incr("fuzz.column", 2, 5) == 5
    quoted = sql.Identifier(table).as_string(conn)
    assert pc.create_column_counter("fuzz.column", quoted, column, mode="direct").table == table
    assert pc.get("fuzz.column", 2) == 5


@FUZZ
@given(table=st.one_of(texts, st.tuples(texts, texts)), column=texts)
def test_column_counter_tables(conn: Conn, table: Any, column: str) -> None:
    conn.execute("CREATE TABLE IF NOT EXISTS parent (id bigint PRIMARY KEY, n bigint)")
    pc = Counters(conn)
    with refused_leaves_nothing(conn) as refused:
        found = pc.create_column_counter("fuzz.col", table, column)
    if not refused[0]:
        assert (found.table, found.column) == ("parent", "n")
        pc.drop_counter("fuzz.col")


@FUZZ
@given(
    verb=st.sampled_from(["create", "incr", "get", "drop", "top"]),
    name=texts,
    key=st.one_of(st.none(), texts),
    extra=st.lists(texts, max_size=2),
)
def test_cli_arguments(dsn: str, verb: str, name: str, key: str | None, extra: list[str]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:  # nothing of an earlier example is left
        pc = Counters(conn)
        for counter in pc.counters():
            pc.drop_counter(counter.name)
    argv = ["--dsn", dsn, verb, name]
    if key is not None and verb in ("incr", "get"):
        argv.append(key)
    argv += extra
    try:
        code = run(argv)
    except SystemExit as exc:  # argparse: usage error
        usage = exc.code
        assert usage == 2
        return
    assert code in (0, 1)


@FUZZ
@given(subject=texts, quota=texts)
def test_cli_quota_call(dsn: str, subject: str, quota: str) -> None:
    try:
        code = run(["--dsn", dsn, "quota", "call", quota, subject])
    except SystemExit as exc:
        usage = exc.code
        assert usage == 2
        return
    assert code in (1, 4)  # an unknown quota (1) or a refused call (4): never a traceback


@FUZZ
@given(
    n=st.one_of(
        st.integers(min_value=-(2**80), max_value=2**80),
        st.floats(allow_nan=True),
        st.text(max_size=5),
        st.none(),
        st.booleans(),
    )
)
def test_top_and_drain_sizes(conn: Conn, n: Any) -> None:
    pc = Counters(conn)
    pc.drop_counter("t")
    pc.create_counter("t", int)
    pc.incr("t", 1, 2)
    pc.drain()
    pc.incr("t", 1, 3)  # pending
    with refused_leaves_nothing(conn) as refused:
        ranked = pc.top("t", n)
    if not refused[0]:
        assert ranked == ([] if n == 0 else [((1,), 2)])
    with refused_leaves_nothing(conn) as refused:
        pc.drain_batch(n)
    if not refused[0]:
        assert pc.pending() == (0, 0)
        assert pc.get("t", 1, exact=False) == 5
    quotas = Quotas(conn)
    quotas.define_quota("api", 5)
    quotas.register_call("api", "s")
    with refused_leaves_nothing(conn) as refused:
        windows = quotas.report("api", limit=n)
    if not refused[0]:
        assert len(windows) == (0 if n == 0 else 1)
    valid_batch = isinstance(n, int) and not isinstance(n, bool) and 0 < n < 2**31
    if not valid_batch:
        with pytest.raises(PgCountersError, match="batch size"):
            recount(conn, "no.such.counter", batch_size=n)
