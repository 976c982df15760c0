"""Property-based: random sequences of increments, batches, rollbacks and drains vs a model."""

from __future__ import annotations

import datetime as dt
from collections import Counter as Tally
from typing import Any

import psycopg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgcounters import Counters, Mode
from pgcounters.keys import KeyType, decode_key, encode_key

NAMES = ("q", "u", "d")  # queued, unlogged, direct
keys = st.integers(min_value=-3, max_value=3)
deltas = st.integers(min_value=-(2**40), max_value=2**40)
incr = st.tuples(st.just("incr"), st.sampled_from(NAMES), keys, deltas)
many = st.tuples(
    st.just("many"), st.lists(st.tuples(st.sampled_from(NAMES), keys, deltas), max_size=8)
)
rollback = st.tuples(st.just("rollback"), st.lists(st.tuples(st.sampled_from(NAMES), keys, deltas)))
drain = st.tuples(st.just("drain"), st.integers(min_value=1, max_value=5))
ops = st.lists(st.one_of(incr, many, rollback, drain), max_size=25)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=ops)
def test_values_match_a_model(dsn: str, ops: list[Any]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        pc = Counters(conn)
        modes: tuple[Mode, ...] = ("queued", "unlogged", "direct")
        for name, mode in zip(NAMES, modes, strict=True):
            pc.drop_counter(name)
            pc.create_counter(name, int, mode=mode)
        # nothing of an earlier example is left: no delta queued, every value zero
        assert pc.pending() == (0, 0)
        for name in NAMES:
            assert pc.get_many(name, range(-3, 4)) == [0] * 7
        model: Tally[tuple[str, int]] = Tally()
        for op in ops:
            if op[0] == "incr":
                _, name, key, delta = op
                pc.incr(name, key, delta)
                model[(name, key)] += delta
            elif op[0] == "many":
                pc.incr_many(op[1])
                for name, key, delta in op[1]:
                    model[(name, key)] += delta
            elif op[0] == "rollback":
                with psycopg.connect(dsn) as other:
                    oc = Counters(other)
                    for name, key, delta in op[1]:
                        oc.incr(name, key, delta)
                    other.rollback()
            else:
                pc.drain(batch_size=op[1])
            for name in NAMES:
                expected = [model[(name, k)] for k in range(-3, 4)]
                assert pc.get_many(name, range(-3, 4)) == expected
        pc.drain()
        for name in NAMES:
            assert pc.get_many(name, range(-3, 4), exact=False) == [
                model[(name, k)] for k in range(-3, 4)
            ]


key_parts = st.tuples(
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.uuids(),
    st.text(max_size=50).filter(lambda s: "\x00" not in s),
    st.dates(),
)


@given(parts=key_parts)
def test_keys_round_trip(parts: tuple[int, Any, str, dt.date]) -> None:
    types: tuple[KeyType, ...] = ("bigint", "uuid", "text", "date")
    encoded = encode_key(parts, types, "k")
    assert decode_key(encoded, types) == parts
