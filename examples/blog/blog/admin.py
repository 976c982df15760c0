"""The blog in Django's admin: counter columns listed and sortable, read-only.

The counter columns are real columns kept by the database's triggers: they can
be shown, filtered and ordered by (ordering by one uses its index), but never
edited by hand. The comment list uses the estimated-count paginator, which asks
the planner instead of running ``count(*)`` once the table is large.
"""

from __future__ import annotations

from django.contrib import admin

from blog.models import Article, Comment, Notification, User
from pgcounters.contrib.django import EstimatedCountPaginator


@admin.register(User)
class UserAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("id", "username", "public_comments", "unread_notifications")
    ordering = ("-public_comments",)
    search_fields = ("username",)
    readonly_fields = ("public_comments", "unread_notifications")


@admin.register(Article)
class ArticleAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("id", "title", "public_comments", "public_score")
    ordering = ("-public_comments",)
    search_fields = ("title",)
    readonly_fields = ("public_comments", "public_score")


@admin.register(Comment)
class CommentAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("id", "article", "creator", "publish_status", "score")
    list_filter = ("publish_status",)
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
