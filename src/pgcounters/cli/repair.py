"""Repair: verify declared counters against the truth, recount them, and the quarantine of
deltas the drain could not apply."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any, NoReturn

from pgcounters import schema
from pgcounters.cli.common import (
    EXIT_DRIFT,
    EXIT_ERROR,
    EXIT_OK,
    parse_key,
    print_json,
    verb_group,
    verbs,
)
from pgcounters.cli.types import non_negative_int, positive_int
from pgcounters.config import connect
from pgcounters.connection import Conn
from pgcounters.errors import ConfigurationError

if TYPE_CHECKING:
    from tqdm import tqdm

    from pgcounters.repair import VerifyResult
    from pgcounters.specs import CounterSpec


def _chosen_specs(conn: Conn, names: Sequence[str]) -> list[CounterSpec]:
    """The declared counters named (default: all), once the schema is known to be there."""
    from pgcounters import triggers

    schema.check(conn)
    return triggers.select_declared(conn, names)


def _key_json(key: Sequence[object]) -> list[object]:
    return [p if isinstance(p, int) else str(p) for p in key]


def _cmd_verify(args: argparse.Namespace, dsn: str) -> int:
    from pgcounters import backfill
    from pgcounters.repair import verify

    with connect(dsn) as conn:
        specs = _chosen_specs(conn, args.counter)
        # a counter being backfilled is not wrong, it is not ready: said, not verified
        filling = {b.name: b.keys_done for b in backfill.pending(conn)}
        results = [
            verify(conn, spec, sample=args.sample) for spec in specs if spec.name not in filling
        ]
        waiting = [(s.name, filling[s.name]) for s in specs if s.name in filling]
    return report_verify(
        results, show=args.show, as_json=args.json, sample=args.sample, waiting=waiting
    )


def _exact_json(value: int | Decimal) -> int | str:
    """A value for JSON: an int as it is, a Decimal as its exact text (a float is not)."""
    return str(value) if isinstance(value, Decimal) else value


def report_verify(
    results: Sequence[VerifyResult],
    *,
    show: int,
    as_json: bool,
    sample: int | None = None,
    truth: str | None = None,
    waiting: Sequence[tuple[str, int]] = (),
) -> int:
    """Print verify's report (text or one JSON object) and return its exit code.

    ``truth``: a name for a truth other than the spec's compiled count, printed with the
    report (``manage.py pgcounters verify --truth orm``). ``waiting``: counters being
    backfilled (name, keys done), reported rather than verified.
    """
    drifted = [r for r in results if not r.ok]
    code = EXIT_DRIFT if drifted else EXIT_OK
    if as_json:
        print_json({
            "counters": [
                {"name": r.name, "keys_checked": r.keys_checked, "keys_off": len(r.mismatches),
                 "differences": [
                     # a sum of decimals: exact decimal strings ("4.00"), not floats
                     {"key": _key_json(m.key), "expected": _exact_json(m.expected),
                      "actual": _exact_json(m.actual),
                      "difference": _exact_json(m.actual - m.expected)}
                     for m in r.mismatches[: show]]}
                for r in results
            ],
            "backfilling": [name for name, _ in waiting],
            "sampled": sample, "drift": bool(drifted), "exit_code": code,
            **({"truth": truth} if truth else {}),
        })  # fmt: skip
        return code
    for name, done in waiting:
        print(f"{name}: backfilling ({done} keys done), verified when the backfill ends")
    if not results and not waiting:
        print("no declared counters are recorded in this database")
        return code
    if truth:
        print(f"truth: {truth}")
    for r in results:
        print(f"{r.name}: {r.keys_checked} keys checked, {len(r.mismatches)} off")
        for m in r.mismatches[:show]:
            key = ",".join(str(p) for p in m.key) or "-"
            print(
                f"  key {key}: stored + pending {m.actual}, truth {m.expected} "
                f"({m.actual - m.expected:+})"
            )
        if len(r.mismatches) > show:
            print(f"  ... and {len(r.mismatches) - show} more")
    what = f"{len(results)} counters" + (f" (samples of {sample} keys)" if sample else "")
    if drifted:
        print(f"drift found in {len(drifted)} of {what}: run `pgcounters recount` to repair")
    else:
        print(f"all exact: {what}")
    return code


def _range_bound(spec: CounterSpec, text: str | None) -> str | None:
    """A --key-from/--key-to value checked against the counter's first key part."""
    from pgcounters.keys import encode_key

    if text is None:
        return None
    key_type = spec.key_types[0]
    return encode_key(parse_key(text, (key_type,)), (key_type,), spec.name)[0]


class _ProgressBar:
    """A tqdm bar on stderr for one counter, made when the number of keys is known."""

    def __init__(self, name: str, show: bool) -> None:
        self.name, self.show = name, show
        self.bar: tqdm[NoReturn] | None = None

    def start(self, total: int) -> None:
        import os
        import shutil

        from tqdm import tqdm

        # the size of stderr's terminal; one that reports 0x0 gets shutil's (stdout's, or
        # 80x24): with 0 columns tqdm would draw nothing at all
        try:
            columns, lines = os.get_terminal_size(sys.stderr.fileno())
        except (OSError, ValueError):
            columns = lines = 0
        if columns <= 0 or lines <= 0:
            columns, lines = shutil.get_terminal_size()
        self.bar = tqdm(total=total, desc=self.name, unit=" keys", file=sys.stderr,
                        disable=not self.show, ncols=columns, nrows=lines,
                        leave=True)  # fmt: skip

    def update(self, n: int) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _cmd_recount(args: argparse.Namespace, dsn: str) -> int:
    from pgcounters.repair import recount

    ranged = args.key_from is not None or args.key_to is not None
    show = not args.no_progress and sys.stderr.isatty()
    with connect(dsn) as conn:
        specs = _chosen_specs(conn, args.counter)
        if ranged:
            global_ = [spec.name for spec in specs if not spec.key_types]
            if global_ and args.counter:
                raise ConfigurationError(
                    f"{', '.join(global_)} has no key: --key-from/--key-to do not apply"
                )
            specs = [spec for spec in specs if spec.key_types]
        bounds = [(_range_bound(s, args.key_from), _range_bound(s, args.key_to)) for s in specs]
        if not specs:
            print("no declared counters to recount")
            return EXIT_OK
        for spec, (low, high) in zip(specs, bounds, strict=True):
            bar = _ProgressBar(spec.name, show)
            try:
                result = recount(
                    conn,
                    spec,
                    batch_size=args.batch_size,
                    resume=args.resume,
                    key_range=(low, high) if ranged else None,
                    progress=bar.update,
                    planned=bar.start,
                )
            except KeyboardInterrupt:
                print(
                    f"{spec.name}: interrupted; its committed batches stay done, "
                    "run the same recount again to resume",
                    file=sys.stderr,
                )
                raise
            finally:
                bar.close()
            span = ""
            if ranged:
                span = f" in [{low if low is not None else '...'}, "
                span += f"{high if high is not None else '...'}]"
            print(
                f"{result.name}: {result.keys_done} keys{span} in {result.batches} batches, "
                f"{result.keys_fixed} fixed" + (" (resumed)" if result.resumed else ""),
                flush=True,
            )
    return EXIT_OK


def _cmd_quarantine_list(args: argparse.Namespace, dsn: str) -> int:
    from pgcounters.quarantine import list_quarantined

    with connect(dsn) as conn:
        found = list_quarantined(conn, args.counter, args.limit)
    if args.json:
        print_json([
            {"id": d.id, "counter": d.counter, "key": d.key, "delta": d.delta,
             "queue": "unlogged" if d.unlogged else "logged",
             "created_at": d.created_at.isoformat(),
             "quarantined_at": d.quarantined_at.isoformat(),
             "sqlstate": d.sqlstate, "error": d.error}
            for d in found
        ], indent=2)  # fmt: skip
        return EXIT_OK
    if not found:
        print("no deltas are set aside")
        return EXIT_OK
    for d in found:
        print(
            f"{d.id}  {d.counter}  key {d.key}  delta {d.delta}  "
            f"({'unlogged' if d.unlogged else 'logged'} queue, set aside "
            f"{d.quarantined_at:%Y-%m-%d %H:%M:%S})  [{d.sqlstate}] {d.error}"
        )
    return EXIT_OK


def _quarantine_choice(args: argparse.Namespace) -> dict[str, Any]:
    return {"ids": args.id or None, "counter": args.counter, "everything": args.all}


def _cmd_quarantine_replay(args: argparse.Namespace, dsn: str) -> int:
    from pgcounters.quarantine import replay

    with connect(dsn) as conn:
        n = replay(conn, **_quarantine_choice(args))
    hint = (
        " (the deltas of a dropped counter stay set aside until a counter of its name is "
        "declared again)"
        if not n
        else ""
    )
    print(f"{n} deltas moved back into their queues{hint}")
    return EXIT_OK if n else EXIT_ERROR


def _cmd_quarantine_discard(args: argparse.Namespace, dsn: str) -> int:
    from pgcounters.quarantine import discard

    with connect(dsn) as conn:
        n = discard(conn, **_quarantine_choice(args))
    print(f"{n} deltas discarded")
    return EXIT_OK if n else EXIT_ERROR


def configure_repair(sub: Any) -> None:
    """verify, recount, and ``quarantine VERB``."""
    add = verbs(sub)
    p = add(
        "verify",
        _cmd_verify,
        "compare declared counters with the truth (exit 0 exact, 5 drift found)",
    )
    p.add_argument("counter", nargs="*", metavar="COUNTER", help="declared counters (default: all)")
    p.add_argument("--sample", type=positive_int, metavar="N",
                   help="check N random keys of each counter")  # fmt: skip
    p.add_argument("--show", type=non_negative_int, default=5, metavar="N",
                   help="differences shown per counter (default 5)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print one JSON object")

    p = add(
        "recount",
        _cmd_recount,
        "set declared counters to the truth, in batches, while writes and drains go on",
    )
    p.add_argument("counter", nargs="*", metavar="COUNTER", help="declared counters (default: all)")
    p.add_argument("--batch-size", type=positive_int, default=1000,
                   help="keys per transaction (1000)")  # fmt: skip
    p.add_argument("--key-from", metavar="K", help="first key (of the first key part) to recount")
    p.add_argument("--key-to", metavar="K", help="last key (included) to recount")
    again = p.add_mutually_exclusive_group()
    again.add_argument("--resume", dest="resume", action="store_true", default=True,
                       help="continue an interrupted recount of a counter (default)")  # fmt: skip
    again.add_argument("--restart", dest="resume", action="store_false",
                       help="start over, ignoring an interrupted recount")  # fmt: skip
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (none either when stderr is not a terminal)")  # fmt: skip

    _configure_quarantine(sub)


def _configure_quarantine(sub: Any) -> None:
    """``pgcounters quarantine VERB``: deltas the drain could not apply."""
    add = verb_group(
        sub,
        "quarantine",
        "deltas the drain could not apply: list, replay, discard",
        "Deltas the drain could not apply (overflow, a key that does not cast, "
        "a dropped counter) are set aside with their error; the rest keeps draining. "
        "Exit codes: 0 success, 1 error or nothing matched, 2 bad usage.",
    )

    p = add("list", _cmd_quarantine_list, "list the deltas set aside, oldest first")
    p.add_argument("--counter", help="only this counter's")
    p.add_argument("--limit", type=positive_int, default=1000,
                   help="at most this many (default 1000)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print one JSON array")
    for name, handler, text in (
        ("replay", _cmd_quarantine_replay,
         "move deltas back into their queues (after fixing the cause)"),
        ("discard", _cmd_quarantine_discard, "delete deltas for good"),
    ):  # fmt: skip
        p = add(name, handler, text)
        choice = p.add_mutually_exclusive_group(required=True)
        choice.add_argument("--id", type=non_negative_int, action="append",
                            help="this delta (repeatable)")  # fmt: skip
        choice.add_argument(
            "--counter",
            help="every delta of this counter (a counter re-created under the name gets them)",
        )
        choice.add_argument("--all", action="store_true", help="every delta set aside")
