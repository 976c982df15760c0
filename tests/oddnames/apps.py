from __future__ import annotations

from django.apps import AppConfig


class OddNamesConfig(AppConfig):
    name = "oddnames"
    default_auto_field = "django.db.models.BigAutoField"
