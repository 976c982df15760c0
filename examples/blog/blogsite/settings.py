"""Settings of the blog example.

The database comes from ``PGCOUNTERS_DSN`` (or ``DATABASE_URL``), a libpq
connection string or URL. With neither set, ``manage.py`` starts an embedded
PostgreSQL and sets ``PGCOUNTERS_DSN`` before these settings are read (see
``blogsite/local.py``); importing the settings never starts a server.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from psycopg.conninfo import conninfo_to_dict

SECRET_KEY = "example-only-not-secret"
DEBUG = True
ALLOWED_HOSTS = ["*"]
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
ROOT_URLCONF = "blogsite.urls"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "pgtrigger",
    "pgcounters.contrib.django",
    "blog",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]


def _database() -> dict[str, Any]:
    dsn = os.environ.get("PGCOUNTERS_DSN") or os.environ.get("DATABASE_URL") or ""
    params = conninfo_to_dict(dsn) if dsn else {}
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": params.get("dbname", "blog"),
        "USER": params.get("user", ""),
        "PASSWORD": params.get("password", ""),
        "HOST": params.get("host", "127.0.0.1"),
        "PORT": params.get("port", ""),
    }


DATABASES = {"default": _database()}

# Page views and other events counted by the application (see docs/event-counters.md):
# "direct" (an INSERT in the request's transaction), "batching" or "redis".
PGCOUNTERS_EVENTS = os.environ.get("PGCOUNTERS_EVENTS", "direct")
PGCOUNTERS_REDIS_URL = os.environ.get("PGCOUNTERS_REDIS_URL", "")

STATIC_URL = "static/"

# The article page is cached (blog.pagecache) and made fresh by the counters' change
# notifications, received in the worker's process: a cache the processes share (files here;
# Redis or Memcached in production). The timeout bounds a page's age in any case.
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
        "LOCATION": os.environ.get("BLOG_CACHE_DIR")
        or str(Path(__file__).resolve().parent.parent / "page-cache"),
    }
}
BLOG_PAGE_CACHE_SECONDS = int(os.environ.get("BLOG_PAGE_CACHE_SECONDS", "300"))

# The API example (blog.views.api_top_articles) is limited by this quota, defined
# after migrate (blog.apps): BLOG_API_LIMIT calls per client address per minute.
BLOG_API_QUOTA = "blog.api"
BLOG_API_LIMIT = int(os.environ.get("BLOG_API_LIMIT", "30"))
