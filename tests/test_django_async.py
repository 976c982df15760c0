"""Django async views await counter reads and increments (Django's AsyncClient, real views)."""

from __future__ import annotations

import json

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db.models import Count
from django.http import HttpRequest, JsonResponse
from django.test import AsyncClient
from django.urls import path

from members.models import Post, posts_per_user
from pgcounters.contrib.django import counters
from pgcounters.errors import UnknownCounter

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.urls(__name__)]


async def like(request: HttpRequest, pk: int) -> JsonResponse:
    """An async view: an ORM read, then counter increments and reads, all awaited."""
    user = await User.objects.aget(pk=pk)
    await posts_per_user.aincr(user, 2)
    return JsonResponse(
        {
            "value": await posts_per_user.aget(user),
            "many": await counters.aget_many("members.posts.per_user", [user, user.pk + 1000]),
            "top": await posts_per_user.atop(1),
        }
    )


async def missing(request: HttpRequest) -> JsonResponse:
    try:
        await counters.aincr("no.such.counter", 1)
    except UnknownCounter as exc:
        return JsonResponse({"error": type(exc).__name__}, status=404)
    return JsonResponse({})


urlpatterns = [path("like/<int:pk>/", like), path("missing/", missing)]


def test_an_async_view_awaits_increments_and_reads() -> None:
    ann = User.objects.create_user(username="ann")
    Post.objects.bulk_create([Post(user=ann) for _ in range(3)])
    call_command("pgcounters", "drain")
    client = AsyncClient()
    for expected in (5, 7, 9):
        response = async_to_sync(client.get)(f"/like/{ann.pk}/")
        assert response.status_code == 200
        body = json.loads(response.content)
        assert body["value"] == expected  # exact: the 3 posts and the increments so far
        assert body["many"] == [expected, 0]
        assert body["top"] == [[[ann.pk], 3]]  # ranked by stored value: not drained yet
    # what the views added is there for the sync API too, over the ORM's truth of 3 posts
    posts = User.objects.annotate(n=Count("posts")).get(pk=ann.pk).n
    assert posts_per_user.get(ann) == posts + 6
    response = async_to_sync(client.get)("/missing/")
    assert (response.status_code, json.loads(response.content)) == (
        404,
        {"error": "UnknownCounter"},
    )
