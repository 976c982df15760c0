"""Counters: create, drop, list, backfill, incr, get, top."""

from __future__ import annotations

import argparse
from typing import Any

from pgcounters.cli.common import EXIT_ERROR, EXIT_OK, parse_key, print_json, verbs
from pgcounters.cli.types import non_negative_int, positive_int
from pgcounters.client import MODES, Counters
from pgcounters.config import connect
from pgcounters.errors import ConfigurationError


def _cmd_create(args: argparse.Namespace, dsn: str) -> int:
    with connect(dsn) as conn:
        pc = Counters(conn)
        if args.table:
            counter = pc.create_column_counter(
                args.name, args.table, args.column or args.name, args.key_column, args.mode
            )
        else:
            counter = pc.create_counter(args.name, tuple(args.key or ()), args.mode)
    print(f"counter {counter.name}: key ({', '.join(counter.key_types)}), mode {counter.mode}")
    return EXIT_OK


def _cmd_drop(args: argparse.Namespace, dsn: str) -> int:
    from pgcounters import triggers

    with connect(dsn) as conn:
        # its triggers and recorded declaration go too: nothing keeps counting into it
        uninstalled = triggers.uninstall(conn, args.name, drop_values=True)
        dropped = Counters(conn).drop_counter(args.name) or uninstalled
    print(f"dropped {args.name}" if dropped else f"no counter named {args.name}")
    return EXIT_OK if dropped else EXIT_ERROR


def _cmd_list(args: argparse.Namespace, dsn: str) -> int:
    from pgcounters import backfill

    with connect(dsn) as conn:
        found = Counters(conn).counters()
        filling = {b.name: b.keys_done for b in backfill.pending(conn)}
    if args.json:
        print_json([
            {"name": c.name, "key": list(c.key_types), "mode": c.mode,
             "table": f"{c.table_schema}.{c.table}" if c.table else None, "column": c.column,
             "backfilling": c.name in filling}
            for c in found
        ])  # fmt: skip
        return EXIT_OK
    for c in found:
        where = f" -> {c.table_schema}.{c.table}.{c.column}" if c.table else ""
        state = f"  backfilling ({filling[c.name]} keys done)" if c.name in filling else ""
        print(f"{c.name}  key=({', '.join(c.key_types)})  mode={c.mode}{where}{state}")
    return EXIT_OK


def _cmd_backfill(args: argparse.Namespace, dsn: str) -> int:
    from pgcounters import backfill, schema

    with connect(dsn) as conn:
        schema.check(conn)
        waiting = [b.name for b in backfill.pending(conn)]
        unknown = [n for n in args.counter if n not in waiting]
        if unknown:
            raise ConfigurationError(f"no backfill is pending for {', '.join(unknown)}")
        if not waiting:
            print("no backfill pending")
            return EXIT_OK
        done = backfill.run(conn, args.counter or None, batch_size=args.batch_size)
    for name, keys in sorted(done.items()):
        print(f"{name}: backfilled, {keys} keys")
    return EXIT_OK


def _cmd_incr(args: argparse.Namespace, dsn: str) -> int:
    with connect(dsn) as conn:
        pc = Counters(conn)
        key = parse_key(args.key, pc.counter(args.name).key_types)
        value = pc.incr(args.name, key, args.delta)
    if value is not None:
        print(value)
    return EXIT_OK


def _cmd_get(args: argparse.Namespace, dsn: str) -> int:
    with connect(dsn) as conn:
        pc = Counters(conn)
        counter = pc.counter(args.name)
        key = parse_key(args.key, counter.key_types)
        # a sum of decimals reads as a decimal
        read = pc.get if counter.scale is None else pc.get_decimal
        print(read(args.name, key, exact=not args.stored))
    return EXIT_OK


def _cmd_top(args: argparse.Namespace, dsn: str) -> int:
    with connect(dsn) as conn:
        pc = Counters(conn)
        read = pc.top if pc.counter(args.name).scale is None else pc.top_decimal
        rows: list[tuple[Any, object]] = list(read(args.name, args.n))
    for key, value in rows:
        print(f"{','.join(str(p) for p in key) or '-'}\t{value}")
    return EXIT_OK


def configure_counters(sub: Any) -> None:
    """create, drop, list, backfill, incr, get, top."""
    add = verbs(sub)
    p = add("create", _cmd_create, "declare a counter")
    p.add_argument("name")
    p.add_argument(
        "--key",
        action="append",
        choices=["bigint", "uuid", "text", "date"],
        help="a key part type; repeat for composite keys; none for a global counter",
    )
    p.add_argument("--mode", choices=MODES, default="queued")
    p.add_argument("--table", help="keep values in a column of this table")
    p.add_argument("--column", help="the counter column (default: the counter name)")
    p.add_argument("--key-column", default="id", help="the column identifying a row (default: id)")

    p = add("drop", _cmd_drop, "forget a counter, its values and pending deltas")
    p.add_argument("name")

    p = add("list", _cmd_list, "list declared counters")
    p.add_argument("--json", action="store_true")

    p = add(
        "backfill",
        _cmd_backfill,
        "count the existing rows into counters added or changed over them, in batches",
    )
    p.add_argument("counter", nargs="*", metavar="COUNTER", help="counters (default: all pending)")
    p.add_argument("--batch-size", type=positive_int, default=1000,
                   help="keys per transaction (1000)")  # fmt: skip

    p = add("incr", _cmd_incr, "add to a counter")
    p.add_argument("name")
    p.add_argument("key", nargs="?", help="key parts separated by commas; omit for global")
    p.add_argument("--delta", type=int, default=1)

    p = add("get", _cmd_get, "read a counter (exact: stored + pending)")
    p.add_argument("name")
    p.add_argument("key", nargs="?")
    p.add_argument("--stored", action="store_true", help="stored value only")

    p = add("top", _cmd_top, "keys with the highest stored values")
    p.add_argument("name")
    p.add_argument("-n", type=non_negative_int, default=10)
