"""http(s) media URLs, fetched only when the server allows it, within the size limit."""

from __future__ import annotations

import functools
import http.server
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import openai
import pytest

from omnistage.entrypoints.openai.api_server import build_app
from omnistage.entrypoints.openai.server_config import MediaPolicy
from tests.audio.signals import soundfile_bytes, tone
from tests.entrypoints.conftest import TEST_LIMITS
from tests.entrypoints.fake_engine import FakeEngine, RecordingProcessor, fake_front_end
from tests.entrypoints.server_thread import ServerThread


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass


@pytest.fixture(scope="module")
def file_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    root = tmp_path_factory.mktemp("www")
    handler = functools.partial(_QuietHandler, directory=str(root))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", root
    httpd.shutdown()


@pytest.fixture(scope="module")
def remote_client(processor: RecordingProcessor) -> Iterator[tuple[openai.OpenAI, FakeEngine]]:
    engine = FakeEngine(fake_front_end(processor))
    limits = replace(TEST_LIMITS, max_media_bytes=100_000)
    # The test's file server is on loopback: allowed by name, as an operator allows an internal media host.
    policy = MediaPolicy(allow_remote_media=True, remote_timeout_s=5, allowed_media_domains=("127.0.0.1",))
    server = ServerThread(build_app(engine, limits, policy))
    base_url = server.start()
    yield openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0), engine
    server.stop()


def _ask_audio_url(client: openai.OpenAI, url: str) -> None:
    content = [{"type": "text", "text": "hi"}, {"type": "audio_url", "audio_url": {"url": url}}]
    client.chat.completions.create(model="fake-omni", messages=[{"role": "user", "content": content}])


def test_remote_audio_is_fetched(file_server: tuple[str, Path], remote_client: tuple[openai.OpenAI, FakeEngine],
                                 processor: RecordingProcessor) -> None:
    base, root = file_server
    (root / "clip.wav").write_bytes(soundfile_bytes(tone(440, 0.5, 16000), 16000))
    processor.seen_audios.clear()
    _ask_audio_url(remote_client[0], f"{base}/clip.wav")
    assert len(processor.seen_audios[-1]) == 8000


@pytest.mark.parametrize(("name", "code"), [("missing.wav", "fetch_failed"), ("big.wav", "media_too_large")])
def test_remote_failures_are_400(file_server: tuple[str, Path], remote_client: tuple[openai.OpenAI, FakeEngine],
                                 name: str, code: str) -> None:
    base, root = file_server
    (root / "big.wav").write_bytes(soundfile_bytes(tone(440, 5.0, 16000), 16000))  # 160 kB > 100 kB
    with pytest.raises(openai.BadRequestError) as info:
        _ask_audio_url(remote_client[0], f"{base}/{name}")
    assert info.value.body["code"] == code
    assert info.value.body["param"] == "messages[0].content[1].audio_url.url"


def test_unreachable_host_is_400(remote_client: tuple[openai.OpenAI, FakeEngine]) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        _ask_audio_url(remote_client[0], "http://127.0.0.1:9/nothing.wav")
    assert info.value.body["code"] == "fetch_failed"
