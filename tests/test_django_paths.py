"""Counters through paths and many-to-many relations on Django models (the press test app):
remarks per writer through the stories, labels per story and stories per label through the
automatic through table, in queued, unlogged and direct mode, through the ORM (save,
bulk_create, update, delete, add, remove, set, clear), raw SQL and the database's own
ON DELETE CASCADE, against the ORM's annotate(Count(...)) / Sum."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.db.models import Q
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import truth
from django_support import drain, press_truths
from pgcounters import Counters, triggers
from pgcounters.connection import Conn
from pgcounters.contrib.django import CountField, Exact, declared_counters
from pgcounters.contrib.django.db import dsn
from pgcounters.contrib.django.declarations import _path_fragment
from pgcounters.contrib.django.orm_truth import verify_orm
from pgcounters.errors import InvalidCounterDefinition
from pgcounters.repair import recount, verify
from pgcounters.specs import CounterSpec, NamedTarget
from press.models import Label, Remark, Story, Writer

pytestmark = pytest.mark.django_db(transaction=True)

NAMES = sorted(spec.name for _, spec in declared_counters() if spec.name.startswith("press."))


@pytest.fixture
def worker() -> Iterator[Conn]:
    with psycopg.connect(dsn(), autocommit=True) as conn:
        yield conn


def _judge(conn: Conn) -> None:
    """Exact reads, then stored values after a drain, equal the ORM's truth; verify (the
    SQL truth joining the path) and verify --truth orm agree."""
    truths = press_truths()
    assert {t.counter for t in truths} == set(NAMES)
    truth.assert_exact(conn, truths)
    truth.assert_drained(conn, truths)
    for name in NAMES:
        assert verify(conn, name).mismatches == [], name
    assert [r.mismatches for r in verify_orm(NAMES)] == [[]] * len(NAMES)


def _seed() -> tuple[list[Writer], list[Story], list[Label]]:
    writers = Writer.objects.bulk_create([Writer(name=f"w{i}") for i in range(3)])
    labels = Label.objects.bulk_create([Label(active=i != 1) for i in range(4)])
    stories = Story.objects.bulk_create(
        [Story(writer=writers[i % 3], published=i % 4 != 0) for i in range(6)]
    )
    Remark.objects.bulk_create(
        [Remark(story=stories[i % 6], public=i % 3 != 0, score=i) for i in range(30)]
    )
    for i, story in enumerate(stories):
        story.labels.add(*labels[: i % 4 + 1])
    return writers, stories, labels


def test_the_declarations_compile_to_paths() -> None:
    by_name = {spec.name: spec for _, spec in declared_counters()}
    public = by_name["press.writer.public_remarks"]
    assert public.source.name == "press_remark"
    assert [(v.table.name, v.link, v.key) for v in public.via] == [
        ("press_story", "story_id", "id")
    ]
    assert public.keys == ("writer_id",)
    assert public.where is not None
    assert '"press_story"."published"' in public.where.sql
    per_label = by_name["press.label.published_stories"]
    assert per_label.source.name == "press_story_labels"
    assert [v.table.name for v in per_label.via] == ["press_story"]
    plain = by_name["press.story.label_count"]
    assert (plain.source.name, plain.keys, plain.via) == ("press_story_labels", ("story_id",), ())


def test_a_path_ending_with_a_many_to_many_counts_the_links() -> None:
    """`"stories__labels"`: the through table's rows, per writer through their story; the
    filter is on the link rows, whose story is on the path."""
    by_name = {spec.name: spec for _, spec in declared_counters()}
    links = by_name["press.writer.published_label_links"]
    assert links.source.name == "press_story_labels"
    assert [(v.table.name, v.link, v.key) for v in links.via] == [("press_story", "story_id", "id")]
    assert links.keys == ("writer_id",)
    assert links.where is not None
    assert '"press_story"."published"' in links.where.sql


@pytest.mark.parametrize(
    ("relation", "options", "message"),
    [
        # through a many-to-many, a row reaches several rows above it
        ("stories__remarks", {}, "may only end a path"),
        # the other side (the label) is not on the path up to the writer
        ("stories__labels", {"filter": Q(label__active=True)}, "nothing else"),
        ("stories__labels", {"field": "label_id"}, "sums nothing"),
    ],
)
def test_paths_a_many_to_many_cannot_take_are_refused(
    relation: str, options: dict[str, Any], message: str
) -> None:
    from pgcounters.contrib.django import SumField

    model = Label if relation == "stories__remarks" else Writer
    field: Any = (
        SumField(relation, options["field"])
        if "field" in options
        else CountField(relation, filter=options.get("filter"))
    )
    field.set_attributes_from_name("probe")
    field.model = model
    with pytest.raises(InvalidCounterDefinition, match=message):
        field.spec()


def test_a_filter_off_the_path_is_refused() -> None:
    links = {"press_story": ("story_id", "id", "press_remark")}
    with pytest.raises(InvalidCounterDefinition, match="nothing else"):
        _path_fragment(Remark, Q(story__writer__name="x"), links, "Writer.x")
    assert "published" in _path_fragment(Remark, Q(story__published=True), links, "W.x").sql


def test_orm_writes_and_moves(worker: Conn) -> None:
    writers, stories, labels = _seed()
    _judge(worker)
    # a story moves to another writer: all its remarks go with it
    story = stories[1]
    story.writer = writers[2]
    story.save()
    Story.objects.filter(pk=stories[2].pk).update(writer=writers[0])
    # unpublishing shifts remarks and every label's count of published stories
    Story.objects.filter(pk__in=[stories[3].pk, stories[4].pk]).update(published=False)
    stories[0].published = True
    stories[0].save()
    Label.objects.filter(pk=labels[0].pk).update(active=False)
    _judge(worker)
    # many-to-many from both sides
    stories[5].labels.remove(labels[0])
    stories[5].labels.set([labels[1], labels[3]])
    labels[2].stories.add(*stories[:3])
    labels[3].stories.clear()
    stories[4].labels.clear()
    _judge(worker)
    # deletes: Django's collector deletes the children first
    stories[1].delete()
    labels[1].delete()
    writers[0].delete()
    Remark.objects.filter(score__gt=20).delete()
    _judge(worker)


def test_raw_sql_and_database_cascades(worker: Conn) -> None:
    writers, stories, labels = _seed()
    # the database deletes the children itself, after the parent is gone
    worker.execute(
        "ALTER TABLE press_remark DROP CONSTRAINT IF EXISTS press_remark_story_id_fkey_db;"
        "ALTER TABLE press_remark ADD CONSTRAINT press_remark_story_id_fkey_db"
        " FOREIGN KEY (story_id) REFERENCES press_story ON DELETE CASCADE;"
        "ALTER TABLE press_story ADD CONSTRAINT press_story_writer_id_fkey_db"
        " FOREIGN KEY (writer_id) REFERENCES press_writer ON DELETE CASCADE;"
        "ALTER TABLE press_story_labels ADD CONSTRAINT press_story_labels_story_fkey_db"
        " FOREIGN KEY (story_id) REFERENCES press_story ON DELETE CASCADE;"
        "ALTER TABLE press_story_labels ADD CONSTRAINT press_story_labels_label_fkey_db"
        " FOREIGN KEY (label_id) REFERENCES press_label ON DELETE CASCADE"
    )
    worker.execute("DELETE FROM press_story WHERE id = %s", (stories[0].pk,))
    worker.execute("DELETE FROM press_label WHERE id = %s", (labels[0].pk,))
    _judge(worker)
    worker.execute("DELETE FROM press_writer WHERE id = %s", (writers[1].pk,))  # two levels
    _judge(worker)
    worker.execute(
        "UPDATE press_story SET writer_id = %s, published = NOT published", (writers[2].pk,)
    )
    worker.execute(
        "INSERT INTO press_remark (story_id, public, score)"
        " SELECT id, true, 7 FROM press_story, generate_series(1, 3)"
    )
    worker.execute("DELETE FROM press_story_labels WHERE label_id = %s", (labels[2].pk,))
    _judge(worker)


def test_exact_annotation_and_recount(worker: Conn) -> None:
    writers, _, _ = _seed()
    got = dict(Writer.objects.annotate(n=Exact("public_remarks")).values_list("pk", "n"))
    expected = {
        w.pk: Remark.objects.filter(story__writer=w, public=True, story__published=True).count()
        for w in writers
    }
    assert got == expected
    with triggers.paused(worker):
        worker.execute("UPDATE press_story SET writer_id = %s", (writers[0].pk,))
    assert verify(worker, "press.writer.public_remarks").mismatches != []
    for name in NAMES:
        recount(worker, name)
    _judge(worker)


def test_a_transaction_rolled_back_counts_nothing(worker: Conn) -> None:
    writers, stories, _ = _seed()

    def undone() -> None:
        with transaction.atomic():
            stories[0].labels.clear()
            Story.objects.update(writer=writers[0])
            raise RuntimeError

    with pytest.raises(RuntimeError):
        undone()
    _judge(worker)


def test_the_admin_lists_path_counters_with_their_queue(admin_client: Any) -> None:
    writers, stories, _ = _seed()
    Story.objects.filter(pk=stories[0].pk).update(writer=writers[1])  # one move, queued
    response = admin_client.get("/admin/pgcounters/counter/")
    assert response.status_code == 200
    listed = {c.name: c for c in response.context["cl"].result_list}
    assert set(NAMES) <= set(listed)
    public = listed["press.writer.public_remarks"]
    assert public.where == "public.press_writer.public_remarks"
    assert public.__dict__["queued"] > 0
    assert listed["press.story.label_count"].where == "public.press_story.label_count"


def test_a_many_to_many_counter_no_model_declares_goes_at_migrate(worker: Conn) -> None:
    """The triggers of a counter over an automatic through table are installed by migrate,
    not by a migration: when its declaration goes, migrate takes them away (and its values)."""
    gone = CounterSpec(
        name="press.story.gone",
        source="press_story_labels",
        keys=("story_id",),
        target=NamedTarget(("bigint",)),
    )
    triggers.install(worker, [gone])
    _, stories, _ = _seed()
    assert Counters(worker).get(gone.name, stories[3].pk) == 4
    call_command("migrate", verbosity=0)
    assert gone.name not in {t.spec_name for t in triggers.installed(worker)}
    assert gone.name not in {s.name for s in triggers.declared(worker)}
    assert set(NAMES) <= {t.spec_name for t in triggers.installed(worker)}
    stories[3].labels.clear()  # still counted by the declared ones
    _judge(worker)


def test_a_migrate_with_nothing_to_do_takes_no_lock_on_a_through_table(worker: Conn) -> None:
    """migrate installed the triggers of the counters over automatic through tables again
    every time, with the locks CREATE TRIGGER takes: a migrate with nothing to apply waited
    for the application's writes of those tables, and deadlocked with them. It now installs
    them only when they changed."""
    _, stories, labels = _seed()
    with psycopg.connect(dsn()) as app:
        # an application's transaction that wrote the through table and is not done
        app.execute(
            "INSERT INTO press_story_labels (story_id, label_id) VALUES (%s, %s)",
            (stories[0].pk, labels[3].pk),
        )
        with connection.cursor() as cur:
            cur.execute("SET lock_timeout = '2s'")
        try:
            call_command("migrate", verbosity=0)
        finally:
            with connection.cursor() as cur:
                cur.execute("RESET lock_timeout")
        app.commit()
    _judge(worker)


# -- property: random sequences of ORM, bulk and raw-SQL writes -------------------------------

ids = st.integers(min_value=0, max_value=5)
op = st.one_of(
    st.tuples(st.just("remarks"), ids, st.integers(min_value=1, max_value=4), st.booleans()),
    st.tuples(st.just("story"), ids, st.booleans()),
    st.tuples(st.just("move"), ids, ids),
    st.tuples(st.just("move_all"), ids),
    st.tuples(st.just("publish"), ids),
    st.tuples(st.just("flip_public"), ids),
    st.tuples(st.just("add"), ids, ids),
    st.tuples(st.just("remove"), ids, ids),
    st.tuples(st.just("set"), ids, st.lists(ids, max_size=3)),
    st.tuples(st.just("clear"), ids),
    st.tuples(st.just("label_add"), ids, st.lists(ids, max_size=3)),
    st.tuples(st.just("deactivate"), ids),
    st.tuples(st.just("delete_story"), ids),
    st.tuples(st.just("delete_remarks"), ids),
    st.tuples(st.just("delete_label"), ids),
    st.tuples(st.just("delete_writer"), ids),
    st.tuples(st.just("raw_move"), ids, ids),
    st.tuples(st.just("raw_links"), st.integers(min_value=0, max_value=2)),
    st.tuples(st.just("raw_remarks"), st.integers(min_value=0, max_value=2)),
    st.tuples(st.just("drain")),
)


def _pick(rows: list[Any], i: int) -> Any:
    return rows[i % len(rows)] if rows else None


def _apply(step: tuple[Any, ...]) -> None:
    kind = step[0]
    writers = list(Writer.objects.order_by("pk"))
    stories = list(Story.objects.order_by("pk"))
    labels = list(Label.objects.order_by("pk"))
    story = _pick(stories, step[1]) if len(step) > 1 and isinstance(step[1], int) else None
    if kind == "remarks" and story is not None:
        Remark.objects.bulk_create(
            [Remark(story=story, public=step[3], score=n) for n in range(step[2])]
        )
    elif kind == "story":
        Story.objects.create(writer=_pick(writers, step[1]), published=step[2])
    elif kind == "move" and story is not None:
        story.writer = _pick(writers, step[2])
        story.save()
    elif kind == "move_all":
        Story.objects.filter(pk__gt=step[1]).update(writer=_pick(writers, step[1]))
    elif kind == "publish" and story is not None:
        Story.objects.filter(pk=story.pk).update(published=not story.published)
    elif kind == "flip_public":
        Remark.objects.filter(score=step[1]).update(public=Q(public=False))
    elif kind == "add" and story is not None and labels:
        story.labels.add(_pick(labels, step[2]))
    elif kind == "remove" and story is not None and labels:
        story.labels.remove(_pick(labels, step[2]))
    elif kind == "set" and story is not None and labels:
        story.labels.set([_pick(labels, i) for i in step[2]])
    elif kind == "clear" and story is not None:
        story.labels.clear()
    elif kind == "label_add" and labels and stories:
        _pick(labels, step[1]).stories.add(*(_pick(stories, i) for i in step[2]))
    elif kind == "deactivate" and labels:
        label = _pick(labels, step[1])
        label.active = not label.active
        label.save()
    elif kind == "delete_story" and story is not None:
        story.delete()
    elif kind == "delete_remarks":
        Remark.objects.filter(score__gte=step[1]).delete()
    elif kind == "delete_label" and labels:
        _pick(labels, step[1]).delete()
        Label.objects.create(active=True)
    elif kind == "delete_writer" and len(writers) > 1:
        _pick(writers, step[1]).delete()
        Writer.objects.create(name="new")
    elif kind == "raw_move" and story is not None and writers:
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE press_story SET writer_id = %s WHERE id >= %s",
                [_pick(writers, step[2]).pk, story.pk],
            )
    elif kind == "raw_links":
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO press_story_labels (story_id, label_id)"
                " SELECT s.id, l.id FROM press_story AS s, press_label AS l"
                " WHERE (s.id + l.id) %% 3 = %s ON CONFLICT DO NOTHING",
                [step[1]],
            )
    elif kind == "raw_remarks":
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO press_remark (story_id, public, score)"
                " SELECT id, id %% 2 = 0, %s FROM press_story WHERE id %% 3 = %s",
                [step[1], step[1]],
            )
    elif kind == "drain":
        drain()


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=st.lists(op, min_size=1, max_size=14))
def test_random_writes_equal_the_orm_truth(worker: Conn, steps: list[tuple[Any, ...]]) -> None:
    Remark.objects.all().delete()
    Story.objects.all().delete()
    Label.objects.all().delete()
    Writer.objects.all().delete()
    _seed()
    for step in steps:
        _apply(step)
        truth.assert_exact(worker, press_truths())
    _judge(worker)
