"""The live transcript of a realtime session (``realtime/live_transcript.py``) on the fake engine, driven directly:
a run starts once the turn has grown by a step, only while more than half the admission bound is free and no
response runs; what two runs agree on is sent once as a delta and becomes the opening the next runs (and the
commit's) continue; a run cancelled before it ever ran gives its place back."""

from __future__ import annotations

import asyncio

import numpy as np

from omnistage.entrypoints.openai.realtime.session_loop import RealtimeSession
from tests.entrypoints.conftest import TEST_LIMITS
from tests.entrypoints.fake_engine import RecordingProcessor
from tests.entrypoints.realtime_harness import QueuedTransport, realtime_service

DELTA = "conversation.item.input_audio_transcription.delta"


def _session(processor: RecordingProcessor) -> tuple[RealtimeSession, QueuedTransport]:
    transport = QueuedTransport([])
    session = RealtimeSession(transport, realtime_service(processor, TEST_LIMITS))
    session.state.update({"type": "session.update", "session": {"audio": {"input": {
        "transcription": {"model": "whisper-1"}}}}}, buffered=False)
    return session, transport


def _grow(session: RealtimeSession, seconds: float) -> None:
    session.buffer.append_samples(np.zeros(int(seconds * session.buffer.rate), np.float32))
    session.live.heard(session.buffer)


async def _settled(session: RealtimeSession) -> None:
    task = session.live._task
    if task is not None:
        await asyncio.wait([task])


def test_runs_agree_then_continue_what_was_sent(processor: RecordingProcessor) -> None:
    async def scenario() -> None:
        session, transport = _session(processor)
        engine = session.engine
        engine.reset()
        session.live.begin("item_live", 0)
        _grow(session, 0.5)
        assert session.live._task is None  # less than a step heard
        _grow(session, 0.6)
        await _settled(session)  # the first run: nothing to agree with yet
        assert transport.of(DELTA) == [] and len(engine.requests) == 1
        _grow(session, 1.0)
        await _settled(session)  # the fake engine writes the same words again: all but the last are agreed
        assert [e["delta"] for e in transport.of(DELTA)] == ["Hello from the fake"]
        assert transport.of(DELTA)[0]["item_id"] == "item_live"
        _grow(session, 1.0)
        await _settled(session)
        prompt = processor.tokenizer.decode(list(engine.requests[-1].prompt.token_ids))
        assert prompt.endswith("assistant\nHello from the fake")  # later runs continue the opening
        opening = await session.live.finish("item_live")
        assert opening.text.startswith("Hello from the fake")
        assert await session.live.finish("item_other") == type(opening)()  # another item has none
        assert session.service.admission.admitted == 0

    asyncio.run(scenario())


def test_a_run_leaves_half_the_bound_and_a_running_response_alone(processor: RecordingProcessor) -> None:
    async def scenario() -> None:
        session, _ = _session(processor)
        admission = session.service.admission
        held = [admission.admit() for _ in range(admission.max_requests // 2)]
        session.live.begin("item_live", 0)
        _grow(session, 1.5)
        assert session.live._task is None  # one more place would take more than half
        held.pop().release()
        session.response = asyncio.get_running_loop().create_future()  # a response is running
        _grow(session, 1.5)
        assert session.live._task is None
        session.response.set_result(None)
        _grow(session, 1.5)
        assert session.live._task is not None and admission.admitted == len(held) + 1
        task = session.live._task
        session.live.discard()  # cancelled before it ever ran: its place comes back all the same
        await asyncio.wait([task])
        assert task.cancelled()
        assert admission.admitted == len(held)
        for ticket in held:
            ticket.release()

    asyncio.run(scenario())


def test_later_runs_are_asked_in_the_language_the_opening_was_written_in(processor: RecordingProcessor) -> None:
    from omnistage.entrypoints.openai.realtime.transcribe import Opening, ask_for

    session, _ = _session(processor)
    audio = np.zeros(1600, np.float32)
    ask = ask_for(session, audio, Opening("Bonjour à", "French"))
    assert (ask.language, ask.prefix) == ("French", "Bonjour à")  # a recogniser detected it: forced from now on
    session.state.update({"type": "session.update", "session": {"audio": {"input": {
        "transcription": {"model": "whisper-1", "language": "de", "prompt": "Guten Tag."}}}}}, buffered=False)
    ask = ask_for(session, audio, Opening("Hallo", "German"))
    assert (ask.language, ask.context, ask.prefix) == ("de", "Guten Tag.", "Hallo")  # the session's own wins
    assert ask_for(session, audio).prefix == ""
