"""What the TTS families' served tests share: a live in-process server of a checkpoint, the OpenAI client, the
streamed-against-whole and batched-against-alone checks of /v1/audio/speech, and a speech-stream WebSocket session
as a client holds it."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import Iterator

import numpy as np
import openai

from omnistage.entrypoints.openai.api_server import build_app
from omnistage.pipeline.async_omni import AsyncOmni
from omnistage.pipeline.runtime import PipelineOptions
from tests.entrypoints.server_thread import ServerThread


@contextlib.contextmanager
def serving(folder, name: str, **app_options) -> Iterator[str]:  # noqa: ANN001
    """A live server of ``folder`` (in-process stages) served as ``name``: its URL."""
    engine = AsyncOmni(folder, None, PipelineOptions(in_process=True), name)
    thread = ServerThread(build_app(engine, **app_options))
    try:
        yield thread.start()
    finally:
        thread.stop()
        asyncio.run(engine.shutdown())


def openai_client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)


def same_pcm(a: bytes, b: bytes, lsb: int = 1) -> None:
    """Chunk boundaries differ between a streamed and a whole response: float rounding may flip a pcm16 LSB (or
    ``lsb`` of them, for a decoder whose windows overlap)."""
    x, y = np.frombuffer(a, "<i2").astype(int), np.frombuffer(b, "<i2").astype(int)
    assert x.shape == y.shape and np.abs(x - y).max() <= lsb


def speak_concurrently_as_alone(url: str, model: str, voice: str, lsb: int = 1) -> None:
    """Utterances of different lengths batched in the talker's steps: each the audio it gets alone."""
    from concurrent.futures import ThreadPoolExecutor

    client = openai_client(url)
    texts = ["hello there, how are you today", "the quick brown fox jumps over the lazy dog", "good morning"]

    def speak(text: str) -> bytes:
        return client.audio.speech.create(model=model, voice=voice, input=text, response_format="pcm").content

    alone = [speak(t) for t in texts]
    with ThreadPoolExecutor(len(texts)) as pool:
        together = list(pool.map(speak, texts))
    for a, b in zip(alone, together):
        same_pcm(a, b, lsb)


def sse_joins_to_the_whole(url: str, model: str, voice: str, text: str) -> None:
    client = openai_client(url)
    whole = client.audio.speech.create(model=model, voice=voice, input=text, response_format="pcm").content
    with client.audio.speech.with_streaming_response.create(model=model, voice=voice, input=text,
                                                            response_format="pcm", stream_format="sse") as r:
        events = [json.loads(line[len("data: "):]) for line in r.iter_lines() if line.startswith("data: ")]
    deltas = [base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta"]
    assert len(deltas) >= 2
    same_pcm(b"".join(deltas), whole)


def streamed_bytes_join_to_the_whole(url: str, model: str, voice: str, text: str) -> None:
    client = openai_client(url)
    whole = client.audio.speech.create(model=model, voice=voice, input=text, response_format="pcm").content
    with client.audio.speech.with_streaming_response.create(model=model, voice=voice, input=text,
                                                            response_format="pcm") as r:
        same_pcm(b"".join(r.iter_bytes()), whole)


async def ws_session(url: str, model: str, events: list[dict]) -> list[dict]:
    """``events`` sent in order on the speech-stream WebSocket; every event received until the audio is done (or
    an error)."""
    from websockets.asyncio.client import connect

    received: list[dict] = []
    async with connect(url.replace("http://", "ws://") + f"/v1/audio/speech/stream?model={model}", open_timeout=10,
                       max_size=None) as ws:
        for event in events:
            await ws.send(json.dumps(event))
        while not received or received[-1]["type"] not in ("speech.audio.done", "error"):
            received.append(json.loads(await asyncio.wait_for(ws.recv(), 60)))
    return received


def ws_speaks_each_sentence(url: str, model: str, voice: str) -> None:
    """Incremental text on the speech-stream WebSocket: each sentence is spoken as /v1/audio/speech speaks it."""
    pieces = ["hello the", "re, how are you today? I am ", "fine, thank", " you."]
    events = [{"type": "session.update", "voice": voice}]
    events += [{"type": "input_text.delta", "delta": p} for p in pieces] + [{"type": "input_text.done"}]
    got = asyncio.run(ws_session(url, model, events))
    assert got[-1]["type"] == "speech.audio.done", got[-1]
    done = [e["text"] for e in got if e["type"] == "speech.segment.done"]
    assert len(done) == 2
    client = openai_client(url)
    for segment, text in enumerate(done):
        data = b"".join(base64.b64decode(e["audio"]) for e in got
                        if e["type"] == "speech.audio.delta" and e["segment"] == segment)
        whole = client.audio.speech.create(model=model, voice=voice, input=text, response_format="pcm").content
        same_pcm(data, whole)
