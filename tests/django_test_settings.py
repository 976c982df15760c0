"""The blog example's settings, plus a test app whose names need quoting."""

from __future__ import annotations

import atexit
import shutil
import tempfile

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

# the blog's page cache: shared by the processes of a run (a worker's, the tests'), in a
# folder of its own
_PAGE_CACHE = tempfile.mkdtemp(prefix="blog-page-cache-")
atexit.register(shutil.rmtree, _PAGE_CACHE, ignore_errors=True)
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
        "LOCATION": _PAGE_CACHE,
    }
}
