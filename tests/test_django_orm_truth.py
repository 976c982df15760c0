"""``manage.py pgcounters verify --truth orm``: counters declared on models checked against the
ORM's own count, judged in turn against the hand-written ORM truths of django_support."""

from __future__ import annotations

import json
from typing import Any

import pytest
from blog.models import Article, Comment, Notification, User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

import truth
from django_support import assert_exact, drain, orm_truths
from oddnames.models import Item, Owner
from pgcounters.contrib.django import declared_counters
from pgcounters.contrib.django.db import psycopg_connection
from pgcounters.contrib.django.orm_truth import verify_orm
from pgcounters.errors import UnknownCounter
from support import tamper

pytestmark = pytest.mark.django_db(transaction=True)

ARTICLE_COMMENTS = "blog.article.public_comments"
PUBLIC_SCORE = "blog.article.public_score"


def _writes() -> list[Article]:
    users = User.objects.bulk_create([User(username=f"u{i}") for i in range(3)])
    articles = Article.objects.bulk_create([Article(title=f"a{i}") for i in range(4)])
    Comment.objects.bulk_create(
        [
            Comment(
                creator=users[i % 3],
                article=articles[i % 4] if i % 5 else None,
                publish_status="public" if i % 3 else "private",
                score=i,
            )
            for i in range(40)
        ]
    )
    Comment.objects.filter(score__lt=10).update(publish_status="public")
    Comment.objects.filter(score__gt=35).delete()
    Notification.objects.bulk_create(
        [Notification(user=users[i % 3], read=i % 2 == 0) for i in range(9)]
    )
    owners = Owner.objects.bulk_create([Owner(name=f"o{i}") for i in range(2)])
    Item.objects.bulk_create(
        [Item(owner=owners[i % 2], state="on" if i % 3 else "off", size=i) for i in range(7)]
    )
    return articles


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    try:
        call_command("pgcounters", "verify", *args)
        code = 0
    except CommandError as exc:
        code = exc.returncode
    out, err = capsys.readouterr()
    return code, out, err


def _verify(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code, out, _ = _run(capsys, *args)
    return code, out


def test_every_declared_counter_is_exact_by_the_orms_count(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _writes()
    assert_exact()  # the hand-written truths agree before the drain ...
    results = verify_orm()
    assert {r.name for r in results} == {spec.name for _, spec in declared_counters()}
    assert all(r.ok for r in results)
    assert sum(r.keys_checked for r in results) > 10
    drain()
    assert_exact(stored=True)  # ... and after it
    code, out = _verify(capsys, "--truth", "orm")
    assert code == 0, out
    assert "truth: the ORM's own count" in out
    assert f"all exact: {len(results)} counters" in out


def test_drift_is_reported_key_by_key_as_the_hand_written_truth_finds_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    articles = _writes()
    drain()
    broken = articles[2].pk
    with psycopg_connection() as conn:  # an operator's direct UPDATE, past the guard
        tamper(
            conn,
            "UPDATE blog_article SET public_comments = public_comments + 7,"
            " public_score = public_score - 2 WHERE id = %s",
            [broken],
        )
    with psycopg_connection() as conn:
        wrong = {
            (m.counter, m.key, m.truth, m.found)
            for t in orm_truths()
            for m in truth.exact_mismatches(conn, t)
        }
    assert {(c, k) for c, k, _, _ in wrong} == {
        (ARTICLE_COMMENTS, (broken,)),
        (PUBLIC_SCORE, (broken,)),
    }
    reported = {(r.name, m.key, m.expected, m.actual) for r in verify_orm() for m in r.mismatches}
    assert reported == wrong
    code, out = _verify(capsys, ARTICLE_COMMENTS, PUBLIC_SCORE, "--truth", "orm", "--json")
    assert code == 5
    report: dict[str, Any] = json.loads(out)
    assert report["truth"].startswith("the ORM's own count")
    assert [(c["name"], c["keys_off"]) for c in report["counters"]] == [
        (ARTICLE_COMMENTS, 1),
        (PUBLIC_SCORE, 1),
    ]
    assert report["counters"][0]["differences"][0]["difference"] == 7
    # the spec's truth agrees here; recount repairs, and both truths then pass
    assert _verify(capsys, ARTICLE_COMMENTS)[0] == 5
    call_command("pgcounters", "recount", "--no-progress")
    capsys.readouterr()
    assert _verify(capsys, "--truth", "orm")[0] == 0
    assert_exact(stored=True)


def test_a_key_pgcounters_holds_that_the_orm_never_counts_is_drift(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _writes()
    drain()
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO pgcounters.queue (target_id, key, delta)"
            " SELECT id, '{\"no such state\"}', 3 FROM pgcounters.targets"
            " WHERE name = 'oddnames.items.by_state'"
        )
    [result] = verify_orm(["oddnames.items.by_state"])
    assert [(m.key, m.expected, m.actual) for m in result.mismatches] == [
        (("no such state",), 0, 3)
    ]


def test_unknown_counters_and_bad_truths_are_clear_errors(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(UnknownCounter, match="no counter declared on a Django model"):
        verify_orm(["blog.article.views"])  # a counter, but not declared on a model
    code, _, err = _run(capsys, "blog.article.views", "--truth", "orm")
    assert code == 1
    assert err.startswith("manage.py pgcounters: error: no counter declared on a Django model")
    code, out, err = _run(capsys, "--truth", "guess")
    assert (code, out) == (2, "")
    assert err == "manage.py pgcounters: error: --truth must be one of spec, orm, got 'guess'\n"
    # --truth spec is the default verify
    assert _verify(capsys, "--truth", "spec")[0] == 0


def test_a_negative_show_is_bad_usage(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "--truth", "orm", "--show", "-1")
    assert (code, out) == (2, "")
    assert err == "manage.py pgcounters: error: argument --show: must be zero or more, got '-1'\n"
