"""The example's only settings: no database, no apps, no middleware beyond what a JSON API needs.

Outpost's own configuration comes from the environment (see metering.py), not from here.
"""

from __future__ import annotations

import os

DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "outpost-example-not-a-secret")
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]
ROOT_URLCONF = "outpost_site.urls"
INSTALLED_APPS: list[str] = []
MIDDLEWARE = ["django.middleware.common.CommonMiddleware"]
DATABASES: dict[str, dict[str, str]] = {}
USE_TZ = True
TIME_ZONE = "UTC"
