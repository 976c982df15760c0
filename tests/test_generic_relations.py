"""generic_relation(): rows attached by (content type, object id) counted per object, without
Django: the content type is looked up by name by each statement, a text object id is cast as
an ORM's join casts it, and a text that does not cast counts nowhere."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from pgcounters import ColumnTarget, Counters, NamedTarget, generic_relation, triggers
from pgcounters.connection import Conn
from pgcounters.errors import InvalidCounterDefinition
from pgcounters.repair import verify


@pytest.fixture
def attached(conn: Conn) -> Conn:
    conn.execute(
        "CREATE TABLE kinds (id serial PRIMARY KEY, app_label text, model text);"
        "CREATE TABLE doc (id uuid PRIMARY KEY, n bigint DEFAULT 0);"
        "CREATE TABLE note (id serial PRIMARY KEY, kind_id integer, ref text, weight integer);"
        "INSERT INTO kinds (app_label, model) VALUES ('x', 'other'), ('app', 'doc')"
    )
    return conn


def test_text_object_ids_key_a_uuid_column_and_a_named_counter(attached: Conn) -> None:
    common: dict[str, Any] = {
        "content_type": ("app", "doc"),
        "content_type_column": "kind_id",
        "object_id_column": "ref",
        "object_id_is_text": True,
        "content_type_table": "kinds",
    }
    triggers.install(
        attached,
        [
            generic_relation(
                "doc.n", "note", ColumnTarget("doc", "n", key_type="uuid"), mode="direct", **common
            ),
            generic_relation("doc.weight", "note", NamedTarget(("uuid",)), sum="weight", **common),
        ],
    )
    a, b = uuid.uuid4(), uuid.uuid4()
    attached.execute("INSERT INTO doc (id) VALUES (%s), (%s)", (a, b))
    # kind 2 is ('app', 'doc'), kind 1 another model
    attached.execute(
        "INSERT INTO note (kind_id, ref, weight) VALUES (2, %s, 2), (2, %s, 3),"
        " (2, %s, 4), (2, 'not a uuid', 5), (1, %s, 6)",
        (str(a), str(a).upper(), str(b), str(a)),
    )
    pc = Counters(attached)
    # upper-case text casts to the same uuid; 'not a uuid' and the other kind count nowhere
    assert attached.execute("SELECT id, n FROM doc ORDER BY n").fetchall() == [(b, 1), (a, 2)]
    assert pc.get("doc.weight", a) == 5
    assert pc.get("doc.weight", b) == 4
    # moved to the other kind: counted nowhere any more
    attached.execute("UPDATE note SET kind_id = 1 WHERE ref = %s", (str(b),))
    assert attached.execute("SELECT n FROM doc WHERE id = %s", (b,)).fetchone() == (0,)
    pc.drain()
    assert verify(attached, "doc.n").mismatches == []
    assert verify(attached, "doc.weight").mismatches == []


def test_a_generic_relation_is_keyed_by_the_object_id_alone() -> None:
    with pytest.raises(InvalidCounterDefinition, match="object id alone"):
        generic_relation("x", "note", NamedTarget(("bigint", "text")), content_type=("a", "b"))
    with pytest.raises(InvalidCounterDefinition, match="app_label, model"):
        generic_relation("x", "note", NamedTarget(("bigint",)), content_type=("a",))  # type: ignore[arg-type]
    with pytest.raises(InvalidCounterDefinition, match="bigint, uuid or text"):
        generic_relation(
            "x", "note", NamedTarget(("date",)), content_type=("a", "b"), object_id_is_text=True
        )
