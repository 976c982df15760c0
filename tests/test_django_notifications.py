"""The counters_changed signal: sent by a worker run from Django after its batches commit."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from blog.models import Notification, User
from django.core.management import call_command
from django.db import connection, transaction
from django.test import Client
from django.urls import reverse

from pgcounters.contrib.django.signals import counters_changed, worker
from pgcounters.notifications import Changes, merge
from pgcounters.worker import Worker, WorkerSettings
from support import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

UNREAD = "blog.user.unread_notifications"
USERS = "blog.users.total"
FAST = WorkerSettings(min_interval=0.01, max_interval=0.05, log_every=0)


@contextmanager
def receiving() -> Iterator[list[tuple[Changes, str]]]:
    got: list[tuple[Changes, str]] = []

    def receiver(sender: Any, changes: Changes, using: str, **kwargs: Any) -> None:
        assert sender is Worker
        got.append((changes, using))

    counters_changed.connect(receiver, weak=False)
    try:
        yield got
    finally:
        counters_changed.disconnect(receiver)


@contextmanager
def running(w: Worker) -> Iterator[None]:
    thread = threading.Thread(target=w.run)
    thread.start()
    try:
        yield
    finally:
        w.stop()
        thread.join(timeout=60)
        assert not thread.is_alive()


def _unread_notifications() -> tuple[User, Notification, Notification]:
    user = User.objects.create(username="ann")
    first = Notification.objects.create(user=user, message="one")
    second = Notification.objects.create(user=user, message="two")
    return user, first, second


class Boom(Exception):
    pass


def _rolled_back(other: User) -> None:
    with transaction.atomic():
        Notification.objects.create(user=other, message="never")
        raise Boom


def _merged(got: list[tuple[Changes, str]]) -> Changes:
    out: Changes = {}
    for changes, using in got:
        assert using == "default"
        merge(out, changes)
    return out


def test_a_worker_started_from_django_sends_the_signal_after_each_commit(
    client: Client,
) -> None:
    user, first, _ = _unread_notifications()
    other = User.objects.create(username="bob")
    with receiving() as got:
        w = worker(settings=FAST)
        with running(w):
            # what was queued before it started: two users, ann's unread notifications
            wait_for(lambda: _merged(got) == {UNREAD: {(user.pk,)}, USERS: {()}})
            # a request marks a notification read: the batch that applies it is reported
            before = len(got)
            response = client.post(reverse("mark-read", args=[first.pk]))
            assert response.status_code == 303
            wait_for(lambda: len(got) > before)
            assert _merged(got[before:]) == {UNREAD: {(user.pk,)}}
            # a write that rolls back is never reported
            with pytest.raises(Boom):
                _rolled_back(other)
            before = len(got)
            Notification.objects.create(user=user, message="three")
            wait_for(lambda: len(got) > before)
            assert _merged(got[before:]) == {UNREAD: {(user.pk,)}}
    assert (other.pk,) not in (_merged(got)[UNREAD] or ())
    assert User.objects.get(pk=user.pk).unread_notifications == 2


def test_a_batch_drained_on_djangos_own_connection_reports_its_changes() -> None:
    # Django's connection loads jsonb as text (its JSONField parses it): the key types of
    # the noted changes must be read on it too
    from pgcounters import Counters
    from pgcounters.contrib.django.db import psycopg_connection

    user, _, _ = _unread_notifications()
    with psycopg_connection() as conn:
        result = Counters(conn).drain_queue_batch(1000, changes=True)
    assert result.changes == {UNREAD: {(user.pk,)}, USERS: {()}}


def test_without_receivers_the_worker_does_not_ask_for_changes() -> None:
    from blog import pagecache

    # the blog example's page cache listens; without it, nobody does
    assert counters_changed.disconnect(dispatch_uid="blog-article-pages")
    try:
        w = worker(settings=FAST)
        assert not w.reports_changes
        with receiving():
            assert worker(settings=FAST).reports_changes
    finally:
        counters_changed.connect(pagecache.invalidate_changed, dispatch_uid="blog-article-pages")
    assert worker(settings=FAST).reports_changes


def test_manage_py_pgcounters_worker_sends_the_signal() -> None:
    user, _, _ = _unread_notifications()
    failures: list[BaseException] = []

    with receiving() as got:

        def stop_when_reported() -> None:
            try:
                wait_for(lambda: len(got) >= 1)
            except BaseException as exc:
                failures.append(exc)
            # the command's SIGINT handler: finish the batch, then stop
            os.kill(os.getpid(), signal.SIGINT)

        stopper = threading.Thread(target=stop_when_reported)
        stopper.start()
        call_command("pgcounters", "worker", "--min-interval", "0.01", "--log-level", "warning")
        stopper.join()
    assert failures == []
    assert _merged(got)[UNREAD] == {(user.pk,)}


def test_direct_mode_changes_are_signalled_after_their_transaction_commits() -> None:
    from attached.models import Note, Photo

    def listeners() -> int:
        with connection.cursor() as cur:
            cur.execute("SELECT count(*) FROM pgcounters.change_listeners")
            row = cur.fetchone()
        return int(row[0]) if row else 0

    photo, other = Photo.objects.create(), Photo.objects.create()
    with receiving() as got:
        w = worker(settings=FAST)
        with running(w):
            wait_for(lambda: listeners() == 1)
            with transaction.atomic():
                Note.objects.bulk_create([Note(target=photo) for _ in range(20)])
            with pytest.raises(Boom):
                _rolled_back_note(other)
            wait_for(lambda: "attached.photo.notes_count" in _merged(got))
    changes = _merged(got)
    # the direct column reports the photo; the rolled-back note's photo is never reported
    assert changes["attached.photo.notes_count"] == {(photo.pk,)}
    photo.refresh_from_db()
    assert photo.notes_count == 20


def _rolled_back_note(photo: Any) -> None:
    from attached.models import Note

    with transaction.atomic():
        Note.objects.create(target=photo)
        raise Boom
