"""The blog's pages: top articles, an article with its exact count, a user's notifications
(an unread count and mark-as-read), a rate-limited API, and page views (events).
"""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from blog.models import Article, Notification, User
from pgcounters.contrib.django import Exact, count_event, event_value, ratelimit

VIEWS = "blog.article.views"
TOP = 10


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


def article_list(request: HttpRequest) -> HttpResponse:
    """The top articles by public comments: an index scan of the counter column.

    The stored column is what the index orders by; it trails the truth by the
    deltas the worker has not applied yet, so each row also shows its exact value.
    """
    articles = Article.objects.annotate(exact=Exact("public_comments")).order_by(
        "-public_comments", "id"
    )[:TOP]
    return render(request, "blog/article_list.html", {"articles": articles, "top": TOP})


def article_detail(request: HttpRequest, pk: int) -> HttpResponse:
    """One article: the exact number of public comments (stored + pending, one statement)."""
    found = get_object_or_404(Article.objects.annotate(exact=Exact("public_comments")), pk=pk)
    exact: int = found.exact  # type: ignore[attr-defined]
    comments = found.comments.filter(publish_status="public").select_related("creator")
    return render(
        request,
        "blog/article_detail.html",
        {
            "article": found,
            "pending": exact - found.public_comments,
            "comments": comments.order_by("-id")[:20],
        },
    )


def notifications(request: HttpRequest, pk: int) -> HttpResponse:
    """A user's notifications and unread count, with mark-as-read buttons."""
    user = get_object_or_404(User.objects.annotate(unread=Exact("unread_notifications")), pk=pk)
    items = Notification.objects.filter(user=user).order_by("read", "-id")[:50]
    return render(request, "blog/notifications.html", {"user": user, "notifications": items})


@require_POST
def mark_read(request: HttpRequest, pk: int) -> HttpResponseRedirect:
    """Mark a notification read. Posting twice (or from two tabs at once) counts once.

    The UPDATE only matches an unread row, and the trigger counts the rows the
    statement changed: the second request changes nothing and takes nothing off.
    """
    found = get_object_or_404(Notification, pk=pk)
    Notification.objects.filter(pk=found.pk, read=False).update(read=True)
    return HttpResponseRedirect(reverse("notifications", args=[found.user_id]), status=303)


@ratelimit(settings.BLOG_API_QUOTA, key="ip")
def api_top_articles(request: HttpRequest) -> JsonResponse:
    """The top articles as JSON, limited to ``BLOG_API_LIMIT`` calls per client per minute."""
    rows = Article.objects.annotate(exact=Exact("public_comments")).order_by(
        "-public_comments", "id"
    )[:TOP]
    return JsonResponse(
        {"articles": [{"id": a.pk, "title": a.title, "public_comments": a.exact} for a in rows]}
    )
