"""The errors of the Django layer, in the pgcounters hierarchy."""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

from pgcounters.errors import ConfigurationError


class SettingsError(ConfigurationError, ImproperlyConfigured):
    """A pgcounters setting in Django's settings (or an argument of the rate-limit decorator)
    is invalid. Both a :class:`pgcounters.ConfigurationError` and Django's
    ``ImproperlyConfigured``, so either ``except`` catches it."""
