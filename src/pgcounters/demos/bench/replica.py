"""Reads on a hot standby: what read-your-writes costs (an LSN wait, or remote_apply).

The scenario starts a primary and a streaming standby of its own (embedded
PostgreSQL, durable settings; the standby is a pg_basebackup of the primary),
whatever server the other scenarios use: a standby of that server cannot be
made from here.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from pgcounters.client import Counters
from pgcounters.config import connect
from pgcounters.connection import Conn
from pgcounters.demos.bench.report import Comparison, Measurement, Scenario
from pgcounters.embedded import EmbeddedPostgres
from pgcounters.schema import install

COUNTER = "bench.replica"
KEYS = 100

VARIANTS = (
    "primary: incr + get",
    "standby: incr + wait for LSN + get",
    "standby: incr (remote_apply) + get",
    "primary: get",
    "standby: get",
)
COMPARISONS: tuple[Comparison, ...] = (
    ("standby: incr + wait for LSN + get", "primary: incr + get", None),
    ("standby: incr (remote_apply) + get", "primary: incr + get", None),
    ("standby: get", "primary: get", None),
)


def _set_sync_standby(admin: Conn, names: str | None) -> None:
    if names is None:
        admin.execute("ALTER SYSTEM RESET synchronous_standby_names")
    else:
        admin.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
    admin.execute("SELECT pg_reload_conf()")
    want = 1 if names else 0
    deadline = time.monotonic() + 30
    while True:
        row = admin.execute(
            "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'"
        ).fetchone()
        if row is not None and row[0] == want:
            return
        if time.monotonic() > deadline:
            raise RuntimeError("the standby did not become synchronous")
        time.sleep(0.01)


def replica_read(dsn: str, repeat: int, quick: bool) -> Scenario:
    ops = 200 if quick else 1000
    scenario = Scenario(
        "replica-read",
        f"A primary and a streaming hot standby on this machine (durable settings). {ops:,} "
        "increments of a queued counter, each read back at once: on the primary; on the standby "
        "after waiting for its replay of the primary's WAL position (Counters.wal_position, "
        "wait_for_replay); on the standby with synchronous_commit = remote_apply (the commit "
        f"returns once the standby has applied it). And {ops:,} exact reads alone on each.",
        unit="operations",
    )
    scenario.headline = ("standby: incr + wait for LSN + get", "primary: incr + get")
    with tempfile.TemporaryDirectory(prefix="pgcounters-bench-replica-") as folder:
        primary = EmbeddedPostgres(Path(folder) / "primary")
        primary.start()
        standby_server: EmbeddedPostgres | None = None
        try:
            with connect(primary.dsn()) as admin:
                install(admin)
                Counters(admin).create_counter(COUNTER, key=int)
            standby_server = primary.create_standby(Path(folder) / "standby")
            standby_server.start()
            with (
                connect(primary.dsn()) as admin,
                connect(primary.dsn()) as writer,
                connect(standby_server.dsn()) as reader,
            ):
                _run(scenario, admin, writer, reader, ops, repeat)
        finally:
            if standby_server is not None:
                standby_server.stop()
            primary.stop()
    scenario.compare(COMPARISONS)
    return scenario


def _run(
    scenario: Scenario,
    admin: Conn,
    writer: Conn,
    reader: Conn,
    ops: int,
    repeat: int,
) -> None:
    on_primary = Counters(writer)
    on_standby = Counters(writer, read_conn=reader)
    truth = [0] * KEYS

    def write_read(pc: Counters, wait: bool) -> Callable[[], bool]:
        def run() -> bool:
            exact = True
            for i in range(ops):
                key = i % KEYS
                pc.incr(COUNTER, key)
                truth[key] += 1
                if wait:
                    pc.wait_for_replay(pc.wal_position(), timeout=30)
                exact &= pc.get(COUNTER, key) == truth[key]
            return exact

        return run

    def read_only(pc: Counters) -> Callable[[], bool]:
        def run() -> bool:
            expected = list(truth)
            return all(pc.get(COUNTER, i % KEYS) == expected[i % KEYS] for i in range(ops))

        return run

    variants: dict[str, Callable[[], bool]] = {
        "primary: incr + get": write_read(on_primary, wait=False),
        "standby: incr + wait for LSN + get": write_read(on_standby, wait=True),
        "standby: incr (remote_apply) + get": write_read(on_standby, wait=False),
        "primary: get": read_only(on_primary),
        "standby: get": read_only(on_standby),
    }
    for _ in range(repeat):
        for variant in VARIANTS:
            remote_apply = "remote_apply" in variant
            if remote_apply:
                _set_sync_standby(admin, "*")
                writer.execute("SET synchronous_commit = remote_apply")
            elif variant == "standby: get":
                # the reads alone: the standby has replayed every increment first
                on_standby.wait_for_replay(on_primary.wal_position(), timeout=30)
            started = time.perf_counter()
            exact = variants[variant]()
            seconds = time.perf_counter() - started
            if remote_apply:
                writer.execute("RESET synchronous_commit")
                _set_sync_standby(admin, None)
            ops_done = 2 * ops if "incr" in variant else ops
            scenario.add(variant, Measurement(seconds, ops_done, exact))
