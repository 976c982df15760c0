"""The page-view example: each view of an article counts one event (seed 003/004)."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.shortcuts import get_object_or_404

from blog.models import Article
from pgcounters.contrib.django.events import count_event, event_value

VIEWS = "blog.article.views"


def article(request: HttpRequest, pk: int) -> JsonResponse:
    """Show an article and count the view (only if the request's transaction commits).

    The path is chosen by ``PGCOUNTERS_EVENTS``: an INSERT in the request's
    transaction, the process's batching buffer, or the Redis buffer.
    """
    found = get_object_or_404(Article, pk=pk)
    count_event(VIEWS, found.pk)
    return JsonResponse(
        {"id": found.pk, "title": found.title, "views": event_value(VIEWS, found.pk)}
    )
