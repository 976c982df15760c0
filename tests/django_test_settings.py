"""The blog example's settings, plus a test app whose names need quoting."""

from __future__ import annotations

from blogsite.settings import *  # noqa: F403
from blogsite.settings import INSTALLED_APPS

INSTALLED_APPS = [
    *INSTALLED_APPS,
    "oddnames",
    "members",
    "ledger",
    "press",
    "attached",
    "timeline",
]
