"""Counters through a path of tables: rows of a grandchild per ancestor (public comments per
author, through the articles) and many-to-many counts through a link table (published
articles per tag). Each statement on any table of the path is counted exactly, in every
mode: moves of a middle row, conditions on it, deletes in either order (the application's
children first, or the database's ON DELETE CASCADE after the parent), truncates."""

from __future__ import annotations

import random
import threading
from typing import Any

import psycopg
import pytest

import truth
from pgcounters import Counters, triggers
from pgcounters.connection import Conn
from pgcounters.errors import InvalidCounterDefinition
from pgcounters.repair import recount, verify
from pgcounters.specs import ColumnTarget, CounterSpec, Fragment, NamedTarget, Via
from support import wait_for_lock_wait

DDL = """
CREATE TABLE blog_author (
    id bigserial PRIMARY KEY,
    public_comments bigint NOT NULL DEFAULT 0,
    tag_links bigint NOT NULL DEFAULT 0
);
CREATE TABLE blog_article (
    id bigserial PRIMARY KEY,
    author_id bigint REFERENCES blog_author ON DELETE CASCADE,
    published boolean NOT NULL DEFAULT true,
    score integer NOT NULL DEFAULT 0
);
CREATE INDEX ON blog_article (author_id);
CREATE TABLE blog_comment (
    id bigserial PRIMARY KEY,
    article_id bigint REFERENCES blog_article ON DELETE CASCADE,
    public boolean NOT NULL DEFAULT true,
    score integer
);
CREATE INDEX ON blog_comment (article_id);
CREATE TABLE blog_tag (id bigserial PRIMARY KEY);
CREATE TABLE blog_article_tags (
    id bigserial PRIMARY KEY,
    article_id bigint NOT NULL REFERENCES blog_article ON DELETE CASCADE,
    tag_id bigint NOT NULL REFERENCES blog_tag ON DELETE CASCADE,
    UNIQUE (article_id, tag_id)
);
CREATE INDEX ON blog_article_tags (tag_id);
INSERT INTO blog_author (id) SELECT g FROM generate_series(1, 4) AS g;
INSERT INTO blog_tag (id) SELECT g FROM generate_series(1, 4) AS g;
"""

PUBLIC = "blog.author.public_comments"
SCORE = "blog.author_score_published"
TAGS = "blog.tag.published_articles"
TAG_LINKS = "blog.author.tag_links"
MODES = ("queued", "unlogged", "direct")


def specs(mode: Any = "queued") -> list[CounterSpec]:
    return [
        CounterSpec(
            name=PUBLIC,
            source="blog_comment",
            keys=("author_id",),
            via=(Via("blog_article", link="article_id"),),
            target=ColumnTarget("blog_author", "public_comments"),
            where=Fragment('"blog_comment".public'),
            mode=mode,
        ),
        CounterSpec(
            name=SCORE,
            source="blog_comment",
            keys=("author_id",),
            via=(Via("blog_article", "article_id", where=Fragment('"blog_article".published')),),
            target=NamedTarget(("bigint",)),
            sum="score",
            mode=mode,
        ),
        CounterSpec(
            name=TAGS,
            source="blog_article_tags",
            keys=(Fragment('"blog_article_tags".tag_id'),),
            via=(Via("blog_article", "article_id", where=Fragment('"blog_article".published')),),
            target=NamedTarget(("bigint",)),
            mode=mode,
        ),
        # a many-to-many with more levels: the (article, tag) links of each author's
        # published articles (Author <- Article <-> Tag)
        CounterSpec(
            name=TAG_LINKS,
            source="blog_article_tags",
            keys=("author_id",),
            via=(Via("blog_article", "article_id", where=Fragment('"blog_article".published')),),
            target=ColumnTarget("blog_author", "tag_links"),
            mode=mode,
        ),
    ]


TRUTHS = [
    truth.from_sql(
        PUBLIC,
        "SELECT u.id, count(c.id) FROM blog_author AS u LEFT JOIN blog_article AS a"
        " ON a.author_id = u.id LEFT JOIN blog_comment AS c ON c.article_id = a.id AND c.public"
        " GROUP BY u.id",
        stored="SELECT id, public_comments FROM blog_author",
    ),
    truth.from_sql(
        SCORE,
        "SELECT a.author_id, sum(c.score) FROM blog_comment AS c JOIN blog_article AS a"
        " ON a.id = c.article_id WHERE a.published AND a.author_id IS NOT NULL"
        " GROUP BY a.author_id",
    ),
    truth.from_sql(
        TAGS,
        "SELECT t.tag_id, count(*) FROM blog_article_tags AS t JOIN blog_article AS a"
        " ON a.id = t.article_id WHERE a.published GROUP BY t.tag_id",
    ),
    truth.from_sql(
        TAG_LINKS,
        "SELECT u.id, count(t.id) FROM blog_author AS u LEFT JOIN blog_article AS a"
        " ON a.author_id = u.id AND a.published LEFT JOIN blog_article_tags AS t"
        " ON t.article_id = a.id GROUP BY u.id",
        stored="SELECT id, tag_links FROM blog_author",
    ),
]


def _blog(conn: Conn, mode: str = "queued") -> Counters:
    conn.execute(DDL)
    triggers.install(conn, specs(mode))
    return Counters(conn)


def _seed(conn: Conn) -> None:
    conn.execute(
        "INSERT INTO blog_article (id, author_id, published) VALUES"
        " (1, 1, true), (2, 1, false), (3, 2, true), (4, 3, true)"
    )
    conn.execute("SELECT setval('blog_article_id_seq', 10)")
    conn.execute(
        "INSERT INTO blog_comment (article_id, public, score)"
        " SELECT 1 + g % 4, g % 3 <> 0, g FROM generate_series(1, 40) AS g"
    )
    conn.execute(
        "INSERT INTO blog_article_tags (article_id, tag_id)"
        " SELECT a, t FROM generate_series(1, 4) AS a, generate_series(1, 3) AS t WHERE a <> t"
    )


def _check(conn: Conn) -> None:
    truth.assert_exact(conn, TRUTHS)
    truth.assert_drained(conn, TRUTHS)
    for name in (PUBLIC, SCORE, TAGS, TAG_LINKS):
        assert verify(conn, name).mismatches == []


@pytest.mark.parametrize("mode", MODES)
def test_comments_count_per_author_through_articles(conn: Conn, mode: str) -> None:
    pc = _blog(conn, mode)
    _seed(conn)
    truth.assert_exact(conn, TRUTHS)
    assert pc.get(PUBLIC, 1) == 14  # articles 1 and 2: 7 public comments each
    # a move of an article takes all its comments to the other author
    conn.execute("UPDATE blog_article SET author_id = 4 WHERE id = 1")
    truth.assert_exact(conn, TRUTHS)
    # unpublishing an article takes its comments' scores and its tags away
    conn.execute("UPDATE blog_article SET published = NOT published")
    truth.assert_exact(conn, TRUTHS)
    # comments moved between articles, conditions flipped
    conn.execute("UPDATE blog_comment SET article_id = 3, public = NOT public WHERE id % 5 = 0")
    conn.execute("UPDATE blog_article SET author_id = NULL WHERE id = 4")
    _check(conn)


@pytest.mark.parametrize("mode", MODES)
def test_database_cascade_after_the_parent_is_exact(conn: Conn, mode: str) -> None:
    """ON DELETE CASCADE deletes the comments after their article is gone: the article's
    trigger takes their contribution away before it goes, theirs count nothing."""
    _blog(conn, mode)
    _seed(conn)
    conn.execute("DELETE FROM blog_article WHERE id IN (1, 3)")
    truth.assert_exact(conn, TRUTHS)
    conn.execute("DELETE FROM blog_author WHERE id = 3")  # two levels of cascade
    _check(conn)
    assert conn.execute("SELECT count(*) FROM blog_comment").fetchone() == (10,)


@pytest.mark.parametrize("mode", MODES)
def test_children_deleted_first_then_the_parent_is_exact(conn: Conn, mode: str) -> None:
    """The application's order (Django's collector): the comments first, then the article."""
    _blog(conn, mode)
    _seed(conn)
    with conn.transaction():
        conn.execute("DELETE FROM blog_comment WHERE article_id = 1")
        conn.execute("DELETE FROM blog_article_tags WHERE article_id = 1")
        conn.execute("DELETE FROM blog_article WHERE id = 1")
    _check(conn)


@pytest.mark.parametrize("mode", MODES)
def test_set_null_and_dangling_rows_are_exact(conn: Conn, mode: str) -> None:
    conn.execute(DDL)
    conn.execute(
        "ALTER TABLE blog_comment DROP CONSTRAINT blog_comment_article_id_fkey,"
        " ADD FOREIGN KEY (article_id) REFERENCES blog_article ON DELETE SET NULL"
    )
    triggers.install(conn, specs(mode))
    _seed(conn)
    conn.execute("DELETE FROM blog_article WHERE id = 3")
    truth.assert_exact(conn, TRUTHS)
    # no foreign key at all: a comment may name an article that comes later
    conn.execute("ALTER TABLE blog_comment DROP CONSTRAINT blog_comment_article_id_fkey")
    conn.execute("INSERT INTO blog_comment (article_id, score) VALUES (20, 5), (20, 6)")
    truth.assert_exact(conn, TRUTHS)
    conn.execute("INSERT INTO blog_article (id, author_id) VALUES (20, 2)")
    truth.assert_exact(conn, TRUTHS)
    conn.execute("DELETE FROM blog_article WHERE id = 20")  # the comments stay, uncounted
    _check(conn)


@pytest.mark.parametrize("mode", MODES)
def test_truncate_of_a_middle_table_resets(conn: Conn, mode: str) -> None:
    _blog(conn, mode)
    _seed(conn)
    conn.execute("TRUNCATE blog_article CASCADE")
    _check(conn)
    _seed(conn)
    _check(conn)


@pytest.mark.parametrize("mode", MODES)
def test_random_writes_on_every_table_equal_the_truth(conn: Conn, mode: str) -> None:
    pc = _blog(conn, mode)
    _seed(conn)
    rnd = random.Random(f"paths-{mode}")
    for step in range(80):
        choice = rnd.random()
        a, u, t = rnd.randint(1, 12), rnd.randint(1, 4), rnd.randint(1, 4)
        if choice < 0.15:
            conn.execute(
                "INSERT INTO blog_comment (article_id, public, score)"
                " SELECT a.id, g %% 2 = 0, g FROM blog_article AS a, generate_series(1, %s) AS g"
                " WHERE a.id = %s",
                (rnd.randint(1, 6), a),
            )
        elif choice < 0.25:
            conn.execute(
                "INSERT INTO blog_article (author_id, published)"
                " VALUES ((SELECT max(id) FROM blog_author WHERE id <= %s), %s)",
                (u, rnd.random() < 0.5),
            )
        elif choice < 0.4:
            conn.execute(
                "UPDATE blog_article SET author_id = (SELECT max(id) FROM blog_author"
                " WHERE id <= %s) WHERE id %% 3 = %s",
                (u, a % 3),
            )
        elif choice < 0.5:
            conn.execute("UPDATE blog_article SET published = NOT published WHERE id = %s", (a,))
        elif choice < 0.6:
            conn.execute(
                "UPDATE blog_comment SET article_id = %s, public = NOT public WHERE id %% 4 = %s"
                " AND EXISTS (SELECT 1 FROM blog_article WHERE id = %s)",
                (a, t % 4, a),
            )
        elif choice < 0.7:
            conn.execute(
                "INSERT INTO blog_article_tags (article_id, tag_id) SELECT id, %s"
                " FROM blog_article WHERE id %% 2 = %s ON CONFLICT DO NOTHING",
                (t, a % 2),
            )
        elif choice < 0.78:
            conn.execute("DELETE FROM blog_article_tags WHERE tag_id = %s", (t,))
        elif choice < 0.86:
            conn.execute("DELETE FROM blog_article WHERE id = %s", (a,))
        elif choice < 0.9:
            conn.execute("DELETE FROM blog_tag WHERE id = %s", (t,))
            conn.execute("INSERT INTO blog_tag (id) VALUES (%s)", (t,))
        elif choice < 0.95:
            conn.execute("DELETE FROM blog_comment WHERE id %% 7 = %s", (a % 7,))
        else:
            # (not created again with its id: its column would get the deltas of the old row)
            conn.execute("DELETE FROM blog_author WHERE id = %s AND id > 1", (u,))
        if step % 25 == 24:
            pc.drain()
    truth.assert_exact(conn, TRUTHS)
    _check(conn)


def test_recount_repairs_a_path_counter(conn: Conn) -> None:
    _blog(conn)
    _seed(conn)
    with triggers.paused(conn):
        conn.execute("UPDATE blog_article SET author_id = 2")
    assert verify(conn, PUBLIC).mismatches != []
    for name in (PUBLIC, SCORE, TAGS, TAG_LINKS):
        recount(conn, name)
    _check(conn)


def test_install_backfills_rows_already_there(conn: Conn) -> None:
    conn.execute(DDL)
    _seed(conn)
    triggers.install(conn, specs())
    _check(conn)


def test_a_path_is_checked() -> None:
    with pytest.raises(InvalidCounterDefinition, match="appears once"):
        CounterSpec(
            name="x.y",
            source="blog_comment",
            keys=("id",),
            via=(Via("blog_comment", "parent_id"),),
            target=NamedTarget(("bigint",)),
        )
    with pytest.raises(InvalidCounterDefinition, match="at most 3"):
        CounterSpec(
            name="x.y",
            source="a",
            keys=("id",),
            via=tuple(Via(f"t{i}", "l") for i in range(4)),
            target=NamedTarget(("bigint",)),
        )
    spec = specs()[0]
    assert CounterSpec.from_json(spec.to_json()) == spec
    assert "via" not in CounterSpec("x.y", "a", NamedTarget()).to_json()


def test_a_path_that_does_not_compile_is_refused(conn: Conn) -> None:
    conn.execute(DDL)
    bad = CounterSpec(
        name="x.y",
        source="blog_comment",
        keys=("author_id",),
        via=(Via("blog_article", "no_such_column"),),
        target=NamedTarget(("bigint",)),
    )
    with pytest.raises(InvalidCounterDefinition, match="no_such_column"):
        triggers.install(conn, [bad])
    assert triggers.declared(conn) == []


def test_a_change_to_a_middle_table_that_breaks_a_counter_is_refused(conn: Conn) -> None:
    _blog(conn)
    with pytest.raises(
        psycopg.Error, match=r"breaks counter blog\.author(_score_published|\.tag_links)"
    ):
        conn.execute("ALTER TABLE blog_article DROP COLUMN published")
    with pytest.raises(psycopg.Error, match=r"breaks counter blog\.author\.public_comments"):
        conn.execute("ALTER TABLE blog_article RENAME COLUMN author_id TO writer_id")
    conn.execute("ALTER TABLE blog_article ADD COLUMN title text")  # harmless: allowed
    assert all(d.ok for d in triggers.drift(conn))


def test_uninstall_removes_the_triggers_of_the_path(conn: Conn) -> None:
    _blog(conn)
    on_articles = "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'blog_article'::regclass"
    assert conn.execute(on_articles + " AND NOT tgisinternal").fetchone() == (20,)
    for name in (PUBLIC, SCORE, TAGS, TAG_LINKS):
        assert triggers.uninstall(conn, name, drop_values=True)
    assert conn.execute(on_articles + " AND NOT tgisinternal").fetchone() == (0,)
    assert triggers.installed(conn) == []
    conn.execute("DELETE FROM blog_article")  # nothing left to fire


@pytest.mark.parametrize("order", ["insert first", "move first"])
def test_a_move_beside_an_insert_under_it_is_exact(dsn: str, conn: Conn, order: str) -> None:
    """A transaction adds comments to an article while another moves the article to another
    author: whichever goes first, the other waits for it (the share lock the comments' trigger
    takes on the article), then counts through the article as the first left it."""
    _blog(conn)
    _seed(conn)
    insert = (
        "INSERT INTO blog_comment (article_id, public, score) VALUES (1, true, 5), (1, true, 6)"
    )
    move = "UPDATE blog_article SET author_id = 3 WHERE id = 1"
    first_sql, second_sql = (insert, move) if order == "insert first" else (move, insert)
    with psycopg.connect(dsn) as first, psycopg.connect(dsn, autocommit=True) as second:
        first.execute(first_sql)  # its transaction stays open
        pid = second.info.backend_pid
        errors: list[BaseException] = []

        def run() -> None:
            try:
                second.execute(second_sql)
            except BaseException as exc:  # reported below
                errors.append(exc)

        thread = threading.Thread(target=run)
        thread.start()
        wait_for_lock_wait(conn, pid)
        first.commit()
        thread.join()
        assert errors == []
    _check(conn)


DEEP_DDL = """
CREATE TABLE t_owner (id bigint PRIMARY KEY, notes bigint NOT NULL DEFAULT 0);
CREATE TABLE t_blog (
    id bigint PRIMARY KEY, owner_id bigint REFERENCES t_owner ON DELETE CASCADE,
    active boolean NOT NULL DEFAULT true
);
CREATE TABLE t_post (id bigint PRIMARY KEY, blog_id bigint REFERENCES t_blog ON DELETE CASCADE);
CREATE TABLE t_note (id bigserial PRIMARY KEY, post_id bigint REFERENCES t_post ON DELETE CASCADE);
CREATE INDEX ON t_blog (owner_id);
CREATE INDEX ON t_post (blog_id);
CREATE INDEX ON t_note (post_id);
INSERT INTO t_owner (id) SELECT g FROM generate_series(1, 3) AS g;
INSERT INTO t_blog (id, owner_id, active)
    SELECT g, 1 + g % 3, g % 4 <> 0 FROM generate_series(1, 8) AS g;
INSERT INTO t_post (id, blog_id) SELECT g, 1 + g % 8 FROM generate_series(1, 20) AS g;
INSERT INTO t_note (post_id) SELECT 1 + g % 20 FROM generate_series(1, 100) AS g;
"""
DEEP = "t.owner.notes"
DEEP_TRUTH = truth.from_sql(
    DEEP,
    "SELECT o.id, count(n.id) FROM t_owner AS o LEFT JOIN t_blog AS b"
    " ON b.owner_id = o.id AND b.active LEFT JOIN t_post AS p ON p.blog_id = b.id"
    " LEFT JOIN t_note AS n ON n.post_id = p.id GROUP BY o.id",
    stored="SELECT id, notes FROM t_owner",
)


@pytest.mark.parametrize("mode", MODES)
def test_a_three_level_path_is_exact_through_moves_and_cascades(conn: Conn, mode: Any) -> None:
    conn.execute(DEEP_DDL)
    spec = CounterSpec(
        name=DEEP,
        source="t_note",
        keys=("owner_id",),
        via=(
            Via("t_post", "post_id"),
            Via("t_blog", "blog_id", where=Fragment('"t_blog".active')),
        ),
        target=ColumnTarget("t_owner", "notes"),
        mode=mode,
    )
    triggers.install(conn, [spec])  # backfilled: the notes were there before
    truth.assert_exact(conn, [DEEP_TRUTH])
    conn.execute("UPDATE t_blog SET owner_id = 3 WHERE id IN (1, 2)")  # the top moves
    conn.execute("UPDATE t_post SET blog_id = 4 WHERE id % 5 = 0")  # the middle moves
    conn.execute("UPDATE t_blog SET active = NOT active")
    truth.assert_exact(conn, [DEEP_TRUTH])
    conn.execute("DELETE FROM t_blog WHERE id = 3")  # cascades two levels down
    conn.execute("DELETE FROM t_post WHERE id = 7")
    with conn.transaction():  # the application's order: the children first
        conn.execute(
            "DELETE FROM t_note WHERE post_id IN (SELECT id FROM t_post WHERE blog_id = 5)"
        )
        conn.execute("DELETE FROM t_post WHERE blog_id = 5")
        conn.execute("DELETE FROM t_blog WHERE id = 5")
    conn.execute("INSERT INTO t_note (post_id) SELECT id FROM t_post")
    truth.assert_exact(conn, [DEEP_TRUTH])
    truth.assert_drained(conn, [DEEP_TRUTH])
    assert verify(conn, DEEP).mismatches == []
    assert conn.execute("SELECT count(*) FROM t_note").fetchone() != (0,)


def test_a_path_counter_per_day_takes_the_counted_rows_time(conn: Conn) -> None:
    """Comments per author per day, through the articles, when both tables have a
    `created_at`: the period is the comment's, not the article's (nor an ambiguous name)."""
    import datetime as dt

    from pgcounters.specs import Bucket

    conn.execute(DDL)
    conn.execute(
        "ALTER TABLE blog_article ADD COLUMN created_at timestamptz NOT NULL"
        " DEFAULT '2026-01-01 12:00+00';"
        "ALTER TABLE blog_comment ADD COLUMN created_at timestamptz NOT NULL"
        " DEFAULT '2026-03-05 12:00+00'"
    )
    name = "blog.author.comments_per_day"
    triggers.install(
        conn,
        [
            CounterSpec(
                name=name,
                source="blog_comment",
                keys=("author_id",),
                via=(Via("blog_article", link="article_id"),),
                target=NamedTarget(("bigint",)),
                bucket=Bucket("created_at", "day", time_zone="UTC"),
            )
        ],
    )
    conn.execute("INSERT INTO blog_article (id, author_id) VALUES (1, 1), (2, 2)")
    conn.execute(
        "INSERT INTO blog_comment (article_id, created_at) VALUES"
        " (1, '2026-03-05 10:00+00'), (1, '2026-03-06 10:00+00'), (2, '2026-03-06 23:00+00')"
    )
    pc = Counters(conn)
    day = dt.date(2026, 3, 5)
    assert pc.get_series(name, 1, day, day + dt.timedelta(days=2)) == [
        (day, 1),
        (day + dt.timedelta(days=1), 1),
    ]
    assert pc.get_range(name, 2, day, day + dt.timedelta(days=2)) == 1
    assert pc.get_range(name, 1, dt.date(2026, 1, 1), dt.date(2026, 1, 2)) == 0
    conn.execute("UPDATE blog_article SET author_id = 2 WHERE id = 1")  # a move of the article
    assert pc.get_range(name, 2, day, day + dt.timedelta(days=2)) == 3
    assert pc.get_range(name, 1, day, day + dt.timedelta(days=2)) == 0
    assert verify(conn, name).mismatches == []


CASCADE_KEYS = """
ALTER TABLE blog_article DROP CONSTRAINT blog_article_author_id_fkey,
    ADD FOREIGN KEY (author_id) REFERENCES blog_author ON DELETE CASCADE ON UPDATE CASCADE;
ALTER TABLE blog_comment DROP CONSTRAINT blog_comment_article_id_fkey,
    ADD FOREIGN KEY (article_id) REFERENCES blog_article ON DELETE CASCADE ON UPDATE CASCADE;
ALTER TABLE blog_article_tags DROP CONSTRAINT blog_article_tags_article_id_fkey,
    ADD FOREIGN KEY (article_id) REFERENCES blog_article ON DELETE CASCADE ON UPDATE CASCADE;
"""
NO_LINKS = """
ALTER TABLE blog_comment DROP CONSTRAINT blog_comment_article_id_fkey;
ALTER TABLE blog_article_tags DROP CONSTRAINT blog_article_tags_article_id_fkey;
"""


@pytest.mark.parametrize("mode", MODES)
def test_a_middle_row_whose_key_cascades_is_exact(conn: Conn, mode: str) -> None:
    """ON UPDATE CASCADE moves the comments of an article whose id changes before any
    statement trigger of the update runs: the article's row trigger counts the change while
    the comments still point to its old id, the comments' own trigger their move."""
    conn.execute(DDL)
    conn.execute(CASCADE_KEYS)
    triggers.install(conn, specs(mode))
    _seed(conn)
    conn.execute("UPDATE blog_article SET id = id + 100 WHERE id IN (1, 3)")
    truth.assert_exact(conn, TRUTHS)
    # a new id and another author at once; an id changed with the rest of the table's rows
    conn.execute("UPDATE blog_article SET id = 1002, author_id = 4 WHERE id = 2")
    conn.execute("UPDATE blog_article SET id = id + 5000, published = NOT published")
    truth.assert_exact(conn, TRUTHS)
    # the id of an author: the articles follow it, and so does what counts through them
    conn.execute("UPDATE blog_author SET id = 40 WHERE id = 2")
    conn.execute("UPDATE blog_author SET id = id + 100")
    truth.assert_exact(conn, TRUTHS)
    conn.execute("INSERT INTO blog_comment (article_id, public, score) VALUES (5103, true, 9)")
    _check(conn)
    assert conn.execute("SELECT public_comments FROM blog_author WHERE id = 140").fetchone() == (8,)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("order", ["article first", "children first"])
def test_a_key_changed_by_the_application_is_exact_in_either_order(
    conn: Conn, mode: str, order: str
) -> None:
    """Without a cascade the application changes the article's id and its comments' (and
    tags') article_id in two statements, in either order."""
    conn.execute(DDL)
    conn.execute(NO_LINKS)
    triggers.install(conn, specs(mode))
    _seed(conn)
    article = "UPDATE blog_article SET id = 70 WHERE id = 1"
    children = [
        "UPDATE blog_comment SET article_id = 70 WHERE article_id = 1",
        "UPDATE blog_article_tags SET article_id = 70 WHERE article_id = 1",
    ]
    statements = [article, *children] if order == "article first" else [*children, article]
    with conn.transaction():
        for statement in statements:
            conn.execute(statement)
            truth.assert_exact(conn, TRUTHS)
    _check(conn)


def test_an_update_that_shifts_keys_onto_each_other_is_refused(conn: Conn) -> None:
    """`id = id + 1` gives a row the id another row of the statement had: the statement
    trigger cannot tell the rows apart, so it refuses the statement (nothing is written)."""
    conn.execute(DDL)
    conn.execute(CASCADE_KEYS)
    triggers.install(conn, specs("direct"))
    conn.execute("INSERT INTO blog_article (id, author_id) VALUES (21, 1), (20, 2)")
    conn.execute("INSERT INTO blog_comment (article_id) VALUES (20), (21), (21)")
    # the rows are visited in the order written: 21 becomes 22, then 20 becomes 21
    with pytest.raises(psycopg.errors.FeatureNotSupported, match="the id another of its rows"):
        conn.execute("UPDATE blog_article SET id = id + 1 WHERE id IN (20, 21)")
    assert conn.execute("SELECT array_agg(id ORDER BY id) FROM blog_article").fetchone() == (
        [20, 21],
    )
    _check(conn)


def test_a_key_change_beside_an_insert_under_the_row_is_exact(dsn: str, conn: Conn) -> None:
    """A transaction adds comments to an article while another changes the article's id
    (ON UPDATE CASCADE): the change waits for the insert, then moves its comments too."""
    conn.execute(DDL)
    conn.execute(CASCADE_KEYS)
    triggers.install(conn, specs("queued"))
    _seed(conn)
    with psycopg.connect(dsn) as first, psycopg.connect(dsn, autocommit=True) as second:
        first.execute("INSERT INTO blog_comment (article_id, score) VALUES (1, 5), (1, 6)")
        pid = second.info.backend_pid
        errors: list[BaseException] = []

        def run() -> None:
            try:
                second.execute("UPDATE blog_article SET id = 90, author_id = 3 WHERE id = 1")
            except BaseException as exc:  # reported below
                errors.append(exc)

        thread = threading.Thread(target=run)
        thread.start()
        wait_for_lock_wait(conn, pid)
        first.commit()
        thread.join()
        assert errors == []
    assert conn.execute("SELECT count(*) FROM blog_comment WHERE article_id = 90").fetchone() == (
        12,
    )
    _check(conn)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("cascade", [True, False])
def test_a_parent_whose_key_changes_keeps_the_count_of_its_rows(
    conn: Conn, mode: Any, cascade: bool
) -> None:
    """A counter column of one foreign key (articles per author): the author's id changes,
    its articles follow it (ON UPDATE CASCADE, or the application's own update after it)."""
    conn.execute(
        "CREATE TABLE p_author (id bigint PRIMARY KEY, articles bigint NOT NULL DEFAULT 0);"
        "CREATE TABLE p_article (id bigserial PRIMARY KEY, author_id bigint);"
        "INSERT INTO p_author (id) VALUES (1), (2);"
        "INSERT INTO p_article (author_id) VALUES (1), (1), (1), (2)"
    )
    if cascade:
        conn.execute(
            "ALTER TABLE p_article ADD FOREIGN KEY (author_id) REFERENCES p_author"
            " ON UPDATE CASCADE"
        )
    name = "p.author.articles"
    triggers.install(
        conn,
        [
            CounterSpec(
                name,
                "p_article",
                ColumnTarget("p_author", "articles"),
                keys="author_id",
                mode=mode,
            )
        ],
    )
    counted = truth.from_sql(
        name,
        "SELECT u.id, count(a.id) FROM p_author AS u LEFT JOIN p_article AS a"
        " ON a.author_id = u.id GROUP BY u.id",
        stored="SELECT id, articles FROM p_author",
    )
    with conn.transaction():
        conn.execute("UPDATE p_author SET id = 10 WHERE id = 1")
        if not cascade:
            truth.assert_exact(conn, [counted])  # the articles point to no author: 0
            conn.execute("UPDATE p_article SET author_id = 10 WHERE author_id = 1")
    truth.assert_exact(conn, [counted])
    truth.assert_drained(conn, [counted])
    assert conn.execute("SELECT articles FROM p_author WHERE id = 10").fetchone() == (3,)


@pytest.mark.parametrize("mode", MODES)
def test_random_key_changes_beside_other_writes_equal_the_truth(conn: Conn, mode: str) -> None:
    """Statements that change some articles' ids (cascaded to their comments and tags) and
    other columns of other articles at once, among ordinary writes, in random order."""
    conn.execute(DDL)
    conn.execute(CASCADE_KEYS)
    pc = Counters(conn)
    triggers.install(conn, specs(mode))
    _seed(conn)
    rnd = random.Random(f"keys-{mode}")
    for step in range(40):
        choice, a, u = rnd.random(), rnd.randint(0, 3), rnd.randint(1, 4)
        if choice < 0.35:
            # one statement: some rows get a new id, the others are unpublished or moved
            conn.execute(
                "UPDATE blog_article SET id = CASE WHEN id %% 4 = %s THEN id + 1000 ELSE id END,"
                " published = CASE WHEN id %% 4 = %s THEN published ELSE NOT published END,"
                " author_id = CASE WHEN id %% 3 = 0"
                " THEN (SELECT id FROM blog_author ORDER BY id OFFSET %s LIMIT 1)"
                " ELSE author_id END",
                (a, a, u - 1),
            )
        elif choice < 0.5:
            conn.execute(
                "UPDATE blog_author SET id = id + 100 WHERE id = (SELECT min(id) FROM blog_author"
                " WHERE id > 1)"
            )
        elif choice < 0.7:
            conn.execute(
                "INSERT INTO blog_comment (article_id, public, score)"
                " SELECT id, id %% 2 = 0, %s FROM blog_article WHERE id %% 4 = %s",
                (step, a),
            )
        elif choice < 0.85:
            conn.execute(
                "INSERT INTO blog_article_tags (article_id, tag_id) SELECT id, %s"
                " FROM blog_article WHERE id %% 2 = %s ON CONFLICT DO NOTHING",
                (u, a % 2),
            )
        elif choice < 0.95:
            conn.execute("DELETE FROM blog_article WHERE id %% 7 = %s", (a,))
        else:
            pc.drain()
        truth.assert_exact(conn, TRUTHS)
    _check(conn)
