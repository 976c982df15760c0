"""Run the blog with nothing configured: an embedded PostgreSQL, and a worker in runserver.

``manage.py`` calls :func:`main`. When neither ``PGCOUNTERS_DSN`` nor
``DATABASE_URL`` is set, it starts (or adopts, if one is already running) the
embedded PostgreSQL that ``pgcounters`` itself uses, with its data in the
visible folder ``examples/blog/pgcounters-data`` (or ``PGCOUNTERS_DATA_DIR``),
creates the database ``blog`` there, and points the settings at it through
``PGCOUNTERS_DSN``. The server is stopped when the command that started it
ends; ``runserver``'s reloaded child process adopts it and leaves it running.

``runserver`` also drains the counter queues in a background thread (a
:class:`pgcounters.Worker` that sends ``counters_changed``), so the counter columns follow
the writes, and the cached article pages are renewed, without a separate
``manage.py pgcounters worker``; set ``BLOG_WORKER=0`` to run your own worker instead.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgcounters import Worker, WorkerSettings, connect, dsn_from_env

BASE_DIR = Path(__file__).resolve().parent.parent
DATABASE = "blog"


def data_dir() -> Path:
    """Where the embedded server keeps its data: ``PGCOUNTERS_DATA_DIR`` or beside manage.py."""
    return Path(os.environ.get("PGCOUNTERS_DATA_DIR") or BASE_DIR / "pgcounters-data").absolute()


def _with_database(dsn: str, name: str) -> str:
    params = conninfo_to_dict(dsn)
    params["dbname"] = name
    return make_conninfo(**{k: str(v) for k, v in params.items() if v is not None})


def _create_database(dsn: str, name: str) -> None:
    with connect(dsn) as conn:
        found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if found is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


@contextmanager
def embedded_database(folder: Path | None = None) -> Iterator[str | None]:
    """Set ``PGCOUNTERS_DSN`` to an embedded server's ``blog`` database if no DSN is set.

    Yields the DSN it set, or None when a DSN was configured (then nothing is
    started). The server is stopped on exit only if it was started here.
    """
    if dsn_from_env():
        yield None
        return
    from pgcounters import EmbeddedPostgres

    folder = folder or data_dir()
    server = EmbeddedPostgres(folder)
    already_running = (folder / "postmaster.pid").exists()
    if not already_running:
        print(f"blog: no PGCOUNTERS_DSN set; starting an embedded PostgreSQL in {folder}")
    admin_dsn = server.start()
    dsn = _with_database(admin_dsn, DATABASE)
    os.environ["PGCOUNTERS_DSN"] = dsn
    try:
        _create_database(admin_dsn, DATABASE)
        yield dsn
    finally:
        os.environ.pop("PGCOUNTERS_DSN", None)
        if not already_running:
            server.stop()


def start_worker(dsn: str) -> Worker:
    """Drain the counter queues in a daemon thread of this process, sending Django's
    ``counters_changed`` after each batch (the article pages' cache listens to it)."""
    import django

    from pgcounters.contrib.django.signals import signal_callback

    django.setup()
    worker = Worker(
        dsn, WorkerSettings(min_interval=0.1, max_interval=1.0), on_change=signal_callback()
    )
    threading.Thread(target=worker.run, name="pgcounters worker", daemon=True).start()
    return worker


def _serving(argv: Sequence[str]) -> bool:
    """True in the process of ``runserver`` that serves requests (not the reloader)."""
    if len(argv) < 2 or argv[1] != "runserver":
        return False
    return os.environ.get("RUN_MAIN") == "true" or "--noreload" in argv


def main(argv: Sequence[str] | None = None) -> None:
    """``manage.py``: the database first, then Django's command line."""
    argv = list(sys.argv if argv is None else argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "blogsite.settings")
    from django.core.management import execute_from_command_line

    def _terminate(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # unwinds, so the embedded server is stopped

    signal.signal(signal.SIGTERM, _terminate)
    with embedded_database():
        if _serving(argv) and os.environ.get("BLOG_WORKER", "1") != "0":
            configured = dsn_from_env()
            if configured:
                start_worker(configured)
        execute_from_command_line(argv)
