from __future__ import annotations

from django.apps import AppConfig


class TimelineConfig(AppConfig):
    name = "timeline"
    default_auto_field = "django.db.models.BigAutoField"
