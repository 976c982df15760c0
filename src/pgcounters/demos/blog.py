"""The blog under a concurrent mixed load: the second half of ``pgcounters demo``.

The reference blog (public comments per article and per user, unread
notifications per user, a global number of users) in plain SQL, its
counters declared with :class:`~pgcounters.specs.CounterSpec` and installed as
statement-level triggers. Then, for a while, at the same time:

* comment writers add (one row or many), move, publish, unpublish and delete
  comments, in single-row and bulk statements;
* a user writer adds users (one or many) and deletes some;
* a notification writer creates (one or many) and deletes notifications,
  while two threads race to mark the same notification read at the same moment;
* quota threads call a quota with a small limit;
* a :class:`~pgcounters.worker.Worker` drains in a thread;
* halfway, a counter is broken by hand and every counter is recounted.

Then everything stops, the queues are drained, and every counter is compared
with the truth (the subquery, :func:`pgcounters.verify`), and the
quota's usage with its limit.
"""

from __future__ import annotations

import collections
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pgcounters import triggers
from pgcounters.client import Counters
from pgcounters.config import connect
from pgcounters.connection import Conn
from pgcounters.demos import sqlfiles
from pgcounters.quotas import Quotas
from pgcounters.repair import recount, verify
from pgcounters.schema import install
from pgcounters.specs import ColumnTarget, CounterSpec, Fragment, NamedTarget, Table
from pgcounters.worker import Worker, WorkerSettings

SCHEMA = "demo_blog"
QUOTA = "demo.api"
TAMPER_BY = 7


def specs() -> list[CounterSpec]:
    """The demo's counters: three counter columns and a global named counter."""
    public = Fragment("publish_status = %s", ("public",))
    return [
        CounterSpec(
            name="demo.article.public_comments",
            source=Table("comments", SCHEMA),
            keys="article_id",
            target=ColumnTarget(Table("articles", SCHEMA), "public_comments"),
            where=public,
        ),
        CounterSpec(
            name="demo.user.public_comments",
            source=Table("comments", SCHEMA),
            keys="creator_id",
            target=ColumnTarget(Table("users", SCHEMA), "public_comments"),
            where=public,
        ),
        # applied in the writing transaction: a user sees their badge change at once
        CounterSpec(
            name="demo.user.unread_notifications",
            source=Table("notifications", SCHEMA),
            keys="user_id",
            target=ColumnTarget(Table("users", SCHEMA), "unread_notifications"),
            where=Fragment("NOT is_read"),
            mode="direct",
        ),
        CounterSpec(
            name="demo.users.total",
            source=Table("users", SCHEMA),
            target=NamedTarget(()),
        ),
    ]


@dataclass(frozen=True)
class Sizes:
    """How big the blog is and how many threads load it."""

    users: int = 200
    articles: int = 50
    comments: int = 5000
    comment_writers: int = 3
    quota_threads: int = 3
    quota_subjects: int = 3
    quota_limit: int = 4000
    pause: float = 0.0
    """Seconds each writer sleeps between operations (0: as fast as it can)."""


@dataclass(frozen=True)
class CounterCheck:
    """One counter compared with the truth after the load."""

    name: str
    mode: str
    keys_checked: int
    mismatches: int

    @property
    def exact(self) -> bool:
        return self.mismatches == 0


@dataclass
class BlogDemoResult:
    """What the mixed load did, and whether everything came out exact."""

    seconds: float = 0.0
    ops: collections.Counter[str] = field(default_factory=collections.Counter)
    errors: list[str] = field(default_factory=list)
    deltas_by_worker: int = 0
    deltas_final_drain: int = 0
    recount_seconds: float = 0.0
    recount_keys: int = 0
    recount_fixed: int = 0
    counters: list[CounterCheck] = field(default_factory=list)
    quota_calls: int = 0
    quota_allowed: int = 0
    quota_limit: int = 0
    quota_highest_use: int = 0
    quota_over_limit: list[str] = field(default_factory=list)
    races: int = 0
    race_flips: collections.Counter[int] = field(default_factory=collections.Counter)

    @property
    def operations(self) -> int:
        return sum(self.ops.values())

    @property
    def counters_exact(self) -> bool:
        return bool(self.counters) and all(c.exact for c in self.counters)

    @property
    def quota_ok(self) -> bool:
        return not self.quota_over_limit

    @property
    def races_ok(self) -> bool:
        """No notification was marked read twice (each race flips it at most once)."""
        return all(flips <= 1 for flips in self.race_flips)

    @property
    def ok(self) -> bool:
        return self.counters_exact and self.quota_ok and self.races_ok and not self.errors

    def summary(self) -> list[str]:
        rate = self.operations / self.seconds if self.seconds else 0.0
        lines = [
            f"{self.operations} write statements and {self.quota_calls} quota calls in "
            f"{self.seconds:.1f} s ({rate:.0f} statements/s, "
            f"{self.quota_calls / max(self.seconds, 1e-9):.0f} quota calls/s):",
        ]
        for kind, n in sorted(self.ops.items()):
            lines.append(f"  {kind:<34} {n:>7}")
        lines.append(
            f"deltas drained: {self.deltas_by_worker} by the worker during the load, "
            f"{self.deltas_final_drain} by the final drain"
        )
        lines.append(
            f"recount in the middle (a counter edited by hand first): {self.recount_keys} keys "
            f"in {self.recount_seconds:.2f} s, {self.recount_fixed} fixed"
        )
        once = self.race_flips.get(1, 0)
        lines.append(
            f"mark-as-read races: {self.races} (two requests at once on one notification): "
            f"{once} flipped it once, {self.race_flips.get(0, 0)} found it gone, "
            f"{sum(n for f, n in self.race_flips.items() if f > 1)} flipped it twice"
        )
        lines.append(
            f"quota {QUOTA}: {self.quota_allowed} of {self.quota_calls} calls allowed, "
            f"highest use {self.quota_highest_use} of limit {self.quota_limit}: "
            + ("never above" if self.quota_ok else "ABOVE: " + "; ".join(self.quota_over_limit))
        )
        for c in self.counters:
            lines.append(
                f"  {c.name:<34} {c.mode:<7} {c.keys_checked:>5} keys  "
                f"exact: {'yes' if c.exact else f'NO ({c.mismatches} keys differ)'}"
            )
        for error in self.errors[:10]:
            lines.append(f"  error: {error}")
        return lines


def _ops() -> dict[str, str]:
    return sqlfiles.named("demo_blog_ops.sql")


def setup(dsn: str, sizes: Sizes) -> None:
    """(Re)create the blog, install its counters, load the first rows and drain."""
    ops = _ops()
    with connect(dsn) as conn:
        install(conn)
        for spec in specs():
            triggers.uninstall(conn, spec.name, drop_values=True)
        conn.execute(sqlfiles.read("demo_blog.sql").encode())
        triggers.install(conn, specs())
        conn.execute(ops["fill_users"], {"n": sizes.users})
        conn.execute(ops["fill_articles"], {"n": sizes.articles})
        conn.execute(
            ops["fill_comments"],
            {
                "n": sizes.comments,
                "articles": sizes.articles,
                "users": sizes.users,
                "writers": sizes.comment_writers,
            },
        )
        conn.execute(
            "INSERT INTO demo_blog.notifications (user_id) "
            "SELECT 1 + g %% %(users)s FROM generate_series(1, %(n)s) AS g",
            {"users": sizes.users, "n": sizes.users * 5},
        )
        Counters(conn).drain()
        quotas = Quotas(conn)
        quotas.drop_quota(QUOTA)
        quotas.define_quota(QUOTA, sizes.quota_limit, window="day")


class _Load:
    """The threads of the mixed load, sharing a stop flag and the tallies."""

    def __init__(self, dsn: str, sizes: Sizes, seed: int | None) -> None:
        self.dsn = dsn
        self.sizes = sizes
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.result = BlogDemoResult(quota_limit=sizes.quota_limit)
        self.quota_granted: collections.Counter[tuple[str, Any]] = collections.Counter()
        self.seed = seed
        self.ops = _ops()

    def rng(self, salt: int) -> random.Random:
        return random.Random() if self.seed is None else random.Random(f"{self.seed}-{salt}")

    def tally(self, counts: collections.Counter[str]) -> None:
        with self.lock:
            self.result.ops.update(counts)

    def error(self, where: str, exc: BaseException) -> None:
        with self.lock:
            self.result.errors.append(f"{where}: {type(exc).__name__}: {exc}".strip())

    def thread(self, name: str, body: Callable[[Conn], None]) -> threading.Thread:
        def run() -> None:
            try:
                with connect(self.dsn, application_name=f"pgcounters demo {name}") as conn:
                    body(conn)
            except Exception as exc:  # reported in the result, which then fails
                self.error(name, exc)
                self.stop.set()

        return threading.Thread(target=run, name=name, daemon=True)

    def nap(self) -> None:
        if self.sizes.pause:
            time.sleep(self.sizes.pause)

    # -- comments ---------------------------------------------------------------

    def comment_writer(self, writer: int) -> Callable[[Conn], None]:
        s, q = self.sizes, self.ops

        def body(conn: Conn) -> None:
            rng = self.rng(writer)
            counts: collections.Counter[str] = collections.Counter()
            bounds = [0, 0]
            done = 0

            def anywhere() -> int:
                return rng.randint(bounds[0], bounds[1] + 50)

            def one() -> int | None:
                row = conn.execute(q["pick_comment"], {"writer": writer, "from": anywhere()})
                found = row.fetchone()
                return None if found is None else int(found[0])

            def window() -> dict[str, Any]:
                return {"writer": writer, "from": anywhere(), "span": rng.randint(10, 60)}

            while not self.stop.is_set():
                if done % 100 == 0:
                    row = conn.execute(q["id_range"]).fetchone()
                    bounds[:] = [int(row[0]), int(row[1])] if row else [0, 0]
                done += 1
                roll = rng.random()
                if roll < 0.30:
                    cur = conn.execute(
                        q["add_comment"],
                        {
                            "article": rng.randint(1, s.articles),
                            "user": rng.randint(1, s.users),
                            "writer": writer,
                            "status": rng.choice(("public", "private")),
                        },
                    )
                    counts["comment: add"] += cur.rowcount
                elif roll < 0.36:
                    params = {"articles": s.articles, "users": s.users, "writer": writer}
                    conn.execute(q["add_comments_bulk"], params | {"n": rng.randint(5, 40)})
                    counts["comment: add, bulk"] += 1
                elif roll < 0.50:
                    found = one()
                    if found is not None:
                        conn.execute(
                            q["move_comment"],
                            {"article": rng.randint(1, s.articles), "id": found},
                        )
                        counts["comment: move"] += 1
                elif roll < 0.53:
                    params = window() | {"article": rng.randint(1, s.articles)}
                    conn.execute(q["move_bulk"], params)
                    counts["comment: move, bulk"] += 1
                elif roll < 0.73:
                    found = one()
                    if found is not None:
                        status = rng.choice(("public", "private"))
                        conn.execute(q["set_status"], {"status": status, "id": found})
                        counts[f"comment: {'publish' if status == 'public' else 'unpublish'}"] += 1
                elif roll < 0.78:
                    status = rng.choice(("public", "private"))
                    conn.execute(q["set_status_bulk"], window() | {"status": status})
                    kind = "publish" if status == "public" else "unpublish"
                    counts[f"comment: {kind}, bulk"] += 1
                elif roll < 0.84:
                    # a transaction of several changes in random order, then COMMIT
                    with conn.transaction():
                        for _ in range(rng.randint(2, 4)):
                            found = one()
                            if found is None:
                                continue
                            if rng.random() < 0.5:
                                status = rng.choice(("public", "private"))
                                conn.execute(q["set_status"], {"status": status, "id": found})
                            else:
                                article = rng.randint(1, s.articles)
                                conn.execute(q["move_comment"], {"article": article, "id": found})
                    counts["comment: transaction of 2-4"] += 1
                elif roll < 0.97:
                    found = one()
                    if found is not None:
                        conn.execute(q["delete_comment"], {"id": found})
                        counts["comment: delete"] += 1
                else:
                    conn.execute(q["delete_comments_bulk"], window())
                    counts["comment: delete, bulk"] += 1
                self.nap()
            self.tally(counts)

        return body

    # -- users -------------------------------------------------------------------

    def user_writer(self, conn: Conn) -> None:
        rng = self.rng(1000)
        counts: collections.Counter[str] = collections.Counter()
        q = self.ops
        while not self.stop.is_set():
            roll = rng.random()
            if roll < 0.5:
                conn.execute(q["add_user"])
                counts["user: add"] += 1
            elif roll < 0.6:
                conn.execute(q["add_users_bulk"], {"n": rng.randint(2, 20)})
                counts["user: add, bulk"] += 1
            else:
                cur = conn.execute(q["delete_newcomer"], {"initial": self.sizes.users})
                counts["user: delete"] += cur.rowcount
            time.sleep(0.01 + self.sizes.pause)
        self.tally(counts)

    # -- notifications -------------------------------------------------------------

    def notification_writer(self, conn: Conn) -> None:
        rng = self.rng(2000)
        counts: collections.Counter[str] = collections.Counter()
        q, users = self.ops, self.sizes.users
        while not self.stop.is_set():
            roll = rng.random()
            if roll < 0.45:
                conn.execute(q["notify"], {"user": rng.randint(1, users)})
                counts["notification: create"] += 1
            elif roll < 0.55:
                conn.execute(q["notify_bulk"], {"users": users, "n": rng.randint(5, 50)})
                counts["notification: create, bulk"] += 1
            elif roll < 0.75:
                cur = conn.execute(q["pick_notification"], {"from": rng.randint(1, 10 * users)})
                row = cur.fetchone()
                if row is not None:
                    conn.execute(q["mark_read"], {"id": row[0]})
                    counts["notification: mark read"] += 1
            elif roll < 0.90:
                cur = conn.execute(q["pick_notification"], {"from": rng.randint(1, 10 * users)})
                row = cur.fetchone()
                if row is not None:
                    conn.execute(q["delete_notification"], {"id": row[0]})
                    counts["notification: delete"] += 1
            else:
                conn.execute(q["delete_read_notifications"], {"n": rng.randint(5, 30)})
                counts["notification: delete read, bulk"] += 1
            self.nap()
        self.tally(counts)

    def racers(self) -> list[threading.Thread]:
        """Two threads that mark the same unread notification read at the same moment."""
        barrier = threading.Barrier(2)
        chosen: list[int] = [0]
        flips: list[int] = [0, 0]
        q = self.ops

        def racer(side: int) -> Callable[[Conn], None]:
            def body(conn: Conn) -> None:
                rng = self.rng(3000)
                try:
                    while not self.stop.is_set():
                        if side == 0:
                            # the newest unread one: the writer above does not touch it yet
                            row = conn.execute(
                                q["notify"], {"user": rng.randint(1, self.sizes.users)}
                            ).fetchone()
                            assert row is not None
                            chosen[0] = int(row[0])
                        barrier.wait(timeout=10)
                        cur = conn.execute(q["mark_read"], {"id": chosen[0]})
                        flips[side] = cur.rowcount
                        barrier.wait(timeout=10)
                        if side == 0:
                            with self.lock:
                                self.result.races += 1
                                self.result.race_flips[flips[0] + flips[1]] += 1
                            self.nap()
                except threading.BrokenBarrierError:
                    if not self.stop.is_set():
                        raise
                finally:
                    barrier.abort()

            return body

        return [self.thread(f"racer {side}", racer(side)) for side in (0, 1)]

    # -- quota ----------------------------------------------------------------------

    def quota_caller(self, index: int) -> Callable[[Conn], None]:
        def body(conn: Conn) -> None:
            rng = self.rng(4000 + index)
            quotas = Quotas(conn)
            calls = 0
            granted: collections.Counter[tuple[str, Any]] = collections.Counter()
            while not self.stop.is_set():
                subject = f"customer-{rng.randint(1, self.sizes.quota_subjects)}"
                call = quotas.register_call(QUOTA, subject)
                calls += 1
                if call.allowed:
                    granted[(subject, call.window_start)] += 1
                if self.sizes.pause:
                    time.sleep(self.sizes.pause)
            with self.lock:
                self.result.quota_calls += calls
                self.quota_granted.update(granted)

        return body


def run(
    dsn: str,
    seconds: float = 30.0,
    sizes: Sizes | None = None,
    *,
    seed: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> BlogDemoResult:
    """Set the blog up, run the mixed load for ``seconds``, drain and check everything."""
    sizes = sizes or Sizes()
    say = progress or (lambda _text: None)
    setup(dsn, sizes)
    load = _Load(dsn, sizes, seed)
    worker = Worker(dsn, WorkerSettings(batch_size=5000, min_interval=0.05, max_interval=0.25))
    drainer = threading.Thread(target=worker.run, name="worker", daemon=True)
    threads = [
        *(
            load.thread(f"comments {w}", load.comment_writer(w))
            for w in range(sizes.comment_writers)
        ),
        load.thread("users", load.user_writer),
        load.thread("notifications", load.notification_writer),
        *load.racers(),
        *(load.thread(f"quota {i}", load.quota_caller(i)) for i in range(sizes.quota_threads)),
    ]
    say(f"{len(threads)} threads writing and calling for {seconds:g} s, a worker draining ...")
    started = time.perf_counter()
    drainer.start()
    for t in threads:
        t.start()
    result = load.result
    try:
        load.stop.wait(seconds / 2)
        if not load.stop.is_set():
            say("halfway: a counter edited by hand, then a recount of every counter ...")
            _recount_all(dsn, load.ops, result)
        load.stop.wait(max(0.0, started + seconds - time.perf_counter()))
    finally:
        load.stop.set()
        for t in threads:
            t.join()
        result.seconds = time.perf_counter() - started
        worker.stop()
        drainer.join()
    result.deltas_by_worker = worker.get_stats().deltas
    return check(dsn, result, load.quota_granted)


def _recount_all(dsn: str, ops: dict[str, str], result: BlogDemoResult) -> None:
    with connect(dsn) as conn:
        with conn.transaction():
            # a hand edit past the counter column's guard, as only pgcounters' writers do
            conn.execute("SELECT set_config('pgcounters.applying', 'on', true)")
            conn.execute(ops["tamper"], {"by": TAMPER_BY, "id": 1})
        began = time.perf_counter()
        for spec in specs():
            done = recount(conn, spec, resume=False)
            result.recount_keys += done.keys_done
            result.recount_fixed += done.keys_fixed
        result.recount_seconds = time.perf_counter() - began


def check(
    dsn: str,
    result: BlogDemoResult,
    quota_granted: collections.Counter[tuple[str, Any]] | None = None,
) -> BlogDemoResult:
    """Drain what is left, compare every counter with the truth and the quota with its limit.

    Fills ``result.counters`` (and the quota figures when ``quota_granted``,
    the allowed calls per subject and window, is given) and returns it.
    """
    with connect(dsn) as conn:
        result.deltas_final_drain += Counters(conn).drain().deltas
        result.counters = []
        for spec in specs():
            verified = verify(conn, spec)
            result.counters.append(
                CounterCheck(spec.name, spec.mode, verified.keys_checked, len(verified.mismatches))
            )
        if quota_granted is not None:
            quotas = Quotas(conn)
            result.quota_allowed = sum(quota_granted.values())
            result.quota_over_limit = []
            for (subject, window_start), granted in sorted(quota_granted.items()):
                status = quotas.status(QUOTA, subject, at=window_start)
                result.quota_highest_use = max(result.quota_highest_use, status.used)
                if granted > status.limit or status.used > status.limit:
                    result.quota_over_limit.append(
                        f"{subject}: {granted} granted, {status.used} used, limit {status.limit}"
                    )
                elif status.used != granted:
                    result.quota_over_limit.append(
                        f"{subject}: {granted} calls were told yes but {status.used} are recorded"
                    )
    return result


def main(dsn: str, seconds: float = 30.0) -> int:
    """Run the blog part of the demo and print its summary; 0 when everything is exact."""
    print(
        "\nThe blog under a concurrent mixed load: comments added, moved,"
        "\npublished, unpublished and deleted; notifications created, read and deleted; users"
        "\nadded; quota calls; a worker draining; a recount halfway."
    )
    result = run(dsn, seconds, progress=lambda text: print(text, flush=True))
    print("\n".join(result.summary()))
    if not result.ok:
        print("\nFAILED: see the lines above")
        return 1
    print("\nEvery counter equals the truth; the quota never went above its limit.")
    return 0
