"""`python -m outpost_sync.cli`: the `outpost` command."""

from __future__ import annotations

from outpost_sync.cli import main

raise SystemExit(main())
