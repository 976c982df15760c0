"""The admin pages on the blog example, and ``manage.py pgcounters verify|recount``."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from blog.models import Article, Comment, User
from django.contrib.auth.models import Permission
from django.contrib.auth.models import User as AuthUser
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import Client

from pgcounters import Counters
from pgcounters.contrib.django.db import psycopg_connection
from pgcounters.contrib.django.models import Counter, CounterValue
from support import tamper

pytestmark = pytest.mark.django_db(transaction=True)

VIEWS = "blog.article.views"  # a named counter, declared by the blog example's migration 0002
ARTICLE_COMMENTS = "blog.article.public_comments"
VALUES_URL = "/admin/pgcounters/countervalue/"
COUNTERS_URL = "/admin/pgcounters/counter/"
STATUS_URL = "/admin/pgcounters/queuestatus/"


def rows(response: Any) -> dict[tuple[str, tuple[str, ...]], tuple[int, int, int]]:
    """The listed values: (counter, key) -> (stored, pending, exact)."""
    found: list[CounterValue] = list(response.context["cl"].result_list)
    return {
        (v.counter.name, tuple(v.key)): (v.value, v.__dict__["pending"], v.__dict__["exact"])
        for v in found
    }


def test_counter_values_show_stored_pending_and_exact(admin_client: Client) -> None:
    with psycopg_connection() as conn:
        pc = Counters(conn)
        pc.incr(VIEWS, 7101, 5)
        pc.incr(VIEWS, 7102, 2)
        pc.drain()
        pc.incr(VIEWS, 7101, 3)
        pc.incr(VIEWS, 7101, -1)
        exact = pc.get(VIEWS, 7101)
    assert exact == 7
    views = Counter.objects.get(name=VIEWS)

    response = admin_client.get(VALUES_URL, {"q": "710", "counter__id__exact": str(views.id)})
    assert response.status_code == 200
    assert rows(response) == {(VIEWS, ("7101",)): (5, 2, 7), (VIEWS, ("7102",)): (2, 0, 2)}
    html = response.content.decode()
    assert '<td class="field-exact">7</td>' in html
    assert '<td class="field-pending">2</td>' in html
    assert '<td class="field-key_text">7101</td>' in html

    # search by key, filter by counter and by mode
    assert set(rows(admin_client.get(VALUES_URL, {"q": "7102"}))) == {(VIEWS, ("7102",))}
    assert rows(admin_client.get(VALUES_URL, {"q": "7101", "counter__mode": "unlogged"})) == {}
    by_mode = rows(admin_client.get(VALUES_URL, {"q": "7101", "counter__mode": "queued"}))
    assert set(by_mode) == {(VIEWS, ("7101",))}
    # sorted by the exact value, highest first
    ordered = admin_client.get(
        VALUES_URL, {"counter__id__exact": str(views.id), "q": "710", "o": "-5"}
    )
    assert [k for (_, k) in rows(ordered)] == [("7101",), ("7102",)]
    # read-only: no add, change or delete, no bulk actions
    assert admin_client.get(VALUES_URL + "add/").status_code == 403
    assert 'name="action"' not in html


def test_the_counters_page_lists_every_declared_counter(admin_client: Client) -> None:
    user = User.objects.create(username="writer")
    article = Article.objects.create(title="a")
    Comment.objects.bulk_create(
        [Comment(creator=user, article=article, publish_status="public") for _ in range(3)]
    )
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM pgcounters.queue q JOIN pgcounters.targets t"
            " ON t.id = q.target_id WHERE t.name = %s",
            [ARTICLE_COMMENTS],
        )
        queued = cur.fetchone()[0]
    assert queued == 1  # one statement, one article: one delta
    response = admin_client.get(COUNTERS_URL)
    assert response.status_code == 200
    listed = {c.name: c for c in response.context["cl"].result_list}
    assert {VIEWS, ARTICLE_COMMENTS, "blog.users.total"} <= set(listed)
    assert listed[ARTICLE_COMMENTS].__dict__["queued"] == queued
    assert listed[ARTICLE_COMMENTS].where == "public.blog_article.public_comments"
    assert listed[VIEWS].where == "named"
    html = response.content.decode()
    assert f'href="{VALUES_URL}?counter__id__exact={listed[VIEWS].id}"' in html
    assert '<td class="field-key">(global)</td>' in html  # blog.users.total
    searched = admin_client.get(COUNTERS_URL, {"q": "views"})
    assert [c.name for c in searched.context["cl"].result_list] == [VIEWS]


def test_the_queue_status_page(admin_client: Client) -> None:
    index = admin_client.get("/admin/").content.decode()
    assert STATUS_URL in index
    assert "Queue status" in index
    with psycopg_connection() as conn:
        pc = Counters(conn)
        pc.drain()
        pc.incr(VIEWS, 7201, 4)
        pc.incr(VIEWS, 7202, 1)
    response = admin_client.get(STATUS_URL)
    assert response.status_code == 200
    snapshot = response.context["status"]
    assert snapshot.depth == 2
    assert snapshot.counter(VIEWS).pending == 2
    html = response.content.decode()
    assert '<strong id="depth">2</strong>' in html
    assert '<tr class="queue-logged"><td>logged</td><td class="depth">2</td>' in html
    assert f'<tr><td>{VIEWS}</td><td class="pending">2</td>' in html
    assert "pgcounters.queue_unlogged (unlogged)" in html
    assert f'<tr class="state-installed"><td>{ARTICLE_COMMENTS}</td>' in html
    # drift shows: a disabled trigger
    with connection.cursor() as cur:
        cur.execute(
            "SELECT tgname FROM pg_trigger WHERE tgname LIKE %s LIMIT 1",
            ["pgtrigger_pgc_blog_article_public_comments%"],
        )
        name = cur.fetchone()[0]
        cur.execute(f'ALTER TABLE blog_comment DISABLE TRIGGER "{name}"')
        try:
            html = admin_client.get(STATUS_URL).content.decode()
        finally:
            cur.execute(f'ALTER TABLE blog_comment ENABLE TRIGGER "{name}"')
    assert f'<tr class="state-disabled"><td>{ARTICLE_COMMENTS}</td>' in html
    with psycopg_connection() as conn:
        Counters(conn).drain()
    html = admin_client.get(STATUS_URL).content.decode()
    assert '<strong id="depth">0</strong>' in html
    assert "Nothing pending." in html


def test_the_pages_need_staff_with_view_permission(client: Client) -> None:
    assert client.get(STATUS_URL).status_code == 302  # to the login page
    staff = AuthUser.objects.create_user("staff", password="pw", is_staff=True)
    client.force_login(staff)
    assert client.get(STATUS_URL).status_code == 403
    assert client.get(VALUES_URL).status_code == 403
    staff.user_permissions.add(
        Permission.objects.get(codename="view_queuestatus"),
        Permission.objects.get(codename="view_countervalue"),
    )
    assert client.get(STATUS_URL).status_code == 200
    assert client.get(VALUES_URL).status_code == 200


def test_makemigrations_has_nothing_to_add_for_the_app() -> None:
    out = StringIO()
    call_command("makemigrations", "pgcounters", "--check", "--dry-run", stdout=out)
    assert "No changes detected" in out.getvalue()


def test_the_system_checks_accept_the_models_and_admins() -> None:
    out = StringIO()
    call_command("check", stdout=out)  # raises SystemCheckError on any error
    assert "no issues" in out.getvalue()


def test_manage_py_verify_and_recount(capsys: pytest.CaptureFixture[str]) -> None:
    user = User.objects.create(username="u")
    articles = Article.objects.bulk_create([Article(title=f"a{i}") for i in range(3)])
    Comment.objects.bulk_create(
        [Comment(creator=user, article=a, publish_status="public") for a in articles]
    )
    call_command("pgcounters", "drain")
    call_command("pgcounters", "verify", ARTICLE_COMMENTS)
    assert f"{ARTICLE_COMMENTS}: " in capsys.readouterr().out
    with psycopg_connection() as conn:
        tamper(
            conn, "UPDATE blog_article SET public_comments = 40 WHERE id = %s", (articles[1].pk,)
        )
    with pytest.raises(CommandError) as failed:
        call_command("pgcounters", "verify", ARTICLE_COMMENTS, "--json")
    assert failed.value.returncode == 5
    assert '"difference": 39' in capsys.readouterr().out
    call_command("pgcounters", "recount", ARTICLE_COMMENTS, "--batch-size", "2", "--no-progress")
    assert "1 fixed" in capsys.readouterr().out
    call_command("pgcounters", "verify", ARTICLE_COMMENTS)
    articles[1].refresh_from_db()
    assert articles[1].public_comments == 1


def test_the_queue_status_page_shows_what_the_drain_set_aside(admin_client: Client) -> None:
    with psycopg_connection() as conn:
        pc = Counters(conn)
        pc.drain()
        with conn.cursor() as cur:
            cur.execute(
                "INSERT INTO pgcounters.queue (target_id, key, delta) VALUES (%s, '{oops', 1)",
                [pc.counter(VIEWS).id],
            )
        assert pc.drain().quarantined == 1
    try:
        html = admin_client.get(STATUS_URL).content.decode()
        assert "quarantine: 1 deltas set aside" in html
        assert f"{VIEWS}  1 deltas  [22P02]" in html
    finally:
        with connection.cursor() as cur:
            cur.execute("DELETE FROM pgcounters.quarantine")


def test_the_queue_status_page_names_what_holds_the_horizon(admin_client: Client) -> None:
    from test_horizon import Held

    db = connection.settings_dict
    holder = Held(f"host={db['HOST']} port={db['PORT']} user={db['USER']} dbname={db['NAME']}")
    try:
        html = admin_client.get(STATUS_URL).content.decode()
    finally:
        holder.close()
    assert f"session {holder.pid} (nightly report, idle in transaction, since" in html
