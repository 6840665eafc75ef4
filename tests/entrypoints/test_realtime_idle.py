"""server_vad's ``idle_timeout_ms`` on ``WS /v1/realtime``: after a reply, that much silence from the user makes the
session commit the idle stretch and answer it, announced by ``input_audio_buffer.timeout_triggered``."""

from __future__ import annotations

import asyncio
import time

import numpy as np

from tests.entrypoints.conftest import LiveServer
from tests.entrypoints.test_realtime import open_session, recv, send, stream_audio, until

RATE = 24000


async def reply_to_text(ws) -> None:  # noqa: ANN001
    await send(ws, {"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}})
    await send(ws, {"type": "response.create"})
    done, _ = await until(ws, "response.done")
    assert done["response"]["status"] == "completed"


def test_silence_after_a_reply_prompts_one_and_is_committed(server: LiveServer) -> None:
    async def scenario() -> None:
        async with await open_session(server, output_modalities=["text"], audio={"input": {
                "turn_detection": {"type": "server_vad", "idle_timeout_ms": 5000}}}) as ws:
            await reply_to_text(ws)
            ended = time.monotonic()
            await stream_audio(ws, np.zeros(RATE, np.float32), RATE)  # a second of microphone silence, then none
            triggered, _ = await until(ws, "input_audio_buffer.timeout_triggered")
            waited = time.monotonic() - ended
            assert 4.5 < waited < 9.0, waited
            assert triggered["audio_end_ms"] - triggered["audio_start_ms"] == 5000  # the idle stretch
            committed, _ = await until(ws, "input_audio_buffer.committed")
            assert committed["item_id"] == triggered["item_id"]
            created, _ = await until(ws, "response.created")
            done, _ = await until(ws, "response.done")
            assert done["response"]["status"] == "completed"
            # The prompted reply's end arms it again; speech starting stops it.
            await stream_audio(ws, np.zeros(RATE, np.float32), RATE)
    asyncio.run(scenario())
    heard = server.engine.front_end.processor.seen_audios[-1]
    assert len(heard) == 5 * 16000 and not np.abs(heard).max() > 1e-6  # 5 s of silence at 16 kHz


def test_idle_timeout_is_checked_and_described(server: LiveServer) -> None:
    async def scenario() -> None:
        async with await open_session(server) as ws:
            await send(ws, {"type": "session.update", "session": {"type": "realtime", "audio": {"input": {
                "turn_detection": {"type": "server_vad", "idle_timeout_ms": 100}}}}})
            error, _ = await until(ws, "error")
            assert error["error"]["code"] == "invalid_value" and "5000 to 30000" in error["error"]["message"]
            await send(ws, {"type": "session.update", "session": {"type": "realtime", "audio": {"input": {
                "turn_detection": {"type": "server_vad", "idle_timeout_ms": 7000}}}}})
            updated, _ = await until(ws, "session.updated")
            updated, _ = await until(ws, "session.updated")
            assert updated["session"]["audio"]["input"]["turn_detection"]["idle_timeout_ms"] == 7000
            await send(ws, {"type": "session.update", "session": {"type": "realtime", "audio": {"input": {
                "turn_detection": {"type": "semantic_vad", "idle_timeout_ms": 7000}}}}})
            error, _ = await until(ws, "error")
            assert "server_vad's" in error["error"]["message"]
    asyncio.run(scenario())


def test_no_timeout_without_idle_timeout_ms(server: LiveServer) -> None:
    async def scenario() -> None:
        async with await open_session(server, output_modalities=["text"]) as ws:
            await reply_to_text(ws)
            await send(ws, {"type": "session.update", "session": {"type": "realtime"}})
            await until(ws, "session.updated")
            try:
                event = await asyncio.wait_for(recv(ws), 6.0)
            except TimeoutError:
                return
            raise AssertionError(f"unexpected {event['type']}")
    asyncio.run(scenario())
