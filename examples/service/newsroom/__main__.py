"""``python -m newsroom``: migrate the database, then serve the API with uvicorn.

With neither ``PGCOUNTERS_DSN`` nor ``DATABASE_URL`` set, the embedded PostgreSQL that
pgcounters itself uses is started (its data in ``pgcounters-data`` beside this package, or
``PGCOUNTERS_DATA_DIR``), with a database ``newsroom``; it stops when the service does.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import sys
from collections.abc import Iterator, Sequence

import uvicorn
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from newsroom.app import Settings, create_app
from newsroom.migrate import HERE, upgrade
from pgcounters import connect, dsn_from_env
from pgcounters.config import database, redact

DATABASE = "newsroom"


def _with_database(dsn: str, name: str) -> str:
    params = conninfo_to_dict(dsn)
    params["dbname"] = name
    return make_conninfo(**{k: str(v) for k, v in params.items() if v is not None})


@contextlib.contextmanager
def service_database(data: str | None = None) -> Iterator[str]:
    """The configured database, else the ``newsroom`` database of an embedded server
    (created if absent), stopped on exit."""
    if dsn_from_env():
        with database() as dsn:
            yield dsn
        return
    folder = data or os.environ.get("PGCOUNTERS_DATA_DIR") or str(HERE / "pgcounters-data")
    with database(data=folder) as admin_dsn:
        with connect(admin_dsn) as conn:
            found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,))
            if found.fetchone() is None:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
        yield _with_database(admin_dsn, DATABASE)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m newsroom", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0: any free port")
    parser.add_argument(
        "--api-rate", default="1000/day", help="calls per API key (default 1000/day)"
    )
    parser.add_argument("--data-dir", help="the embedded server's data folder")
    args = parser.parse_args(argv)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((args.host, args.port))
        # listening from now on: a request sent once the line below is printed waits in
        # the backlog until the server accepts it, instead of being refused
        listener.listen()
    except OSError as exc:
        print(f"newsroom: error: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    with listener, service_database(args.data_dir) as dsn:
        print(f"newsroom: database {redact(dsn)}", file=sys.stderr, flush=True)
        upgrade(dsn)
        host, port = listener.getsockname()[:2]
        print(f"newsroom: migrated; listening on http://{host}:{port}/ (Ctrl-C stops)", flush=True)
        app = create_app(Settings(dsn=dsn, api_rate=args.api_rate))
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        # on Ctrl-C or SIGTERM uvicorn shuts the application down (its lifespan writes the
        # buffered views and stops the worker), then raises the signal again: here
        with contextlib.suppress(KeyboardInterrupt):
            server.run(sockets=[listener])
    print("newsroom: stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
