"""The pages a person meets first: ``/`` (the playground) and the API docs, with no network needed.

FastAPI's own ``/docs`` and ``/redoc`` load Swagger UI and ReDoc from a CDN, so
on an offline machine they are blank. The same files ship in the
``fastapi-offline`` package; the server mounts them under ``/static/docs`` and
builds both pages with FastAPI's helpers pointing there.

These pages, the schema they read and their assets hold no secret, so the
access middleware lets them through without the API key (as vLLM does): a
browser cannot attach ``Authorization`` to a page it opens. ``/`` then names
no model when the server has a key, as ``/v1/models`` is what the key guards.

``/`` answers the playground (``playground/``: static HTML, script and
style shipped in the package, no build step) to a browser, or JSON with what
the server is when the client prefers ``application/json``; the playground
reads that JSON too. Its links are data (``Landing.links``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles

from omnistage.entrypoints.openai.common.served_model import ServedModel

ASSETS_PACKAGE = ("fastapi_offline", "static")  # (package, folder inside it)
ASSETS_URL = "/static/docs"
SWAGGER_JS, SWAGGER_CSS = "swagger-ui-bundle.js", "swagger-ui.css"
REDOC_JS, FAVICON = "redoc.standalone.js", "favicon.png"
DOCS_URL, REDOC_URL, OPENAPI_URL = "/docs", "/redoc", "/openapi.json"
PLAYGROUND_DIR, PLAYGROUND_URL = Path(__file__).parent / "playground", "/static/playground"
# What anyone may read without the key: the docs, their schema and assets, and the playground (no secret in them).
PUBLIC_PATHS = frozenset({"/", DOCS_URL, REDOC_URL, OPENAPI_URL})
PUBLIC_PREFIX = (ASSETS_URL + "/", PLAYGROUND_URL + "/")


@dataclass(frozen=True)
class Link:
    path: str
    label: str


LINKS = (Link(DOCS_URL, "API docs (Swagger UI)"), Link(REDOC_URL, "API reference (ReDoc)"),
         Link("/health", "health of every stage"), Link("/metrics", "Prometheus metrics"),
         Link("/v1/models", "served models"))


@dataclass(frozen=True)
class Landing:
    """What ``/`` tells: the server, its model(s) and voices (None when the key hides them), where to go, one
    command."""

    name: str
    version: str
    models: tuple[str, ...] | None
    voices: tuple[str, ...] | None
    links: tuple[Link, ...]
    try_command: str

    def as_json(self) -> dict[str, object]:
        return {"object": "server", "name": self.name, "version": self.version,
                "models": list(self.models) if self.models is not None else None,
                "voices": list(self.voices) if self.voices is not None else None,
                "links": {link.path: link.label for link in self.links}, "try": self.try_command}


def try_command(base_url: str, models: tuple[str, ...] | None) -> str:
    """One curl a newcomer can paste: a chat completion, or (key set) the model list, which needs the key."""
    if models is None:
        return f'curl {base_url}/v1/models -H "Authorization: Bearer $OMNISTAGE_API_KEY"'
    body = json.dumps({"model": models[0], "messages": [{"role": "user", "content": "Hello!"}]})
    return f"curl {base_url}/v1/chat/completions -H 'Content-Type: application/json' -d '{body}'"


def landing_for(app: FastAPI, served: ServedModel, keyed: bool, base_url: str) -> Landing:
    models = None if keyed else served.names
    voices = None if keyed else tuple(served.voices.names)
    return Landing(app.title, app.version, models, voices, LINKS, try_command(base_url, models))


def wants_json(accept: str) -> bool:
    """True when ``application/json`` ranks above ``text/html`` (a browser and ``*/*`` get HTML)."""
    ranks = {"application/json": 0.0, "text/html": 0.0}
    for part in accept.split(","):
        media, _, params = part.partition(";")
        media = media.strip().lower()
        if media in ranks:
            ranks[media] = _quality(params)
    return ranks["application/json"] > ranks["text/html"]


def _quality(params: str) -> float:
    for param in params.split(";"):
        name, _, value = param.partition("=")
        if name.strip().lower() == "q":
            try:
                return float(value)
            except ValueError:
                return 0.0
    return 1.0


def _docs_pages(app: FastAPI) -> None:
    assets = StaticFiles(packages=[ASSETS_PACKAGE])  # raises here, at build time, when the package is missing
    app.mount(ASSETS_URL, assets, name="docs-assets")

    @app.get(DOCS_URL, include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        # validatorUrl None: Swagger UI would otherwise fetch a badge from validator.swagger.io.
        return get_swagger_ui_html(openapi_url=root + OPENAPI_URL, title=f"{app.title} - Swagger UI",
                                   swagger_js_url=f"{root}{ASSETS_URL}/{SWAGGER_JS}",
                                   swagger_css_url=f"{root}{ASSETS_URL}/{SWAGGER_CSS}",
                                   swagger_favicon_url=f"{root}{ASSETS_URL}/{FAVICON}",
                                   swagger_ui_parameters={"validatorUrl": None})

    @app.get(REDOC_URL, include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_redoc_html(openapi_url=root + OPENAPI_URL, title=f"{app.title} - ReDoc",
                              redoc_js_url=f"{root}{ASSETS_URL}/{REDOC_JS}",
                              redoc_favicon_url=f"{root}{ASSETS_URL}/{FAVICON}", with_google_fonts=False)


def install_landing(app: FastAPI, served: ServedModel, keyed: bool) -> None:
    """``/``, ``/docs``, ``/redoc`` and their assets; build the app with ``docs_url=None, redoc_url=None``."""
    _docs_pages(app)
    app.mount(PLAYGROUND_URL, StaticFiles(directory=PLAYGROUND_DIR), name="playground")

    @app.get("/", include_in_schema=False)
    async def landing(request: Request) -> Response:
        base_url = str(request.base_url).rstrip("/")
        page = landing_for(app, served, keyed, base_url)
        vary = {"Vary": "Accept"}  # one URL, two answers: a cache must not hand the page to the script
        if wants_json(request.headers.get("accept", "")):
            return JSONResponse(page.as_json(), headers=vary)
        return FileResponse(PLAYGROUND_DIR / "index.html", media_type="text/html", headers=vary)
