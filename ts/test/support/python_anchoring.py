"""The Python core's anchoring decisions for the TypeScript differential test: a JSON list of
cases (a figure, or a quantities probe's answer) in on stdin, a JSON list of answers out on
stdout. Started with the repository's .venv;
prints "missing" when the Python core has no public mode."""

from __future__ import annotations

import importlib
import json
import sys
from typing import Any

from outpost_core._public_readings import PolarReading

try:
    anchoring: Any = importlib.import_module("outpost_core._public_anchoring")
except ImportError:  # a Python core without the public mode
    anchoring = None


def decide(case: dict[str, Any]) -> Any:
    q, r = case.get("probe"), case["reading"]
    if q is not None:
        probes: Any = importlib.import_module("outpost_core._public_probes")
        decided = probes.probe_anchor(
            case["aggregation"],
            case["margin_us"],
            case["fields"],
            case["events"],
            q["meter"],
            q["consumed"],
            q["sent"],
            q["lag"],
        )
    else:
        figures = (r["consumed"], r["credited"], r["balance"], r["modified"])
        reading = PolarReading(r["external"], None, r["meter"], *figures, r.get("reset"))
        decided = anchoring.anchor(
            case["aggregation"], case["margin_us"], case["fields"], case["events"], reading
        )
    args = None if decided.write is None else list(decided.write.args("chan", case["known"]))
    return [decided.outcome.value, args, len(decided.problems), decided.rejections]


def main() -> None:
    if anchoring is None:
        sys.stdout.write(json.dumps("missing"))
        return
    sys.stdout.write(json.dumps([decide(case) for case in json.load(sys.stdin)]))


if __name__ == "__main__":
    main()
