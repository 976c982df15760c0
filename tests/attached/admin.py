from __future__ import annotations

from typing import TYPE_CHECKING

from django.contrib import admin

from attached.models import Post

if TYPE_CHECKING:
    _PostAdmin = admin.ModelAdmin[Post]
else:
    _PostAdmin = admin.ModelAdmin


@admin.register(Post)
class PostAdmin(_PostAdmin):
    list_display = ("id", "title", "notes_count", "public_notes")
