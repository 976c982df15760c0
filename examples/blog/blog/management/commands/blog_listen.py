"""``manage.py blog_listen``: keep the cached article pages fresh from another process.

The worker started with ``--notify`` (``manage.py pgcounters worker --notify``) sends,
after the drain batches commit, one ``NOTIFY`` on ``pgcounters_changes`` naming the
counters and keys they changed. This command ``LISTEN``s on that channel and renews the
cache version of each article whose page shows a changed counter (every page when a
counter is reported as "many keys", ``"*"``, or when everything changed), then prints
what it did, one line a notification. Nothing else is needed: no Django signal, no
worker in this process, the same cache as the site's.

A notification is sent after the commit and is not queued for a listener that was not
connected: a page changed while nobody listened stays until its timeout
(``BLOG_PAGE_CACHE_SECONDS``), as with a worker that crashed between its commit and its
report.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection

from blog import pagecache
from pgcounters.contrib.django import psycopg_connection
from pgcounters.notifications import CHANNEL, EVERYTHING, parse_payload


class Command(BaseCommand):
    help = (
        "LISTEN on the counters' change notifications and invalidate the cached pages of "
        "the articles they name (run the worker with --notify)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--count", type=int, default=0, help="stop after N notifications (0: never)"
        )
        parser.add_argument(
            "--timeout",
            type=float,
            default=0.0,
            help="stop after S seconds without a notification (0: never)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        count: int = options["count"]
        timeout: float = options["timeout"]
        if count < 0 or timeout < 0:
            raise CommandError("--count and --timeout take a number of zero or more")
        seen = 0
        try:
            with psycopg_connection() as conn:
                if not conn.autocommit:
                    raise CommandError("the connection must be in autocommit mode to LISTEN")
                conn.execute(f"LISTEN {CHANNEL}")
                self.stdout.write(f"listening on {CHANNEL}")
                self.stdout.flush()
                for note in conn.notifies(timeout=timeout or None):
                    if note.channel != CHANNEL:
                        continue
                    self.stdout.write(self.invalidate(note.payload))
                    self.stdout.flush()
                    seen += 1
                    if seen == count:
                        break
                conn.execute(f"UNLISTEN {CHANNEL}")
        finally:
            connection.close()

    @staticmethod
    def invalidate(payload: str) -> str:
        """Renew the versions of the pages a notification names; what was done, as text."""
        try:
            changes = parse_payload(payload)
        except ValueError:
            pagecache.invalidate(None)
            return "unreadable notification: every article page invalidated"
        if EVERYTHING in changes:
            pagecache.invalidate(None)
            return "everything changed: every article page invalidated"
        articles = pagecache.articles_changed(changes)
        if articles is None:
            pagecache.invalidate(None)
            many = sorted(c for c, keys in changes.items() if keys is None)
            return f"many keys of {', '.join(many)}: every article page invalidated"
        if not articles:
            return f"no article page shows {', '.join(sorted(changes))}"
        pagecache.invalidate(articles)
        return "invalidated the pages of articles " + ", ".join(map(str, sorted(articles)))
