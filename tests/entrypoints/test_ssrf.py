"""Remote media cannot reach the server's own network: loopback/private/link-local targets in any spelling, and
redirects to them, are refused before any connection; every failure reads the same; one deadline per fetch."""

from __future__ import annotations

import http.server
import ipaddress
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace

import httpx
import pytest

from omnistage.entrypoints.openai.api_server import build_app
from omnistage.entrypoints.openai.media.remote_fetch import FETCH_FAILED, MAX_REDIRECTS, is_public
from omnistage.entrypoints.openai.server_config import MediaPolicy
from tests.entrypoints.conftest import TEST_LIMITS
from tests.entrypoints.fake_engine import FakeEngine, RecordingProcessor, fake_front_end
from tests.entrypoints.media_samples import png_bytes
from tests.entrypoints.server_thread import ServerThread

PNG = png_bytes()


class _Handler(http.server.BaseHTTPRequestHandler):
    hits: list[str]
    redirect_to: str = ""

    def do_GET(self) -> None:  # noqa: N802 - the base class's name
        self.hits.append(self.path)
        if self.path.startswith("/redirect"):
            self.send_response(302)
            self.send_header("Location", self.redirect_to)
            self.end_headers()
        elif self.path.startswith("/loop"):
            self.send_response(302)
            self.send_header("Location", "/loop")
            self.end_headers()
        elif self.path.startswith("/drip"):
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            for _ in range(1000):  # a byte every 0.3 s: each read is quick, the whole is not
                self.wfile.write(b"x")
                self.wfile.flush()
                time.sleep(0.3)
        elif self.path.startswith("/image.png"):
            self.send_response(200)
            self.send_header("Content-Length", str(len(PNG)))
            self.end_headers()
            self.wfile.write(PNG)
        else:
            self.send_response(404)
            self.end_headers()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass


@dataclass
class _Web:
    port: int
    hits: list[str]
    handler: type[_Handler]


def _web() -> Iterator[_Web]:
    hits: list[str] = []
    handler = type("Handler", (_Handler,), {"hits": hits})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield _Web(httpd.server_address[1], hits, handler)
    httpd.shutdown()


canary = pytest.fixture(scope="module")(_web)  # must never be reached
web = pytest.fixture(scope="module")(_web)  # an allowed media host (by name: 127.0.0.1)


def _server(processor: RecordingProcessor, **policy: object) -> Iterator[str]:
    limits = replace(TEST_LIMITS, max_media_bytes=100_000)
    thread = ServerThread(build_app(FakeEngine(fake_front_end(processor)), limits,
                                    MediaPolicy(allow_remote_media=True, **policy)))
    yield thread.start()
    thread.stop()


@pytest.fixture(scope="module")
def guarded(processor: RecordingProcessor) -> Iterator[str]:
    yield from _server(processor, remote_timeout_s=1.0)


@pytest.fixture(scope="module")
def trusting(processor: RecordingProcessor) -> Iterator[str]:
    yield from _server(processor, remote_timeout_s=1.0, allowed_media_domains=("127.0.0.1",))


def _ask(server: str, url: str) -> httpx.Response:
    body = {"model": "fake-omni", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": url}}]}]}
    return httpx.post(f"{server}/v1/chat/completions", json=body, timeout=30)


def _refused(r: httpx.Response) -> tuple[str, str]:
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "messages[0].content[1].image_url.url"
    return error["code"], error["message"]


SPELLINGS = ["127.0.0.1", "localhost", "LOCALHOST.", "0.0.0.0", "2130706433", "0x7f000001", "0x7f.0.0.1",
             "0177.0.0.1", "017700000001", "127.1", "127.0.1", "[::1]", "[::ffff:127.0.0.1]", "[::ffff:7f00:1]",
             "[0:0:0:0:0:ffff:127.0.0.1]", "[::]", "127.0.0.1.nip.io.invalid"]


def test_loopback_in_any_spelling_is_refused_without_a_connection(guarded: str, canary: _Web) -> None:
    answers = {_refused(_ask(guarded, f"http://{host}:{canary.port}/secret")) for host in SPELLINGS}
    answers.add(_refused(_ask(guarded, f"http://user:pw@example.invalid:{canary.port}/x")))
    assert answers == {("fetch_failed", FETCH_FAILED)}  # one answer, whatever the reason
    assert canary.hits == []


def test_private_and_metadata_addresses_are_refused(guarded: str) -> None:
    for host in ("169.254.169.254", "10.0.0.1", "192.168.0.1", "172.16.5.4", "100.64.0.1", "[fd00::1]",
                 "[fe80::1]", "224.0.0.1"):
        assert _refused(_ask(guarded, f"http://{host}/latest/meta-data/")) == ("fetch_failed", FETCH_FAILED)


def test_an_allowed_host_is_fetched_and_a_redirect_to_loopback_is_not(trusting: str, web: _Web,
                                                                        canary: _Web) -> None:
    assert _ask(trusting, f"http://127.0.0.1:{web.port}/image.png").status_code == 200
    for target in (f"http://localhost:{canary.port}/secret", f"http://2130706433:{canary.port}/secret",
                   f"http://[::1]:{canary.port}/secret"):
        web.handler.redirect_to = target
        web.hits.clear()
        assert _refused(_ask(trusting, f"http://127.0.0.1:{web.port}/redirect")) == ("fetch_failed", FETCH_FAILED)
        assert web.hits == ["/redirect"]  # the allowed hop was fetched; the next was refused before connecting
    assert canary.hits == []
    web.hits.clear()
    _refused(_ask(trusting, f"http://127.0.0.1:{web.port}/loop"))
    assert len(web.hits) == MAX_REDIRECTS + 1


def test_failures_do_not_tell_closed_ports_from_missing_files(trusting: str, web: _Web) -> None:
    closed = _ask(trusting, "http://127.0.0.1:9/image.png")
    missing = _ask(trusting, f"http://127.0.0.1:{web.port}/nothing.png")
    assert _refused(closed) == _refused(missing) == ("fetch_failed", FETCH_FAILED)


def test_one_deadline_for_the_whole_fetch(trusting: str, web: _Web) -> None:
    """A byte every 0.3 s keeps every read short; --remote-media-timeout (1 s here) bounds the fetch."""
    started = time.monotonic()
    assert _refused(_ask(trusting, f"http://127.0.0.1:{web.port}/drip")) == ("fetch_failed", FETCH_FAILED)
    assert time.monotonic() - started < 3.0


@pytest.mark.parametrize("address", ["127.0.0.1", "10.1.2.3", "172.31.0.1", "192.168.1.1", "169.254.169.254",
                                     "100.64.0.1", "0.0.0.0", "224.0.0.1", "239.255.255.250", "240.0.0.1",
                                     "255.255.255.255", "192.0.2.1", "::1", "::", "fe80::1", "fc00::1", "ff02::1",
                                     "::ffff:127.0.0.1", "::ffff:10.0.0.1", "2002:7f00:1::", "64:ff9b::a00:1",
                                     "2001:db8::1"])
def test_non_public_addresses(address: str) -> None:
    assert not is_public(ipaddress.ip_address(address))


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "::ffff:8.8.8.8"])
def test_public_addresses(address: str) -> None:
    assert is_public(ipaddress.ip_address(address))


def test_numeric_spellings_are_judged_as_the_address_they_mean() -> None:
    """The resolver reads them as inet_aton does; allowed by name here, they still come back as 127.0.0.1."""
    import asyncio

    from omnistage.entrypoints.openai.media.remote_fetch import RemoteFetcher

    spellings = ("2130706433", "0x7f000001", "0177.0.0.1", "127.1")
    fetcher = RemoteFetcher(MediaPolicy(allow_remote_media=True, allowed_media_domains=spellings), 1000)
    for host in spellings:
        assert str(asyncio.run(fetcher._address(host, 80))) == "127.0.0.1"
