"""Error bodies in Polar's shapes: FastAPI/pydantic-style 422s and `{"detail": ...}` errors."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from starlette.responses import JSONResponse

from outpost_emulator._auth import Denied

Loc = tuple[str | int, ...]


def jsonable(value: Any) -> Any:
    """A JSON-safe copy of a request value (NaN and infinities become strings)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


class Errors:
    """Collects pydantic-style error entries: {"type", "loc", "msg", "input"[, "ctx"]}."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []

    def add(
        self,
        loc: Loc,
        type_: str,
        msg: str,
        input_: Any,
        ctx: Mapping[str, Any] | None = None,
    ) -> None:
        item: dict[str, Any] = {
            "type": type_,
            "loc": list(loc),
            "msg": msg,
            "input": jsonable(input_),
        }
        if ctx:
            item["ctx"] = dict(ctx)
        self.items.append(item)

    def missing(self, loc: Loc, input_: Any) -> None:
        self.add(loc, "missing", "Field required", input_)

    def not_an_object(self, loc: Loc, input_: Any) -> None:
        msg = "Input should be a valid dictionary or object to extract fields from"
        self.add(loc, "model_attributes_type", msg, input_)

    def __bool__(self) -> bool:
        return bool(self.items)

    def __len__(self) -> int:
        return len(self.items)


def validation_response(errors: Errors) -> JSONResponse:
    # Polar's handler: {"error": "RequestValidationError", "detail": [...]}.
    return JSONResponse(
        {"error": "RequestValidationError", "detail": errors.items}, status_code=422
    )


def detail_response(
    status_code: int,
    detail: str,
    *,
    error: str | None = None,
    headers: Mapping[str, str] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> JSONResponse:
    body: dict[str, Any] = {}
    if error is not None:
        body["error"] = error
    body["detail"] = detail
    if extra:
        body.update(extra)
    return JSONResponse(body, status_code=status_code, headers=dict(headers or {}))


def denied_response(denied: Denied) -> JSONResponse:
    """The HTTP answer to a refused token (also sent as a WebSocket upgrade's denial)."""
    return JSONResponse(denied.body, status_code=denied.status, headers=denied.headers)


def too_short_msg(n: int) -> str:
    return f"String should have at least {n} character{'s' if n != 1 else ''}"


def too_long_msg(n: int) -> str:
    return f"String should have at most {n} character{'s' if n != 1 else ''}"
