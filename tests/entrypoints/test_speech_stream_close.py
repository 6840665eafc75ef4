"""What closes a speech stream (``WS /v1/audio/speech/stream``): the end of its text or a cancel (1000, after
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
def engine(processor: RecordingProcessor) -> FakeEngine:
    return FakeEngine(fake_front_end(processor))


@pytest.fixture(scope="module")
def ws_url(engine: FakeEngine) -> Iterator[str]:
    thread = ServerThread(build_app(engine, ServerLimits(ws_idle_timeout=1.0), MediaPolicy()))
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
    assert [e["type"] for e in got] == ["session.created", "error", "error"] and code == 1008, (got, code)
    assert "--ws-idle-timeout" in got[-1]["error"]["message"]


def test_an_unknown_model_is_closed_at_connect(ws_url: str) -> None:
    got, code = asyncio.run(_until_closed(ws_url + "?model=nobody", []))
    assert [e["type"] for e in got] == ["error"] and code == 1008, (got, code)


def test_the_end_of_the_text_closes_normally(ws_url: str) -> None:
    got, code = asyncio.run(_until_closed(ws_url, ['{"type": "input_text.delta", "delta": "Hi there."}',
                                                   '{"type": "input_text.done"}']))
    assert got[-1]["type"] == "speech.audio.done" and code == 1000, (got[-1], code)


@pytest.mark.parametrize("ended", [False, True])
def test_a_cancel_stops_the_audio_within_a_chunk_and_closes_normally(ws_url: str, engine: FakeEngine,
                                                                     ended: bool) -> None:
    """A model that cannot take text deltas (sentences, as ``session.created`` says): a cancel while a sentence
    speaks aborts its request; at most the chunk in flight follows it, and the queued sentence is not spoken. The
    socket is still read after the text's end (``ended``): a cancel then is heard too."""
    engine.reset()
    engine.delay_s = 0.2  # a chunk every 0.2 s: six of them to the sentence's end

    async def session() -> tuple[list[dict], list[dict], int | None]:
        async with connect(ws_url, open_timeout=10) as ws:
            created = json.loads(await ws.recv())
            await ws.send('{"type": "input_text.delta", "delta": "Hi there. And a second sentence. "}')
            if ended:
                await ws.send('{"type": "input_text.done"}')
            while json.loads(await asyncio.wait_for(ws.recv(), 30))["type"] != "speech.audio.delta":
                pass
            await ws.send('{"type": "input_text.cancel"}')
            after = [json.loads(m) async for m in ws]
            return [created], after, ws.close_code

    try:
        created, after, code = asyncio.run(session())
        requests, aborted = [r.request_id for r in engine.requests], list(engine.aborted)
    finally:
        engine.reset()
    assert created[0]["session"]["text_input"] == "sentences"
    assert code == 1000 and after[-1]["type"] == "speech.audio.done", after
    assert sum(e["type"] == "speech.audio.delta" for e in after) <= 1
    assert not any(e["type"] == "speech.segment.done" for e in after)  # neither sentence was spoken to its end
    assert len(requests) == 1 and aborted == requests
