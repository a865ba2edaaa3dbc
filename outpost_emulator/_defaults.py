"""Defaults the command line needs before it may import the server (which needs Starlette)."""

from __future__ import annotations

DEFAULT_TOKEN = "polar_oat_local"
"""The organization access token the emulator accepts unless told another."""
