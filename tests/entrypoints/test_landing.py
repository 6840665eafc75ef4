"""``/``, ``/docs`` and ``/redoc``: served with no network (local assets only), open without the API key."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from omnistage.entrypoints.openai.api_server import build_app
from omnistage.entrypoints.openai.landing import wants_json
from omnistage.entrypoints.openai.server_config import AccessPolicy
from tests.entrypoints.conftest import TEST_LIMITS
from tests.entrypoints.fake_engine import FakeEngine, RecordingProcessor, fake_front_end

KEY = "sk-landing-0123456789"
BROWSER_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
# Every URL a docs page loads: stylesheets, scripts, icons, and the schema Swagger UI / ReDoc fetch.
_REFERENCED = re.compile(r"""(?:href|src|spec-url)=["']([^"']+)["']|url:\s*'([^']+)'""")
# The smallest size each kind of asset may have and still be the real thing (the bundles are ~1 MB).
_MIN_BYTES = {"text/javascript": 100_000, "application/javascript": 100_000, "text/css": 10_000, "image/png": 500,
              "application/json": 1_000}


def _client(processor: RecordingProcessor, policy: AccessPolicy) -> Iterator[TestClient]:
    with TestClient(build_app(FakeEngine(fake_front_end(processor)), TEST_LIMITS, access=policy)) as client:
        yield client


@pytest.fixture(scope="module")
def open_client(processor: RecordingProcessor) -> Iterator[TestClient]:
    yield from _client(processor, AccessPolicy())


@pytest.fixture(scope="module")
def keyed_client(processor: RecordingProcessor) -> Iterator[TestClient]:
    yield from _client(processor, AccessPolicy(api_keys=(KEY,)))


def referenced_urls(page: str) -> list[str]:
    return [href or url for href, url in _REFERENCED.findall(page)]


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_pages_load_only_local_assets(open_client: TestClient, page: str) -> None:
    r = open_client.get(page)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert not re.search(r"https?://", r.text), "a docs page must not reach another host"
    urls = referenced_urls(r.text)
    assert "/openapi.json" in urls and any(u.endswith(".js") for u in urls) and any(u.endswith(".png") for u in urls)
    for url in urls:
        assert url.startswith("/"), url
        asset = open_client.get(url)
        kind = asset.headers["content-type"].split(";")[0]
        assert asset.status_code == 200 and kind in _MIN_BYTES, (url, asset.status_code, kind)
        assert len(asset.content) >= _MIN_BYTES[kind], (url, len(asset.content))


def test_swagger_ui_asks_for_no_validator_badge(open_client: TestClient) -> None:
    assert '"validatorUrl": null' in open_client.get("/docs").text  # else it fetches validator.swagger.io


def test_openapi_still_describes_the_api_and_not_the_pages(open_client: TestClient) -> None:
    schema = open_client.get("/openapi.json").json()
    assert "/v1/chat/completions" in schema["paths"] and "/health" in schema["paths"]
    assert not {"/", "/docs", "/redoc"} & set(schema["paths"])


def test_a_browser_gets_the_playground_with_only_local_assets(open_client: TestClient) -> None:
    r = open_client.get("/", headers={"Accept": BROWSER_ACCEPT})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    page = r.text
    assert "playground" in page and 'id="connect"' in page and 'id="tts"' in page
    for path in ("/docs", "/redoc", "/health", "/metrics", "/v1/models"):
        assert f'href="{path}"' in page
    assert not re.search(r"https?://", page), "the playground must not reach another host"
    urls = [u for u in referenced_urls(page) if u.startswith("/static/")]
    assert {u.rsplit(".", 1)[-1] for u in urls} == {"js", "css", "svg"}
    for url in urls:
        asset = open_client.get(url)
        assert asset.status_code == 200, url
        assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", asset.text), f"{url} reaches another host"


def test_landing_json_has_the_same_facts(open_client: TestClient) -> None:
    r = open_client.get("/", headers={"Accept": "application/json"})
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    body = r.json()
    assert body["name"] == "omnistage" and body["models"] == ["fake-omni"] and body["version"]
    assert {"Chelsie", "Ethan"} <= set(body["voices"])
    assert {"/docs", "/redoc", "/health", "/metrics", "/v1/models"} <= set(body["links"])
    assert body["try"].startswith("curl http://testserver/v1/chat/completions") and "fake-omni" in body["try"]


def test_links_on_the_landing_answer(open_client: TestClient) -> None:
    for path in open_client.get("/", headers={"Accept": "application/json"}).json()["links"]:
        assert open_client.get(path).status_code == 200, path


@pytest.mark.parametrize(("accept", "json_wanted"), [
    ("application/json", True), (BROWSER_ACCEPT, False), ("*/*", False), ("", False),
    ("application/json, text/html;q=0.5", True), ("application/json;q=0.5, text/html", False),
    ("text/html;q=bad, application/json", True),
])
def test_content_negotiation(accept: str, json_wanted: bool) -> None:
    assert wants_json(accept) is json_wanted


@pytest.mark.parametrize("path", ["/", "/docs", "/redoc", "/openapi.json", "/static/docs/swagger-ui-bundle.js",
                                  "/static/docs/swagger-ui.css", "/static/docs/redoc.standalone.js",
                                  "/static/docs/favicon.png", "/static/playground/playground.js",
                                  "/static/playground/playground.css"])
def test_docs_and_landing_are_open_under_api_key(keyed_client: TestClient, path: str) -> None:
    assert keyed_client.get(path).status_code == 200
    assert keyed_client.get(path, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200


def test_api_key_still_guards_the_api(keyed_client: TestClient) -> None:
    assert keyed_client.get("/v1/models").status_code == 401
    assert keyed_client.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    assert keyed_client.get("/static/docs/nothing.js").status_code == 404  # open prefix, but only the assets
    # A dotted path under the open prefix stays inside the assets folder: no way round the key.
    escaped = keyed_client.get("/static/docs/%2e%2e/%2e%2e/v1/models")
    assert escaped.status_code == 404 and "fake-omni" not in escaped.text
    assert keyed_client.get("/static/docsx").status_code == 401


def test_landing_under_api_key_names_no_model(keyed_client: TestClient) -> None:
    """The model list is what the key guards: the open landing page points at it instead."""
    body = keyed_client.get("/", headers={"Accept": "application/json"}).json()
    assert body["models"] is None and body["voices"] is None
    assert "Authorization: Bearer" in body["try"] and "/v1/models" in body["try"]
    page = keyed_client.get("/").text
    assert "fake-omni" not in page and 'id="key-form"' in page  # the playground asks for the key instead
    assert "fake-omni" not in keyed_client.get("/openapi.json").text


def test_the_schema_declares_the_bearer_key_only_when_one_is_needed(open_client: TestClient,
                                                                    keyed_client: TestClient) -> None:
    keyed = keyed_client.get("/openapi.json").json()  # so /docs' "Authorize" sends it with "Try it out"
    assert keyed["components"]["securitySchemes"]["bearer"] == {"type": "http", "scheme": "bearer"}
    assert keyed["security"] == [{"bearer": []}]
    assert "security" not in open_client.get("/openapi.json").json()
