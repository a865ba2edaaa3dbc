"""conformance/README.md lists the SHA1 of every composed script, as the core has them."""

from __future__ import annotations

import re
from pathlib import Path

from outpost_core import SCRIPT_SHA1

README = Path(__file__).resolve().parents[2] / "conformance" / "README.md"
ROW = re.compile(r"^\| `(\w+)` \| `([0-9a-f]{40})` \|$", re.MULTILINE)


def test_readme_lists_the_current_sha1s() -> None:
    listed = dict(ROW.findall(README.read_text(encoding="utf-8")))
    assert listed == dict(SCRIPT_SHA1), (
        "conformance/README.md §3 lists stale SHA1s; the current ones are "
        f"{dict(sorted(SCRIPT_SHA1.items()))}"
    )
