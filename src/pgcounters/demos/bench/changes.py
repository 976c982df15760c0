"""What change notifications cost the drain.

``drain-changes``: N deltas of 1 (200k; 50k with ``--quick``) are queued over K
distinct keys of a named counter (not timed), then drained to the end in batches
of 10k, one transaction each (timed), as a worker drains. Variants, interleaved,
each on the same queue contents:

* ``drain``: nobody listens (:meth:`Counters.drain_queue_batch`);
* ``drain+changes``: each batch also returns the keys it changed, and after its
  commit a callback gets them and one ``NOTIFY`` carries them (what a worker with
  ``on_change`` and ``notify`` does, with no rate limit: the dearest case), at most
  ``notify_max_keys`` (1000, the default) keys of a counter listed: a batch that
  changed more reports the counter as "many keys";
* ``drain+all keys``: the same with every key listed, however many (no cap).

Every run checks every total, and that the changes reported name every key (or, for
a batch above the cap, the counter).
"""

from __future__ import annotations

import time

from pgcounters.client import Counters
from pgcounters.config import connect
from pgcounters.connection import Conn
from pgcounters.demos.bench.report import Comparison, Measurement, Scenario
from pgcounters.keys import Key
from pgcounters.notifications import MAX_KEYS, Changes, Notifier
from pgcounters.schema import install

BATCH = 10_000
VARIANTS = ("drain", "drain+changes", "drain+all keys")
COUNTER = "bench.changes"


def _size(quick: bool) -> tuple[int, tuple[int, ...]]:
    return (50_000, (10, 10_000)) if quick else (200_000, (10, 10_000, 100_000))


def _label(keys: int) -> str:
    return f"{keys // 1000}k keys" if keys >= 1000 else f"{keys} keys"


def _fill(conn: Conn, n: int, keys: int) -> None:
    pc = Counters(conn)
    pc.drop_counter(COUNTER)
    target = pc.create_counter(COUNTER, key=int).id
    conn.execute("TRUNCATE pgcounters.queue")
    conn.execute(
        "INSERT INTO pgcounters.queue (target_id, key, delta)"
        " SELECT %s, ARRAY[(g %% %s)::text], 1 FROM generate_series(1, %s) AS g",
        (target, keys, n),
    )
    conn.execute("VACUUM ANALYZE pgcounters.queue, pgcounters.counters")


def _drain(conn: Conn, variant: str, seen: set[Key], many: list[int]) -> int:
    """Drain to the end as a worker does; returns the batches. ``many`` gets one item a
    batch that reported the counter without its keys."""
    pc = Counters(conn, check_schema=False)

    def collect(changes: Changes) -> None:
        if COUNTER in changes:
            keys = changes[COUNTER]
            if keys is None:
                many.append(1)
            else:
                seen.update(keys)

    max_keys = None if variant == "drain+all keys" else MAX_KEYS
    notifier = Notifier(collect, notify=True, interval=0, max_keys=max_keys)
    changes = variant != "drain"
    batches = 0
    while True:
        batch = pc.drain_queue_batch(BATCH, changes=changes, max_keys=max_keys)
        if batch.done:
            return batches
        batches += 1
        if batch.changes:
            notifier.committed(conn, batch.changes)


def drain_changes(dsn: str, repeat: int, quick: bool) -> Scenario:
    n, key_counts = _size(quick)
    scenario = Scenario(
        "drain-changes",
        f"Drain {n:,} queued deltas over K keys in batches of {BATCH:,}, with and without "
        "reporting each batch's changed keys (a callback and one NOTIFY per batch). "
        "Target: reporting costs less than 5% of the drain's throughput.",
        unit="deltas",
    )
    with connect(dsn) as conn:
        install(conn)
        for keys in key_counts:
            for _ in range(repeat):
                for variant in VARIANTS:
                    _fill(conn, n, keys)
                    seen: set[Key] = set()
                    many: list[int] = []
                    started = time.perf_counter()
                    batches = _drain(conn, variant, seen, many)
                    seconds = time.perf_counter() - started
                    values = Counters(conn).get_many(COUNTER, range(keys), exact=False)
                    exact = values == [n // keys] * keys
                    if variant != "drain":
                        every = {(k,) for k in range(keys)}
                        # every key named, or the counter reported as many keys
                        exact = exact and (seen == every or (bool(many) and seen <= every))
                        if variant == "drain+all keys":
                            exact = exact and not many
                    scenario.add(
                        f"{variant} {_label(keys)}",
                        Measurement(seconds, n, exact, {"batches": float(batches)}),
                    )
        Counters(conn).drop_counter(COUNTER)
    comparisons: list[Comparison] = [
        (f"drain+changes {_label(k)}", f"drain {_label(k)}", 0.95) for k in key_counts
    ] + [(f"drain+all keys {_label(k)}", f"drain {_label(k)}", None) for k in key_counts]
    scenario.compare(comparisons)
    scenario.headline = (
        f"drain+changes {_label(key_counts[-1])}",
        f"drain {_label(key_counts[-1])}",
    )
    return scenario
