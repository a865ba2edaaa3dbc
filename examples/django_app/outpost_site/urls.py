from __future__ import annotations

from django.urls import path  # type: ignore[import-untyped]

from . import views

urlpatterns = [
    path("generate", views.generate),
    path("polar/webhooks", views.polar_webhooks),
]
