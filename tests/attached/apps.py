from __future__ import annotations

from django.apps import AppConfig


class AttachedConfig(AppConfig):
    name = "attached"
    default_auto_field = "django.db.models.BigAutoField"
