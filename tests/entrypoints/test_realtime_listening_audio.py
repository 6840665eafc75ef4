"""Streaming input in a session that speaks its replies: the prefill requests sent while the user speaks ask for
audio too, prefill-only (``OmniRequest.prefill_only``), so the talker prefills the turn's rows into its cache as
the thinker does; a text-only session's, or an engine without audio stages', stay one-token text requests.

Against the fake engine (its requests recorded); that a prefill-only audio request runs the talker and never the
codec stage is ``tests/pipeline/test_prefill_only*.py``'s.
"""

from __future__ import annotations

import asyncio

import numpy as np

from omnistage.core import FinishReason, Modality, OmniOutput, OmniRequest
from omnistage.entrypoints.openai.common.decode_pool import DecodePool
from omnistage.entrypoints.openai.realtime.listening import Listener
from omnistage.families.qwen3_omni.prompt import Qwen3OmniPrompt
from tests.audio.signals import speech_like
from tests.entrypoints.conftest import LiveServer
from tests.entrypoints.fake_engine import FakeEngine, fake_front_end
from tests.entrypoints.test_realtime import open_session, stream_audio, until
from tests.entrypoints.test_realtime_listening import long_turns, server  # noqa: F401 - fixtures

RATE = 16000
WAIT_S = 20.0  # how long a step may take on a loaded machine before the test gives up (not a timing check)
VAD = {"format": {"type": "audio/pcm", "rate": RATE},
       "turn_detection": {"type": "server_vad", "silence_duration_ms": 800}}
AUDIO = frozenset({Modality.TEXT, Modality.AUDIO})
TEXT = frozenset({Modality.TEXT})


async def _until_prefill(server: LiveServer) -> None:
    async with asyncio.timeout(WAIT_S):
        while not any(r.request_id.startswith("prefill") for r in server.engine.requests):
            await asyncio.sleep(0.05)


def _long_turn(server: LiveServer, **session: object) -> tuple[OmniRequest, OmniRequest]:
    """A 9 s turn (its first 8 s window completes while it is spoken): the window's prefill request and the
    turn's reply request."""
    speech = speech_like(9.0, RATE, seed=5)

    async def scenario() -> None:
        async with await open_session(server, **session) as ws:
            await stream_audio(ws, np.concatenate([np.zeros(RATE // 2, np.float32), speech[:int(8.6 * RATE)]]),
                               RATE)
            await _until_prefill(server)  # the window's prefill goes out while the user still speaks
            await stream_audio(ws, np.concatenate([speech[int(8.6 * RATE):], np.zeros(2 * RATE, np.float32)]), RATE)
            done, _ = await until(ws, "response.done")
            assert done["response"]["status"] == "completed"
    asyncio.run(scenario())
    (early,) = [r for r in server.engine.requests if r.request_id.startswith("prefill")]
    reply = server.engine.requests[-1]  # the committed turn's (a speculative reply may have come and gone)
    assert reply.request_id.startswith("resp")
    return early, reply


def test_a_spoken_reply_s_turn_is_prefilled_with_audio_prefill_only(server: LiveServer) -> None:
    early, reply = _long_turn(server, audio={"input": VAD, "output": {"voice": "aiden"}})
    assert reply.modalities == AUDIO and not reply.prefill_only and reply.voice == "Aiden"
    assert early.modalities == AUDIO and early.prefill_only and early.voice == reply.voice
    assert early.sampling.max_tokens == 1 and early.sampling.temperature == 0.0
    assert early.unspoken == reply.unspoken


def test_a_text_session_s_turn_is_prefilled_as_text(server: LiveServer) -> None:
    early, reply = _long_turn(server, output_modalities=["text"], audio={"input": VAD})
    assert reply.modalities == TEXT
    assert early.modalities == TEXT and not early.prefill_only and early.sampling.max_tokens == 1


def test_an_engine_without_audio_stages_prefills_as_text(server: LiveServer) -> None:
    """The session says audio (set while the engine had it); an engine that cannot make audio is still asked for
    a text prefill, never one it would refuse."""
    async def scenario() -> None:
        async with await open_session(server, audio={"input": VAD}) as ws:
            server.engine.supports_audio = False  # reset() restores it
            await stream_audio(ws, np.concatenate([np.zeros(RATE // 2, np.float32), speech_like(8.6, RATE, seed=6)]),
                               RATE)
            await _until_prefill(server)
    asyncio.run(scenario())
    (early,) = [r for r in server.engine.requests if r.request_id.startswith("prefill")]
    assert early.modalities == TEXT and not early.prefill_only


class _TalkerPart(FakeEngine):
    """A prefill-only audio request's thinker token comes back at once; its talker part then runs until the test
    lets it end (``talker_done``)."""

    def __init__(self, *args: object, **kw: object) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self.talker_done = asyncio.Event()

    async def generate(self, request: OmniRequest):  # noqa: ANN201
        self.requests.append(request)
        try:
            yield OmniOutput(request.request_id, text="a", token_ids=(1,))
            await self.talker_done.wait()
            yield OmniOutput(request.request_id, finished=True, finish_reason=FinishReason.LENGTH)
        finally:
            self.closed.append(request.request_id)


def test_a_commit_waits_for_the_prefill_s_thinker_part_only(processor) -> None:  # noqa: ANN001
    """The response's prompt extends the prefill's in the thinker: once the prefill's thinker token is back, its
    thinker blocks are cached and the response may go, while its talker part runs on (the talker caches rows from
    the step that computes them, before the response's talker start can ask)."""
    engine = _TalkerPart(fake_front_end(processor))

    async def prefill(audio: object) -> OmniRequest:
        return OmniRequest("prefill-1", Qwen3OmniPrompt([1, 2, 3]), AUDIO, prefill_only=True)

    async def scenario() -> None:
        pool = DecodePool(1)
        listener = Listener(engine, pool, prefill)
        try:
            listener.begin(0)  # the conversation so far, as the turn begins: one prefill in flight
            async with asyncio.timeout(WAIT_S):
                while not engine.requests:
                    await asyncio.sleep(0.01)
                listener.take(np.zeros(RATE, np.float32))
                await listener.settle()
            assert engine.closed == [] and not listener.in_flight()  # settled while its talker part still runs
            engine.talker_done.set()
            async with asyncio.timeout(WAIT_S):
                while not engine.closed:  # left to finish, never aborted
                    await asyncio.sleep(0.01)
        finally:
            await listener.close()
            pool.shutdown()
        assert engine.closed == ["prefill-1"] and engine.aborted == []
    asyncio.run(scenario())
