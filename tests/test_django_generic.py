"""Counters over generic relations (django.contrib.contenttypes): notes attached to any
model through a GenericForeignKey, counted per object by counter columns on the models with
a GenericRelation and by a named counter keyed by (content type, object id), exact in
queued, unlogged and direct mode whatever writes the notes (the ORM, bulk operations, raw
SQL), equal to the ORM's own ``annotate(Count(...))``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.db.models import Count
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import truth
from attached.models import Note, Photo, Post, Vote, notes_per_object
from django_support import generic_truths
from pgcounters import Counters, backfill, triggers
from pgcounters.connection import Conn
from pgcounters.contrib.django import Exact
from pgcounters.contrib.django.db import dsn
from pgcounters.contrib.django.orm_truth import verify_orm
from pgcounters.repair import recount, verify
from pgcounters.specs import NamedTarget, generic_relation
from support import tamper

pytestmark = pytest.mark.django_db(transaction=True)

PER_OBJECT = "attached.notes_per_object"


@pytest.fixture
def worker() -> Iterator[Conn]:
    with psycopg.connect(dsn(), autocommit=True) as conn:
        yield conn


def truths() -> list[truth.Truth]:
    return generic_truths()


def _check(conn: Conn) -> None:
    truth.assert_exact(conn, truths())
    Counters(conn).drain()
    truth.assert_stored(conn, truths())
    assert [r for r in verify_orm() if r.mismatches] == []


def test_notes_on_two_models_count_on_each(worker: Conn) -> None:
    post, photo = Post.objects.create(title="p"), Photo.objects.create(caption="c")
    Note.objects.create(target=post)
    Note.objects.create(target=post, public=False, score=5)
    Note.objects.create(target=photo)
    Vote.objects.create(target=post)
    photo.refresh_from_db()
    assert photo.notes_count == 1  # direct: in the writing statement
    row = Post.objects.annotate(n=Exact("notes_count"), p=Exact("public_notes")).get(pk=post.pk)
    assert (row.n, row.p) == (2, 1)
    ct = ContentType.objects.get_for_model(Post)
    assert notes_per_object.get((ct.pk, str(post.pk))) == 2
    _check(worker)
    post.refresh_from_db()
    assert (post.notes_count, post.score_total, post.votes_count) == (2, 6, 1)


def test_moving_a_note_to_another_object_or_model_moves_its_count(worker: Conn) -> None:
    a, b, photo = Post.objects.create(), Post.objects.create(), Photo.objects.create()
    note = Note.objects.create(target=a)
    note.target = b
    note.save()
    Note.objects.filter(pk=note.pk).update(
        content_type=ContentType.objects.get_for_model(Photo), object_id=str(photo.pk)
    )
    photo.refresh_from_db()
    assert photo.notes_count == 1
    _check(worker)
    assert Post.objects.filter(notes_count__gt=0).count() == 0


def test_a_text_object_id_counts_as_the_orm_casts_it_and_one_that_does_not_cast_nowhere(
    worker: Conn,
) -> None:
    post = Post.objects.create()
    ct = ContentType.objects.get_for_model(Post)
    # the ORM joins on object_id::bigint: '007', ' 7' and '+7' are post 7
    for text in (str(post.pk), f"00{post.pk}", f" {post.pk} ", f"+{post.pk}"):
        Note.objects.create(content_type=ct, object_id=text)
    assert Post.objects.annotate(n=Count("notes")).get(pk=post.pk).n == 4
    # texts that are no id count nowhere, and never stop the write
    odd = [
        Note.objects.create(content_type=ct, object_id=text).pk
        for text in ("abc", "99999999999999999999", "", "1e3")
    ]
    post.refresh_from_db()
    assert post.notes_direct == 4
    Note.objects.filter(pk__in=odd).delete()  # the ORM's join cannot count while they exist
    _check(worker)


def test_the_content_type_is_looked_up_by_name_when_the_statement_runs(worker: Conn) -> None:
    # a content type created again gets another id: the triggers follow it, none is compiled in
    post = Post.objects.create()
    old = ContentType.objects.get_for_model(Post)
    ContentType.objects.filter(pk=old.pk).delete()
    ContentType.objects.clear_cache()
    new = ContentType.objects.get_for_model(Post)
    assert new.pk != old.pk
    Note.objects.create(target=post)
    Note.objects.create(content_type=new, object_id=str(post.pk))
    post.refresh_from_db()
    assert post.notes_direct == 2
    _check(worker)
    spec = Post._meta.get_field("notes_count").spec()
    assert spec.where is not None
    assert spec.where.params == ("attached", "post")
    assert str(new.pk) not in spec.where.sql


def test_bulk_raw_sql_and_deletes_are_counted(worker: Conn) -> None:
    posts = [Post.objects.create() for _ in range(3)]
    ct = ContentType.objects.get_for_model(Post)
    Note.objects.bulk_create([Note(target=p, score=i) for i, p in enumerate(posts * 4)])
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO attached_note (content_type_id, object_id, public, score)"
            " SELECT %s, %s, i %% 2 = 0, i FROM generate_series(1, 10) AS i",
            [ct.pk, str(posts[0].pk)],
        )
        cur.execute("UPDATE attached_note SET public = NOT public WHERE id % 3 = 0")
    Note.objects.filter(object_id=str(posts[1].pk)).delete()
    posts[2].delete()  # its notes go with it (the GenericRelation's cascade)
    _check(worker)


def test_verify_and_recount_repair_a_broken_column(worker: Conn) -> None:
    post = Post.objects.create()
    Note.objects.bulk_create([Note(target=post) for _ in range(3)])
    Counters(worker).drain()
    tamper(worker, "UPDATE attached_post SET notes_count = 42")
    (wrong,) = verify(worker, "attached.post.notes_count").mismatches
    assert (wrong.expected, wrong.actual) == (3, 42)
    assert recount(worker, "attached.post.notes_count").keys_fixed == 1
    truth.assert_stored(worker, truths())


def test_a_new_generic_counter_is_backfilled_online(worker: Conn) -> None:
    posts = [Post.objects.create() for _ in range(4)]
    Note.objects.bulk_create([Note(target=p) for p in posts for _ in range(p.pk % 3)])
    spec = generic_relation(
        "attached.notes_by_post",
        "attached_note",
        NamedTarget(("bigint",)),
        content_type=("attached", "post"),
        object_id_is_text=True,
        mode="queued",
    )
    triggers.install(worker, [spec])
    Note.objects.create(target=posts[0])  # written while the backfill is pending
    while backfill.step(worker, 2):
        pass
    counts = {(p.pk,): Note.objects.filter(object_id=str(p.pk)).count() for p in posts}
    pc = Counters(worker)
    assert {k: pc.get("attached.notes_by_post", k) for k in counts} == counts
    assert verify(worker, "attached.notes_by_post").mismatches == []


def test_the_admin_lists_the_counts(admin_client: Client, worker: Conn) -> None:
    post = Post.objects.create(title="shown")
    Note.objects.bulk_create([Note(target=post) for _ in range(7)])
    Counters(worker).drain()
    html = admin_client.get("/admin/attached/post/").content.decode()
    assert "shown" in html
    assert ">7<" in html


# -- random writes against the ORM's truth -------------------------------------------------

writes = st.lists(
    st.tuples(
        st.sampled_from(["create", "bulk", "move", "flip", "raw", "delete", "drain"]),
        st.integers(min_value=0, max_value=5),
        st.integers(min_value=0, max_value=5),
    ),
    max_size=20,
)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=writes)
def test_random_writes_match_the_orms_count(worker: Conn, ops: list[tuple[str, int, int]]) -> None:
    posts = list(Post.objects.all()[:3]) or [Post.objects.create() for _ in range(3)]
    photos = list(Photo.objects.all()[:2]) or [Photo.objects.create() for _ in range(2)]
    targets: list[Any] = [*posts, *photos]
    for op, a, b in ops:
        target = targets[a % len(targets)]
        if op == "create":
            Note.objects.create(target=target, public=b % 2 == 0, score=b)
            Vote.objects.create(target=target)
        elif op == "bulk":
            Note.objects.bulk_create([Note(target=target, score=i) for i in range(b)])
        elif op == "move":
            notes = list(Note.objects.order_by("?")[: b + 1])
            for note in notes:
                note.target = targets[(a + note.pk) % len(targets)]
            Note.objects.bulk_update(notes, ["content_type", "object_id"])
        elif op == "flip":
            Note.objects.filter(pk__gt=b).update(public=a % 2 == 0, score=a)
        elif op == "raw":
            with connection.cursor() as cur:
                cur.execute(
                    "UPDATE attached_note SET object_id = %s WHERE id %% 4 = %s",
                    [str(target.pk), b % 4],
                )
        elif op == "delete":
            Note.objects.filter(pk__in=Note.objects.order_by("?").values("pk")[:b]).delete()
            Vote.objects.filter(object_pk=target.pk).delete()
        else:
            Counters(worker).drain(batch_size=b + 1)
    truth.assert_exact(worker, truths())
    Counters(worker).drain()
    truth.assert_stored(worker, truths())
