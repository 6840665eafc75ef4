"""The speculative reply (``realtime/speculation.py``): a turn's reply started at a pause, before server VAD ends it.

Against the fake engine (its requests recorded): a real end gives the events a session without speculation gives, in
the same order, with the committed item cut at the pause; that item's reply is the request a plain commit of the
same audio gets; a false end (a pause shorter than the silence) leaves no trace in the events, and its request is
aborted. On the tiny pipeline (``e2e``): a false end, a cleared buffer and a disconnect during speculation leave
every stage's KV blocks free, and the speculative reply's text equals the plain commit's at temperature 0.
"""

from __future__ import annotations

import asyncio
import re

import httpx
import numpy as np
import pytest
import torch
from websockets.asyncio.client import ClientConnection

from omnistage.audio.vad import VadConfig
from omnistage.audio.vad_backend import vad_backend
from omnistage.entrypoints.openai.api_server import build_app
from omnistage.entrypoints.openai.server_config import ServingOptions
from omnistage.pipeline.async_omni import AsyncOmni
from tests.entrypoints.conftest import LiveServer
from tests.entrypoints.fake_engine import FakeEngine, RecordingProcessor, fake_front_end
from tests.entrypoints.server_thread import ServerThread
from tests.audio.signals import speech_like
from tests.entrypoints.test_realtime import open_session, recv, send, stream_audio, until
from tests.entrypoints.test_realtime_pipeline import _kv_in_use, _Server, live  # noqa: F401 - live: a fixture

RATE = 16000
PAD = 300 * RATE // 1000  # OpenAI's prefix padding: the item starts this long before the detected speech
WAIT_S = 20.0  # how long a step may take on a loaded machine before the test gives up (not a timing check)


def quiet(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * RATE), np.float32)


def vad_session(speculative_ms: int, silence_ms: int = 500) -> dict:
    return {"speculative_reply_ms": speculative_ms,
            "audio": {"input": {"format": {"type": "audio/pcm", "rate": RATE},
                                "turn_detection": {"type": "server_vad", "silence_duration_ms": silence_ms}}}}


async def turn_events(ws: ClientConnection, audio: np.ndarray) -> list[dict]:
    """Streams ``audio`` (100 ms appends) and reads every event up to the response's ``response.done``."""
    await stream_audio(ws, audio, RATE)
    done, events = await until(ws, "response.done")
    return [*events, done]


def outcomes(server: LiveServer) -> dict[str, float]:
    """``/metrics``' speculative replies by outcome."""
    text = httpx.get(f"{server.base_url}/metrics", timeout=WAIT_S).text
    found = re.findall(r'omnistage_realtime_speculative_replies_total\{outcome="(\w+)"\} (\S+)', text)
    return {"used": 0.0, "dropped": 0.0, **{k: float(v) for k, v in found}}


def shape(events: list[dict]) -> list[str]:
    """The event kinds in order, the deltas of one kind counted as one (their number follows the audio chunks)."""
    kinds = [e["type"] for e in events]
    return [k for i, k in enumerate(kinds) if i == 0 or k != kinds[i - 1] or not k.endswith(".delta")]


def test_a_real_end_gives_the_same_events_and_commits_the_audio_to_the_pause(
        server: LiveServer, processor: RecordingProcessor) -> None:
    speech = np.concatenate([quiet(0.5), speech_like(1.5, RATE, seed=41), quiet(1.5)])

    async def one(speculative_ms: int) -> list[dict]:
        async with await open_session(server, output_modalities=["text", "audio"], **vad_session(speculative_ms)) as ws:
            return await turn_events(ws, speech)
    plain = asyncio.run(one(0))
    plain_audio = len(processor.seen_audios[-1])
    before = outcomes(server)
    early = asyncio.run(one(200))
    early_audio = len(processor.seen_audios[-1])
    assert shape(early) == shape(plain)
    assert shape(early)[:5] == ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
                                "input_audio_buffer.committed", "conversation.item.added", "conversation.item.done"]
    assert early[-1]["response"]["status"] == "completed"
    stopped = next(e for e in early if e["type"] == "input_audio_buffer.speech_stopped")
    committed = next(e for e in early if e["type"] == "input_audio_buffer.committed")
    assert stopped["item_id"] == committed["item_id"]
    # The speculative item ends 200 ms into the silence; the plain one holds the whole 500 ms wait and more.
    assert plain_audio - early_audio >= 0.25 * RATE
    start = next(e for e in early if e["type"] == "input_audio_buffer.speech_started")["audio_start_ms"] * RATE // 1000
    assert abs((start - PAD + early_audio) / RATE - (2.0 + 0.2)) <= 0.1  # cut where the VAD heard 200 ms of silence
    assert len([r for r in server.engine.requests if r.request_id.startswith("resp")]) == 2  # one each, none wasted
    assert outcomes(server) == {"used": before["used"] + 1, "dropped": before["dropped"]}


def test_the_reply_is_the_reply_to_the_committed_item(server: LiveServer, processor) -> None:  # noqa: ANN001
    """The speculative reply's request equals the one a plain commit of the same audio (the client committing it,
    no VAD) gets: the same audio, prompt tokens, features and sampling; so are the reply's events."""
    speech = np.concatenate([quiet(0.5), speech_like(1.3, RATE, seed=42), quiet(1.5)])

    async def scenario() -> tuple[list[dict], list[dict]]:
        async with await open_session(server, output_modalities=["text"], **vad_session(200)) as ws:
            early = await turn_events(ws, speech)
        start = next(e for e in early if e["type"] == "input_audio_buffer.speech_started")["audio_start_ms"]
        cut = max(0, start * RATE // 1000 - PAD)
        heard = speech[cut:cut + len(processor.seen_audios[-1])]
        async with await open_session(server, output_modalities=["text"], audio={"input": {
                "format": {"type": "audio/pcm", "rate": RATE}, "turn_detection": None}}) as ws:
            await stream_audio(ws, heard, RATE)
            await send(ws, {"type": "input_audio_buffer.commit"})
            await send(ws, {"type": "response.create"})
            done, plain = await until(ws, "response.done")
        return early, [*plain, done]
    before = outcomes(server)
    early, plain = asyncio.run(scenario())
    assert outcomes(server)["used"] == before["used"] + 1  # the first reply was the speculative one
    responses = [r for r in server.engine.requests if r.request_id.startswith("resp")]
    assert len(responses) == 2
    a, b = responses
    np.testing.assert_array_equal(processor.seen_audios[-2], processor.seen_audios[-1])
    assert list(a.prompt.token_ids) == list(b.prompt.token_ids) and a.sampling == b.sampling
    assert a.modalities == b.modalities and a.voice == b.voice
    # Only the speculative one is played from the turn's end on (its first codec chunk may be smaller).
    assert a.plays_at is not None and b.plays_at is None
    for x, y in zip(a.prompt.mm.input_features, b.prompt.mm.input_features, strict=True):
        assert torch.equal(x, y)
    deltas = lambda events: [e["delta"] for e in events if e["type"] == "response.output_text.delta"]  # noqa: E731
    assert deltas(early) == deltas(plain) and deltas(early)


def test_a_false_end_leaves_no_trace(server: LiveServer, processor) -> None:  # noqa: ANN001
    """A 350 ms pause (past the 200 ms speculation, short of the 800 ms silence): the speculative request is
    aborted, the client sees one turn and one response, and the item holds all of it."""
    first, second = speech_like(1.2, RATE, seed=43), speech_like(1.0, RATE, seed=44)
    server.engine.delay_s = 0.05  # the speculative reply is still running when the user speaks again
    before = outcomes(server)

    async def scenario() -> list[dict]:
        async with await open_session(server, output_modalities=["text"], **vad_session(200, 800)) as ws:
            await stream_audio(ws, np.concatenate([quiet(0.5), first, quiet(0.35)]), RATE)
            async with asyncio.timeout(WAIT_S):
                while not any(r.request_id.startswith("resp") for r in server.engine.requests):
                    await asyncio.sleep(0.02)
            return await turn_events(ws, np.concatenate([second, quiet(1.5)]))
    events = asyncio.run(scenario())
    kinds = [e["type"] for e in events]
    assert kinds.count("input_audio_buffer.speech_started") == 1 and kinds.count("response.created") == 1
    assert kinds.count("input_audio_buffer.speech_stopped") == 1 and kinds.count("input_audio_buffer.committed") == 1
    thrown, answer = [r for r in server.engine.requests if r.request_id.startswith("resp")]
    assert thrown.request_id in server.engine.aborted and answer.request_id not in server.engine.aborted
    ids = {e.get("response", {}).get("id") for e in events} | {e.get("response_id") for e in events}
    assert thrown.request_id not in ids and answer.request_id in ids
    assert events[-1]["response"]["status"] == "completed"
    assert len(processor.seen_audios[-1]) >= len(first) + len(second)  # the committed item spans the pause
    assert outcomes(server) == {"used": before["used"] + 1, "dropped": before["dropped"] + 1}


def test_a_client_event_during_speculation_cancels_it(server: LiveServer) -> None:
    """Anything but an append while the reply is held (here a cleared buffer) aborts it and sends nothing of it."""
    server.engine.delay_s = 0.05

    async def scenario() -> list[dict]:
        async with await open_session(server, output_modalities=["text"], **vad_session(200, 800)) as ws:
            await stream_audio(ws, np.concatenate([quiet(0.5), speech_like(1.0, RATE, seed=45), quiet(0.4)]), RATE)
            async with asyncio.timeout(WAIT_S):
                while not any(r.request_id.startswith("resp") for r in server.engine.requests):
                    await asyncio.sleep(0.02)
            await send(ws, {"type": "input_audio_buffer.clear"})
            cleared, seen = await until(ws, "input_audio_buffer.cleared")
            await stream_audio(ws, quiet(1.0), RATE)
            await send(ws, {"type": "conversation.item.retrieve", "item_id": "nothing"})
            last = await recv(ws)  # the reply to the retrieve: nothing of the thrown reply came before it
            return [*seen, cleared, last]
    events = asyncio.run(scenario())
    assert [e["type"] for e in events] == ["input_audio_buffer.speech_started", "input_audio_buffer.cleared", "error"]
    (thrown,) = [r for r in server.engine.requests if r.request_id.startswith("resp")]
    assert thrown.request_id in server.engine.aborted


# -- the tiny pipeline (``live``: test_realtime_pipeline's, its replies long enough to act on while they run) ------
async def _idle(engine: AsyncOmni) -> dict[str, int]:
    """Each stage replica's KV blocks held, running and queued requests, once all are 0 (or after ``WAIT_S``)."""
    async with asyncio.timeout(WAIT_S):
        while any(_kv_in_use(engine).values()):
            await asyncio.sleep(0.05)
    return _kv_in_use(engine)


async def _talker_running(engine: AsyncOmni) -> None:
    """Waits until a reply reaches the talker: the speculative one (prefill requests are text only)."""
    async with asyncio.timeout(WAIT_S):
        while not any(r.running for r in engine.stats().replicas if r.stage == "talker"):
            await asyncio.sleep(0.02)


@pytest.mark.e2e
@pytest.mark.parametrize("ending", ["false_end", "clear", "disconnect"])
def test_thrown_away_speculation_frees_every_block(live: _Server, ending: str) -> None:
    async def scenario() -> list[dict]:
        async with await open_session(live, max_output_tokens=6, **vad_session(200, 800)) as ws:
            await stream_audio(ws, np.concatenate([quiet(0.5), speech_like(1.0, RATE, seed=46), quiet(0.4)]), RATE)
            await _talker_running(live.engine)
            if ending == "disconnect":
                return []
            if ending == "clear":
                await send(ws, {"type": "input_audio_buffer.clear"})
                _, seen = await until(ws, "input_audio_buffer.cleared")
                assert await _idle(live.engine) == {k: 0 for k in _kv_in_use(live.engine)}
                return seen
            events = await turn_events(ws, np.concatenate([speech_like(0.8, RATE, seed=47), quiet(1.5)]))
            await ws.send('{"type": "response.cancel"}')  # the reply ends early, or has ended
            return events
    events = asyncio.run(scenario())
    kinds = [e["type"] for e in events]
    assert kinds.count("response.created") == (1 if ending == "false_end" else 0)
    assert kinds.count("input_audio_buffer.speech_started") == (0 if ending == "disconnect" else 1)
    assert asyncio.run(_idle(live.engine)) == {k: 0 for k in _kv_in_use(live.engine)}


@pytest.mark.e2e
def test_the_speculative_reply_says_what_a_plain_commit_says(live: _Server) -> None:
    """At temperature 0 the thinker's text is the same whether the reply started at the pause or after a commit of
    the same audio by the client."""
    speech = np.concatenate([quiet(0.5), speech_like(1.2, RATE, seed=48), quiet(1.5)])

    def transcript(events: list[dict]) -> str:
        return "".join(e["delta"] for e in events if e["type"] == "response.output_audio_transcript.delta")

    async def scenario() -> tuple[str, str]:
        async with await open_session(live, temperature=0.0, max_output_tokens=8, **vad_session(200)) as ws:
            early = await turn_events(ws, speech)
        async with await open_session(live, temperature=0.0, max_output_tokens=8, audio={"input": {
                "format": {"type": "audio/pcm", "rate": RATE}, "turn_detection": None}}) as ws:
            await stream_audio(ws, heard_to_the_pause(speech), RATE)
            await send(ws, {"type": "input_audio_buffer.commit"})
            await send(ws, {"type": "response.create"})
            done, plain = await until(ws, "response.done")
        return transcript(early), transcript([*plain, done])
    early, plain = asyncio.run(scenario())
    assert early and early == plain


def heard_to_the_pause(speech: np.ndarray) -> np.ndarray:
    """The item a speculative reply answers: from the prefix padding before the speech start to the pause, as the
    server's detector (the same backend, fed the same 100 ms pieces) finds them."""
    vad = vad_backend().make(VadConfig(silence_duration_ms=500, pause_ms=200), RATE)
    events = [e for i in range(0, len(speech), RATE // 10) for e in vad.feed(speech[i:i + RATE // 10])]
    start = next(e.sample for e in events if e.kind == "speech_started")
    pause = next(e.sample for e in events if e.kind == "speech_paused")
    return speech[max(0, start - PAD):pause]


def test_serve_names_the_first_codec_chunk_of_realtime_replies(processor) -> None:  # noqa: ANN001
    """``--realtime-first-chunk-frames``: every reply's request (the speculative one too) names its first chunk;
    without it the request leaves the choice to the stage (None)."""
    engine = FakeEngine(fake_front_end(processor))
    thread = ServerThread(build_app(engine, serving=ServingOptions(realtime_first_chunk_frames=3)))
    server = LiveServer(thread.start(), engine, None)  # type: ignore[arg-type] - no media here
    try:
        async def scenario() -> None:
            async with await open_session(server, **vad_session(200)) as ws:
                await turn_events(ws, np.concatenate([quiet(0.5), speech_like(1.0, RATE, seed=49), quiet(1.5)]))
        asyncio.run(scenario())
    finally:
        thread.stop()
    (reply,) = [r for r in engine.requests if r.request_id.startswith("resp")]
    assert reply.initial_codec_chunk_frames == 3 and reply.wants_audio
    assert ServingOptions().realtime_first_chunk_frames is None
    with pytest.raises(ValueError, match="realtime-first-chunk-frames"):
        ServingOptions(realtime_first_chunk_frames=0)


def test_a_session_sets_its_pause_or_turns_it_off(server: LiveServer) -> None:
    """``session.speculative_reply_ms``: a negative or non-integer value is refused, naming the field (0, which turns
    the speculative reply off, is the baseline of the real-end test above)."""
    async def scenario() -> list[dict]:
        async with await open_session(server) as ws:
            errors = []
            for bad in (-1, 0.5, "200"):
                await send(ws, {"type": "session.update", "session": {"speculative_reply_ms": bad}})
                error, _ = await until(ws, "error")
                errors.append(error["error"])
            return errors
    for error in asyncio.run(scenario()):
        assert error["param"] == "session.speculative_reply_ms" and error["code"] in ("invalid_value", "invalid_type")
