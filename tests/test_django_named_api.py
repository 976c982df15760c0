"""Named counters from Django code: read, rank and increment on Django's own connection.

Posts per user on the stock ``django.contrib.auth`` User (no custom user
model): ``register_counter`` keyed by the foreign key. The truth is Django's
``annotate(Count(...))``.
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import transaction
from django.db.models import Count

from members.models import Post, posts_per_user
from pgcounters.contrib.django import counters
from pgcounters.errors import InvalidKey

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.fast]

PER_USER = posts_per_user


def truth() -> dict[int, int]:
    return dict(User.objects.annotate(n=Count("posts")).values_list("id", "n"))


def test_posts_per_stock_user_read_ranked_and_incremented() -> None:
    ann, bob, cid = (User.objects.create_user(username=n) for n in ("ann", "bob", "cid"))
    Post.objects.bulk_create([Post(user=ann) for _ in range(3)] + [Post(user=bob)])
    # exact before any drain: stored + pending, in the request's own connection
    assert PER_USER.get(ann) == 3
    assert PER_USER.get(bob.pk) == 1
    assert PER_USER.get_many([ann, bob, cid]) == [truth()[u.pk] for u in (ann, bob, cid)]
    assert counters.get("members.posts.per_user", cid) == 0
    call_command("pgcounters", "drain")
    assert PER_USER.top(2) == [((ann.pk,), 3), ((bob.pk,), 1)]
    Post.objects.filter(user=ann).first().delete()  # type: ignore[union-attr]
    assert PER_USER.get(ann) == truth()[ann.pk] == 2


def test_an_increment_joins_the_django_transaction() -> None:
    ann = User.objects.create_user(username="ann")
    inside: list[int] = []

    def add_then_fail() -> None:
        with transaction.atomic():
            PER_USER.incr(ann, 5)
            inside.append(PER_USER.get(ann))  # read-your-write, inside the transaction
            raise RuntimeError("rolled back")

    with pytest.raises(RuntimeError):
        add_then_fail()
    assert inside == [5]
    assert PER_USER.get(ann) == 0
    with transaction.atomic():
        PER_USER.incr(ann, 2)
    assert PER_USER.get(ann) == 2


def test_a_bad_key_is_a_clear_error() -> None:
    with pytest.raises(InvalidKey):
        PER_USER.get("not a user id")
