"""What closes a speech stream (``WS /v1/audio/speech/stream``): the end of its text (1000, after
``speech.audio.done``), an idle session past ``--ws-idle-timeout`` and an unknown model at connect (1008, after
their error event). A client's mistake never does (``test_speech_stream.py``, ``test_fuzz_events.py``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from omnistage.entrypoints.openai.api_server import build_app
from omnistage.entrypoints.openai.server_config import MediaPolicy, ServerLimits
from tests.entrypoints.fake_engine import FakeEngine, RecordingProcessor, fake_front_end
from tests.entrypoints.server_thread import ServerThread


@pytest.fixture(scope="module")
def ws_url(processor: RecordingProcessor) -> Iterator[str]:
    thread = ServerThread(build_app(FakeEngine(fake_front_end(processor)), ServerLimits(ws_idle_timeout=1.0),
                                    MediaPolicy()))
    yield thread.start().replace("http://", "ws://") + "/v1/audio/speech/stream"
    thread.stop()


async def _until_closed(url: str, events: list[str]) -> tuple[list[dict], int | None]:
    received: list[dict] = []
    async with connect(url, open_timeout=10) as ws:
        for event in events:
            await ws.send(event)
        try:
            while True:
                received.append(json.loads(await asyncio.wait_for(ws.recv(), 30)))
        except ConnectionClosed:
            pass
        return received, ws.close_code


def test_an_idle_session_is_closed_after_its_error(ws_url: str) -> None:
    got, code = asyncio.run(_until_closed(ws_url, ['{"type": "nonsense"}']))  # answered, then nothing more sent
    assert [e["type"] for e in got] == ["error", "error"] and code == 1008, (got, code)
    assert "--ws-idle-timeout" in got[-1]["error"]["message"]


def test_an_unknown_model_is_closed_at_connect(ws_url: str) -> None:
    got, code = asyncio.run(_until_closed(ws_url + "?model=nobody", []))
    assert [e["type"] for e in got] == ["error"] and code == 1008, (got, code)


def test_the_end_of_the_text_closes_normally(ws_url: str) -> None:
    got, code = asyncio.run(_until_closed(ws_url, ['{"type": "input_text.delta", "delta": "Hi there."}',
                                                   '{"type": "input_text.done"}']))
    assert got[-1]["type"] == "speech.audio.done" and code == 1000, (got[-1], code)
