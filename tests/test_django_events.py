"""Event counters in Django: counted on commit, the three paths, the flush command, the example."""

from __future__ import annotations

from collections.abc import Iterator
from io import StringIO
from pathlib import Path

import pytest
from blog.models import Article
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.db import transaction
from django.test import Client, override_settings

from pgcounters import Counters
from pgcounters.contrib.django import events
from pgcounters.contrib.django.db import psycopg_connection
from pgcounters.demos.redis_server import EmbeddedRedis
from pgcounters.errors import ConfigurationError, InvalidKey, UnknownCounter

pytestmark = pytest.mark.django_db(transaction=True)

VIEWS = "blog.article.views"  # declared by the blog example's migration 0002


def db_value(key: int) -> int:
    with psycopg_connection() as conn:
        return Counters(conn).get(VIEWS, key)


@pytest.fixture(autouse=True)
def fresh_buffers() -> Iterator[None]:
    yield
    events.reset()


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    with EmbeddedRedis(tmp_path / "redis") as server:
        yield server.url()


def rolled_back_view(key: int) -> None:
    with transaction.atomic():
        events.count_event(VIEWS, key)
        raise RuntimeError("the request failed")


@pytest.mark.parametrize(("path", "key"), [("direct", 10**9 + 1), ("batching", 10**9 + 2)])
def test_counted_only_when_the_transaction_commits(path: str, key: int) -> None:
    # the queue is not a Django table: each test counts under a key of its own
    with override_settings(PGCOUNTERS_EVENTS=path, PGCOUNTERS_BATCHING={"interval": None}):
        with pytest.raises(RuntimeError):
            rolled_back_view(key)
        with transaction.atomic():
            events.count_event(VIEWS, key, 3)
        events.count_event(VIEWS, key)  # outside a transaction: at once
        assert events.event_value(VIEWS, key) == 4
        if path == "batching":
            assert db_value(key) == 0  # still in this process's buffer
            events.batcher().flush()
        assert db_value(key) == 4


def test_the_redis_path_and_manage_py_flush(redis_url: str) -> None:
    key = 10**9 + 3
    with override_settings(PGCOUNTERS_EVENTS="redis", PGCOUNTERS_REDIS_URL=redis_url):
        with pytest.raises(RuntimeError):
            rolled_back_view(key)
        with transaction.atomic():
            events.count_event(VIEWS, key, 2)
            assert events.redis_buffer().pending() == (0, 0)  # not before COMMIT
        assert events.redis_buffer().pending() == (1, 0)
        assert events.event_value(VIEWS, key) == 2
        assert db_value(key) == 0
        out = StringIO()
        call_command("pgcounters", "flush", stdout=out)
        assert db_value(key) == 2
        assert events.event_value(VIEWS, key) == 2
        assert events.redis_buffer().pending() == (0, 0)


def test_bad_input_raises_in_the_request() -> None:
    for path in ("direct", "batching"):
        with override_settings(PGCOUNTERS_EVENTS=path), pytest.raises(UnknownCounter):
            events.count_event("blog.nothing", 1)
        with override_settings(PGCOUNTERS_EVENTS=path), pytest.raises(InvalidKey):
            events.count_event(VIEWS, "one")
    with override_settings(PGCOUNTERS_EVENTS="sometimes"), pytest.raises(ConfigurationError):
        events.count_event(VIEWS, 1)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"PGCOUNTERS_EVENTS": "batching", "PGCOUNTERS_BATCHING": {"max_pendin": 3}},
         "PGCOUNTERS_BATCHING: unknown option 'max_pendin'"),
        ({"PGCOUNTERS_EVENTS": "batching", "PGCOUNTERS_BATCHING": {"max_pending": 0}},
         "PGCOUNTERS_BATCHING: "),
        ({"PGCOUNTERS_EVENTS": "batching", "PGCOUNTERS_BATCHING": [("interval", 1)]},
         "PGCOUNTERS_BATCHING must be a dict"),
        ({"PGCOUNTERS_EVENTS": "redis", "PGCOUNTERS_REDIS_FALLBACK": "bogus"},
         'PGCOUNTERS_REDIS_FALLBACK must be "raise" or "database"'),
    ],
)  # fmt: skip
def test_a_wrong_event_setting_is_a_settings_error(
    settings: dict[str, object], message: str
) -> None:
    with override_settings(**settings), pytest.raises(ImproperlyConfigured, match=message):
        events.count_event(VIEWS, 10**9 + 4)
    assert db_value(10**9 + 4) == 0


def test_flush_arguments_come_from_the_settings() -> None:
    with override_settings(
        PGCOUNTERS_REDIS_URL="redis://cache:6379/1", PGCOUNTERS_REDIS_BUFFER="views"
    ):
        assert events.flush_arguments(["flush", "--worker"]) == [
            "flush", "--worker", "--redis-url", "redis://cache:6379/1", "--buffer", "views",
            "--prefix", "pgcounters",
        ]  # fmt: skip
        assert events.flush_arguments(["flush", "--buffer=other"])[:2] == [
            "flush",
            "--buffer=other",
        ]
        assert "--buffer" not in events.flush_arguments(["flush", "--buffer=other"])
        assert events.flush_arguments(["drain"]) == ["drain"]


@pytest.mark.parametrize("path", ["direct", "batching", "redis"])
def test_the_blog_page_view_example(path: str, redis_url: str) -> None:
    article = Article.objects.create(title="hello")
    before = db_value(article.pk)  # the queue outlives the tables Django empties between tests
    client = Client()
    with override_settings(PGCOUNTERS_EVENTS=path, PGCOUNTERS_REDIS_URL=redis_url):
        seen = [client.get(f"/articles/{article.pk}/").json()["views"] for _ in range(3)]
        assert seen == [before + 1, before + 2, before + 3]
        assert client.get("/articles/999999/").status_code == 404
        events.reset()  # writes what the batching buffer holds
        if path == "redis":
            call_command("pgcounters", "flush", stdout=StringIO())
    assert db_value(article.pk) == before + 3
