"""The dashboard: a static page at `/` (plain HTML, CSS and JavaScript shipped in the package,
no build step) that polls the admin API's `GET /__emulator/summary` and drives the admin API
with JSON posts.

The page puts every value it shows into the DOM as text, never as markup. Its Content Security
Policy allows only its own script, style and requests as a second line of defence.
"""

from __future__ import annotations

from importlib import resources

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

ASSETS = {
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def _asset(name: str) -> bytes:
    return resources.files("outpost_emulator").joinpath("static", name).read_bytes()


async def page_endpoint(request: Request) -> Response:
    return Response(_asset("index.html"), media_type="text/html; charset=utf-8", headers=_HEADERS)


async def asset_endpoint(request: Request) -> Response:
    name = request.path_params["name"]
    media_type = ASSETS.get(name)
    if media_type is None:
        return JSONResponse({"detail": "Not Found"}, status_code=404)
    return Response(_asset(name), media_type=media_type, headers=_HEADERS)


ROUTES = [
    Route("/", page_endpoint, methods=["GET"]),
    Route("/__emulator/dashboard/{name}", asset_endpoint, methods=["GET"]),
]
