"""Small request helpers shared by the HTTP routes."""

from __future__ import annotations

import json
import math
from typing import Any

from starlette.requests import Request

from outpost_emulator._errors import Errors
from outpost_emulator._state import Hub

NO_BODY = object()


def hub_of(request: Request) -> Hub:
    hub = request.app.state.hub
    assert isinstance(hub, Hub)
    return hub


async def read_json(request: Request, errors: Errors) -> Any:
    """The JSON body, or NO_BODY after adding FastAPI's error for it."""
    raw = await request.body()
    if not raw.strip():
        errors.missing(("body",), None)
        return NO_BODY
    try:
        return json.loads(raw)
    except UnicodeDecodeError as exc:
        errors.add(("body", 0), "json_invalid", "JSON decode error", {}, {"error": str(exc)})
    except json.JSONDecodeError as exc:
        errors.add(("body", exc.pos), "json_invalid", "JSON decode error", {}, {"error": exc.msg})
    return NO_BODY


def query_list(request: Request, name: str) -> list[str] | None:
    values = request.query_params.getlist(name)
    return values or None


def pagination(request: Request, errors: Errors) -> tuple[int, int]:
    """Polar's `page` (default 1, > 0) and `limit` (default 10, > 0, capped at 100)."""
    result = []
    for name, default in (("page", 1), ("limit", 10)):
        raw = request.query_params.get(name)
        if raw is None:
            result.append(default)
            continue
        try:
            value = int(raw)
        except ValueError:
            msg = "Input should be a valid integer, unable to parse string as an integer"
            errors.add(("query", name), "int_parsing", msg, raw)
            result.append(default)
            continue
        if value <= 0:
            errors.add(
                ("query", name), "greater_than", "Input should be greater than 0", raw, {"gt": 0}
            )
        result.append(value)
    return result[0], min(result[1], 100)


def paginate(items: list[Any], page: int, limit: int) -> dict[str, Any]:
    total = len(items)
    start = (page - 1) * limit
    return {
        "items": items[start : start + limit],
        "pagination": {"total_count": total, "max_page": math.ceil(total / limit)},
    }


def short(value: Any, limit: int = 300) -> str:
    """A one-line, bounded rendering for log lines."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    text = text.replace("\n", " ")
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} chars)"
