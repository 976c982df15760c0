from __future__ import annotations

from django.apps import AppConfig


class PressConfig(AppConfig):
    name = "press"
    default_auto_field = "django.db.models.BigAutoField"
