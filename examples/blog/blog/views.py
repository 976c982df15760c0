"""The blog's pages: top articles, an article with its exact count (cached, made fresh by
the counters' change notifications) and its chart of comments per day, the authors'
leaderboard, tags, a user's notifications (an unread count and mark-as-read), a
rate-limited API, and page views (events).
"""

from __future__ import annotations

import datetime as dt

from django.conf import settings
from django.db.models import Exists, OuterRef
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    HttpResponseRedirect,
    JsonResponse,
)
from django.shortcuts import get_object_or_404, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from blog import charts, pagecache
from blog.models import Article, Notification, Tag, User
from pgcounters.contrib.django import Exact, count_event, event_value, ratelimit

VIEWS = "blog.article.views"
TOP = 10
CHART_DAYS = 14  # the article page's chart
MAX_CHART_DAYS = 366


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
    articles = Article.objects.annotate(
        exact=Exact("public_comments"), exact_tags=Exact("tag_count")
    ).order_by("-public_comments", "id")[:TOP]
    return render(request, "blog/article_list.html", {"articles": articles, "top": TOP})


def article_detail(request: HttpRequest, pk: int) -> HttpResponse:
    """One article: the exact number of public comments (stored + pending, one statement),
    its tags and its comments per day over the last two weeks.

    The page is cached (``blog.pagecache``) until the worker reports a change of one of
    its counters; the ``X-Page-Cache`` header says whether it came from the cache."""

    def render_page() -> str:
        found = get_object_or_404(
            Article.objects.select_related("author").annotate(
                exact=Exact("public_comments"), exact_tags=Exact("tag_count")
            ),
            pk=pk,
        )
        exact: int = found.exact  # type: ignore[attr-defined]
        comments = found.comments.filter(publish_status="public").select_related("creator")
        series = charts.comments_per_day(found.pk, until=timezone.localdate(), days=CHART_DAYS)
        return render_to_string(
            "blog/article_detail.html",
            {
                "article": found,
                "pending": exact - found.public_comments,
                "comments": comments.order_by("-id")[:20],
                "tags": found.tags.order_by("name"),
                "chart": charts.svg_chart(series, title=f"Public comments per day: {found}"),
                "chart_days": CHART_DAYS,
            },
            request,
        )

    page, cached = pagecache.cached_page(pk, render_page)
    response = HttpResponse(page)
    response["X-Page-Cache"] = "hit" if cached else "miss"
    return response


def article_activity(request: HttpRequest, pk: int) -> HttpResponse:
    """An article's public comments per day as a chart, over ``?days=`` days (default 30)
    ending with ``?until=`` (a date, default today), every day shown, days without
    comments as 0."""
    found = get_object_or_404(Article, pk=pk)
    try:
        days = int(request.GET.get("days", "30"))
        until_text = request.GET.get("until")
        until = dt.date.fromisoformat(until_text) if until_text else timezone.localdate()
    except ValueError:
        return HttpResponseBadRequest("days must be a number and until a date (YYYY-MM-DD)")
    if not 1 <= days <= MAX_CHART_DAYS:
        return HttpResponseBadRequest(f"days must be between 1 and {MAX_CHART_DAYS}")
    series = charts.comments_per_day(found.pk, until=until, days=days)
    return render(
        request,
        "blog/article_activity.html",
        {
            "article": found,
            "series": series,
            "total": sum(value for _, value in series),
            "chart": charts.svg_chart(series, title=f"Public comments per day: {found}"),
        },
    )


def authors(request: HttpRequest) -> HttpResponse:
    """The authors' leaderboard: public comments on each author's articles, counted through
    the path ``User <- Article <- Comment`` and read exactly (stored + pending), ranked by
    the exact value."""
    rows = (
        User.objects.annotate(exact=Exact("received_comments"))
        .filter(Exists(Article.objects.filter(author=OuterRef("pk"))))
        .order_by("-exact", "id")[:TOP]
    )
    return render(request, "blog/authors.html", {"authors": rows, "top": TOP})


def tags(request: HttpRequest) -> HttpResponse:
    """Every tag with its number of published articles (exact), most used first."""
    rows = Tag.objects.annotate(exact=Exact("published_articles")).order_by("-exact", "name")
    return render(request, "blog/tags.html", {"tags": rows})


def tag_detail(request: HttpRequest, pk: int) -> HttpResponse:
    """A tag and its published articles, each with its number of tags."""
    found = get_object_or_404(Tag.objects.annotate(exact=Exact("published_articles")), pk=pk)
    articles = (
        found.articles.filter(published=True)
        .annotate(exact_tags=Exact("tag_count"))
        .order_by("-public_comments", "id")
    )
    return render(request, "blog/tag_detail.html", {"tag": found, "articles": articles})


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
