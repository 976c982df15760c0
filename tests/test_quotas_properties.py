"""Property-based: random calls (subjects, costs, instants) against a model of the quota."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import psycopg
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pgcounters import Quotas

T0 = dt.datetime(2026, 3, 10, 12, 0, tzinfo=dt.UTC)  # a multiple of the window
WINDOW = 60
GOLD_FROM, GOLD_UNTIL, GOLD_LIMIT = (
    T0 + dt.timedelta(seconds=100),
    T0 + dt.timedelta(seconds=200),
    9,
)

calls = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "gold"]),
        st.integers(min_value=1, max_value=4),
        st.integers(min_value=0, max_value=299),
    ),
    max_size=40,
)


@dataclass
class Usage:
    used: int = 0
    attempts: int = 0
    rejected: int = 0


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(default_limit=st.integers(min_value=1, max_value=6), calls=calls)
# the gold limit ends within a window: the default limit, lower, applies to the next call
@example(default_limit=1, calls=[("gold", 2, 180), ("gold", 1, 200)])
def test_decisions_match_a_model(
    dsn: str, default_limit: int, calls: list[tuple[str, int, int]]
) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        quotas = Quotas(conn)
        quotas.drop_quota("q")
        quotas.define_quota("q", default_limit, window=WINDOW)
        quotas.set_limit("q", "gold", GOLD_LIMIT, valid_from=GOLD_FROM, valid_until=GOLD_UNTIL)
        model: dict[tuple[str, int], Usage] = {}
        for subject, cost, offset in calls:
            when = T0 + dt.timedelta(seconds=offset)
            limit = (
                GOLD_LIMIT
                if subject == "gold" and GOLD_FROM <= when < GOLD_UNTIL
                else default_limit
            )
            usage = model.setdefault((subject, offset // WINDOW), Usage())
            allowed = usage.used + cost <= limit
            usage.attempts += 1
            if allowed:
                usage.used += cost
            else:
                usage.rejected += 1
            result = quotas.register_call("q", subject, cost, at=when)
            assert (result.allowed, result.used, result.attempts, result.limit) == (
                allowed,
                usage.used,
                usage.attempts,
                limit,
            )
            # a granted call never takes the window over the limit in force; a limit lowered
            # within a window may leave earlier grants above it
            assert not result.allowed or result.used <= result.limit
            start = T0 + dt.timedelta(seconds=offset // WINDOW * WINDOW)
            assert (result.window_start, result.window_end) == (
                start,
                start + dt.timedelta(seconds=WINDOW),
            )
            assert result.retry_after == (result.window_end - when).total_seconds()
        report = {
            (r.subject, int((r.window_start - T0).total_seconds()) // WINDOW): (
                r.used,
                r.attempts,
                r.rejected,
            )
            for r in quotas.report("q")
        }
        assert report == {k: (u.used, u.attempts, u.rejected) for k, u in model.items()}
