"""`python -m outpost_sync.cli`: the `outpost` command."""

from outpost_sync.cli import main

raise SystemExit(main())
