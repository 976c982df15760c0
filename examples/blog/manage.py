#!/usr/bin/env python
"""The blog example's manage.py: with no PGCOUNTERS_DSN, it runs on an embedded PostgreSQL."""

from blogsite.local import main

if __name__ == "__main__":
    main()
