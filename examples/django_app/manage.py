#!/usr/bin/env python
"""Django's command line for the example: `python manage.py runserver` (see README.md)."""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "outpost_site.settings")
    from django.core.management import execute_from_command_line  # type: ignore[import-untyped]

    execute_from_command_line(sys.argv)
