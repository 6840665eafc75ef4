"""A realtime session listening while the user speaks (``realtime/listening.py``), against the fake engine.

A turn longer than one audio-encoder window (8 s) sends a one-token text
prefill request once the window completes, and the turn's response prompt
carries the same frozen features for that window (so the thinker's prefix cache
serves it); a cleared buffer drops the frozen windows, and ``streaming_input:
false`` sends nothing early. Equality of the prefilled KV with the
whole-utterance pass is ``test_realtime_streaming_input.py``'s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from omnistage.core import Modality
from omnistage.entrypoints.cli import build_parser
from omnistage.entrypoints.openai.api_server import build_app
from omnistage.entrypoints.openai.server_config import ServerLimits, ServingOptions
from omnistage.entrypoints.serve_config import ServeConfig
from omnistage.processing.listened_audio import ListenedAudio
from tests.audio.signals import speech_like
from tests.entrypoints.conftest import LiveServer
from tests.entrypoints.fake_engine import FakeEngine, RecordingProcessor, fake_front_end
from tests.entrypoints.server_thread import ServerThread
from tests.entrypoints.test_realtime import open_session, send, stream_audio, until

RATE = 16000
WAIT_S = 20.0  # how long a step may take on a loaded machine before the test gives up (not a timing check)
VAD = {"format": {"rate": RATE}, "turn_detection": {"type": "server_vad", "silence_duration_ms": 800}}


@pytest.fixture(scope="module")
def long_turns(processor: RecordingProcessor, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """The fake engine behind a server whose input buffer holds turns longer than one encoder window."""
    engine = FakeEngine(fake_front_end(processor))
    thread = ServerThread(build_app(engine, ServerLimits(max_audio_seconds=30.0)))
    yield LiveServer(thread.start(), engine, tmp_path_factory.mktemp("media"))
    thread.stop()


@pytest.fixture()
def server(long_turns: LiveServer, processor: RecordingProcessor) -> LiveServer:
    long_turns.engine.reset()
    processor.seen_audios.clear()
    return long_turns


def _prefills(server: LiveServer) -> list:
    return [r for r in server.engine.requests if r.request_id.startswith("prefill")]


async def _wait_for_prefill(server: LiveServer) -> None:
    async with asyncio.timeout(WAIT_S):
        while not _prefills(server):
            await asyncio.sleep(0.05)


def test_a_long_turn_is_prefilled_while_spoken(server: LiveServer, processor) -> None:  # noqa: ANN001
    speech = speech_like(9.0, RATE, seed=3)

    async def scenario() -> None:
        async with await open_session(server, output_modalities=["text"], audio={"input": VAD}) as ws:
            await stream_audio(ws, np.concatenate([np.zeros(RATE // 2, np.float32), speech[:int(8.6 * RATE)]]),
                               RATE)
            await _wait_for_prefill(server)  # the first 8 s window completed while the user still speaks
            await stream_audio(ws, np.concatenate([speech[int(8.6 * RATE):], np.zeros(2 * RATE, np.float32)]), RATE)
            done, _ = await until(ws, "response.done")
            assert done["response"]["status"] == "completed"
    asyncio.run(scenario())
    (early,) = _prefills(server)
    assert early.modalities == frozenset({Modality.TEXT}) and early.sampling.max_tokens == 1
    final = server.engine.requests[-1]
    heard = processor.seen_audios[-1]
    assert isinstance(heard, ListenedAudio) and heard.head.shape[1] == 800
    # The response's prompt repeats the prefill's up to its last audio row, with the same features there.
    audio_rows = [i for i, t in enumerate(early.prompt.token_ids) if t == processor.audio_token_id]
    end = audio_rows[-1] + 1
    assert list(final.prompt.token_ids[:end]) == list(early.prompt.token_ids[:end])
    assert torch.equal(final.prompt.mm.input_features[-1][:, :800], early.prompt.mm.input_features[-1][:, :800])


def test_turn_two_prefills_the_conversation_when_speech_starts(server: LiveServer, processor) -> None:  # noqa: ANN001
    """A short second turn (no window completes) still finds turn 1 and its reply prefilled: a prefill of the
    conversation and the new turn's header goes out at its speech start, and the response's prompt repeats it
    up to that header."""
    quiet = np.zeros(2 * RATE, np.float32)

    async def scenario() -> None:
        async with await open_session(server, output_modalities=["text"], audio={"input": VAD}) as ws:
            for seed in (21, 22):
                await stream_audio(ws, np.concatenate([quiet[:RATE // 2], speech_like(1.5, RATE, seed=seed), quiet]),
                                   RATE)
                done, _ = await until(ws, "response.done")
                assert done["response"]["status"] == "completed"
    asyncio.run(scenario())
    (early,) = _prefills(server)  # turn 1 has no conversation before it, and neither turn completes a window
    final = server.engine.requests[-1]
    assert early.modalities == frozenset({Modality.TEXT}) and early.sampling.max_tokens == 1
    pads = [i for i, t in enumerate(final.prompt.token_ids) if t == processor.audio_token_id]
    turn_two = next(p for p, q in zip(pads[1:], pads) if p != q + 1)  # the second turn's first audio row
    same = next(i for i, (a, b) in enumerate(zip(early.prompt.token_ids, final.prompt.token_ids)) if a != b)
    assert same == turn_two - 1  # everything before the new turn's <|audio_start|> was in the prefill
    a, b = early.prompt.mm, final.prompt.mm  # turn 1's audio: the same frames (padded to each prompt's longest)
    frames = a.feature_attention_mask[0].bool()
    assert torch.equal(frames, b.feature_attention_mask[0].bool()[:len(frames)])
    assert torch.equal(a.input_features[0][:, frames], b.input_features[0][:, :len(frames)][:, frames])


class _SeesClosed(FakeEngine):
    """The fake engine, noting which requests had ended when each one arrived."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.closed_at_arrival: dict[str, list[str]] = {}

    async def generate(self, request):  # noqa: ANN001, ANN201
        self.closed_at_arrival[request.request_id] = list(self.closed)
        async for out in super().generate(request):
            yield out


def test_a_commit_lets_the_prefill_in_flight_finish(processor) -> None:  # noqa: ANN001
    """The user stops while a window's prefill still runs: it is not aborted, and the response (whose prompt
    extends it) is sent once it has finished, so the prefix cache serves what it computed."""
    engine = _SeesClosed(fake_front_end(processor))
    thread = ServerThread(build_app(engine, ServerLimits(max_audio_seconds=30.0)))
    server = LiveServer(thread.start(), engine, None)  # type: ignore[arg-type] - no media here

    async def scenario() -> None:
        async with await open_session(server, output_modalities=["text"], audio={"input": VAD}) as ws:
            await stream_audio(ws, np.concatenate([np.zeros(RATE // 2, np.float32), speech_like(8.6, RATE, seed=9)]),
                               RATE)
            await _wait_for_prefill(server)
            engine.delay_s = 0.0  # the prefill's one step already waits 1.5 s: the commit lands meanwhile
            await stream_audio(ws, np.zeros(2 * RATE, np.float32), RATE)
            done, _ = await until(ws, "response.done")
            assert done["response"]["status"] == "completed"
    try:
        engine.delay_s = 1.5
        asyncio.run(scenario())
    finally:
        thread.stop()
    (early,) = _prefills(server)
    response = engine.requests[-1]
    assert response.request_id.startswith("resp") and early.request_id not in engine.aborted
    assert early.request_id in engine.closed_at_arrival[response.request_id]


def test_a_cleared_buffer_drops_the_frozen_windows(server: LiveServer, processor) -> None:  # noqa: ANN001
    async def scenario() -> None:
        async with await open_session(server, output_modalities=["text"], audio={"input": VAD}) as ws:
            await stream_audio(ws, np.concatenate([np.zeros(RATE // 2, np.float32),
                                                   speech_like(8.6, RATE, seed=4)]), RATE)
            await _wait_for_prefill(server)
            await send(ws, {"type": "input_audio_buffer.clear"})
            await until(ws, "input_audio_buffer.cleared")
            await stream_audio(ws, np.concatenate([speech_like(1.0, RATE, seed=5), np.zeros(2 * RATE, np.float32)]),
                               RATE)
            await until(ws, "response.done")
    asyncio.run(scenario())
    heard = processor.seen_audios[-1]
    assert not isinstance(heard, ListenedAudio) and len(heard) < 3 * RATE


def test_streaming_input_off_prefills_nothing_early(server: LiveServer, processor) -> None:  # noqa: ANN001
    async def scenario() -> None:
        async with await open_session(server, output_modalities=["text"], streaming_input=False,
                                      audio={"input": VAD}) as ws:
            await stream_audio(ws, np.concatenate([np.zeros(RATE // 2, np.float32), speech_like(9.0, RATE, seed=6),
                                                   np.zeros(2 * RATE, np.float32)]), RATE)
            await until(ws, "response.done")
    asyncio.run(scenario())
    assert not _prefills(server)
    assert not isinstance(processor.seen_audios[-1], ListenedAudio)


def test_the_session_says_its_listening_settings(server: LiveServer) -> None:
    """``session.created``/``updated`` carry the settings in effect: the server's until the session sets its own."""
    async def scenario() -> list[tuple[object, object]]:
        seen = []
        async with await open_session(server) as ws:
            for update in ({"streaming_input": False}, {"streaming_input": True, "speculative_reply_ms": 300}):
                await send(ws, {"type": "session.update", "session": {"type": "realtime", **update}})
                updated, _ = await until(ws, "session.updated")
                seen.append((updated["session"]["streaming_input"], updated["session"]["speculative_reply_ms"]))
        return seen

    from omnistage.entrypoints.openai.server_config import DEFAULT_SPECULATIVE_REPLY_MS

    assert asyncio.run(scenario()) == [(False, DEFAULT_SPECULATIVE_REPLY_MS), (True, 300)]


def test_serve_switches_streaming_input_off() -> None:
    def serving(*flags: str) -> ServingOptions:
        return ServeConfig.from_args(build_parser().parse_args(["serve", *flags]), environ={}).serving

    assert serving().streaming_input is True
    assert serving("--no-streaming-input").streaming_input is False


def test_without_turn_detection_the_whole_buffer_streams(server: LiveServer, processor) -> None:  # noqa: ANN001
    """Push-to-talk (the client commits): the item is the buffer from its first append, prefilled as it grows."""
    speech = speech_like(9.0, RATE, seed=8)

    async def scenario() -> None:
        async with await open_session(server, output_modalities=["text"], audio={"input": {
                "format": {"rate": RATE}, "turn_detection": None}}) as ws:
            await stream_audio(ws, speech[:int(8.5 * RATE)], RATE)
            await _wait_for_prefill(server)
            await stream_audio(ws, speech[int(8.5 * RATE):], RATE)
            await send(ws, {"type": "input_audio_buffer.commit"})
            await until(ws, "input_audio_buffer.committed")
            await send(ws, {"type": "response.create"})
            await until(ws, "response.done")
    asyncio.run(scenario())
    heard = processor.seen_audios[-1]
    assert isinstance(heard, ListenedAudio) and heard.head.shape[1] == 800 and len(heard) == len(speech)
