"""The blog in Django's admin: counter columns listed and sortable, read-only.

The counter columns are real columns kept by the database's triggers: they can
be shown, filtered and ordered by (ordering by one uses its index), but never
edited by hand. The comment list uses the estimated-count paginator, which asks
the planner instead of running ``count(*)`` once the table is large.
"""

from __future__ import annotations

from django.contrib import admin

from blog.models import Article, Comment, Notification, Tag, User
from pgcounters.contrib.django import EstimatedCountPaginator


@admin.register(User)
class UserAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = (
        "id",
        "username",
        "public_comments",
        "received_comments",
        "unread_notifications",
    )
    ordering = ("-public_comments",)
    search_fields = ("username",)
    readonly_fields = ("public_comments", "received_comments", "unread_notifications")


@admin.register(Article)
class ArticleAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = (
        "id",
        "title",
        "author",
        "published",
        "public_comments",
        "public_score",
        "tag_count",
    )
    list_filter = ("published",)
    list_select_related = ("author",)
    ordering = ("-public_comments",)
    search_fields = ("title",)
    raw_id_fields = ("author",)
    filter_horizontal = ("tags",)
    readonly_fields = ("public_comments", "public_score", "tag_count")


@admin.register(Tag)
class TagAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("id", "name", "published_articles")
    ordering = ("-published_articles",)
    search_fields = ("name",)
    readonly_fields = ("published_articles",)


@admin.register(Comment)
class CommentAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("id", "article", "creator", "publish_status", "score", "created_on")
    list_filter = ("publish_status", "created_on")
    list_select_related = ("article", "creator")
    raw_id_fields = ("article", "creator")
    paginator = EstimatedCountPaginator
    show_full_result_count = False


@admin.register(Notification)
class NotificationAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("id", "user", "message", "read")
    list_filter = ("read",)
    list_select_related = ("user",)
    raw_id_fields = ("user",)
