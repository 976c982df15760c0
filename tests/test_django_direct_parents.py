"""Direct-mode counter columns lose nothing when the parent row is not visible yet.

Django's foreign keys are DEFERRABLE INITIALLY DEFERRED: a child can be written
before its parent exists for the writing statement (the parent comes later in
the same transaction, or from a concurrent transaction that commits first).
The direct trigger then updates no row; the delta is queued and the drain
applies it once the parent is there.
"""

from __future__ import annotations

import psycopg
import pytest
from django.db import transaction
from django.db.models import Count

from members.models import Member, Post
from pgcounters import Counters
from pgcounters.contrib.django.db import dsn
from pgcounters.contrib.django.expressions import Exact

pytestmark = pytest.mark.django_db(transaction=True)


def truth(pk: int) -> int:
    return int(Member.objects.annotate(n=Count("posts")).get(pk=pk).n)


def exact(pk: int) -> int:
    return int(Member.objects.annotate(n=Exact("all_posts")).get(pk=pk).n)


def stored(pk: int) -> int:
    return Member.objects.values_list("all_posts", flat=True).get(pk=pk)


def test_parent_inserted_by_a_concurrent_transaction_that_commits_first() -> None:
    with (
        psycopg.connect(dsn()) as parent_writer,
        psycopg.connect(dsn()) as child_writer,
    ):
        parent_writer.execute(
            "INSERT INTO members_member (id, password, username) VALUES (1000, '', 'late')"
        )
        # the child's transaction cannot see the parent: its direct UPDATE finds no row
        child_writer.execute("INSERT INTO members_post (author_id, published) VALUES (1000, true)")
        child_writer.execute("INSERT INTO members_post (author_id, published) VALUES (1000, false)")
        parent_writer.commit()
        child_writer.commit()  # the deferred foreign key is checked now: the parent is there
    assert truth(1000) == 2
    assert exact(1000) == 2  # the queued deltas are read with the stored value
    with psycopg.connect(dsn(), autocommit=True) as worker:
        Counters(worker).drain()
    assert stored(1000) == exact(1000) == truth(1000) == 2


def test_parent_inserted_after_its_child_in_the_same_transaction() -> None:
    with transaction.atomic():
        Post.objects.create(author_id=2000, published=True)
        Member.objects.create(id=2000, username="later")
        Post.objects.create(author_id=2000, published=True)  # the parent is visible now
    assert exact(2000) == truth(2000) == 2
    with psycopg.connect(dsn(), autocommit=True) as worker:
        Counters(worker).drain()
    assert stored(2000) == exact(2000) == truth(2000) == 2


def test_a_visible_parent_is_still_updated_at_once() -> None:
    member = Member.objects.create(username="now")
    Post.objects.create(author=member)
    assert stored(member.pk) == truth(member.pk) == 1
    with psycopg.connect(dsn(), autocommit=True) as worker:
        assert Counters(worker).pending() == (0, 0)  # nothing queued for a visible parent
