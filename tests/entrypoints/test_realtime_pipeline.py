"""``WS /v1/realtime`` on the real tiny pipeline: spoken input → text + audio deltas, barge-in frees every
stage's KV blocks, and later turns reuse the earlier turns' prefix (spoken ones included) in the thinker's cache."""

from __future__ import annotations

import asyncio
import base64
import time
from pathlib import Path

import pytest

from omnistage.entrypoints.openai.api_server import build_app
from omnistage.entrypoints.openai.realtime.conversation import PromptSpec
from omnistage.entrypoints.openai.realtime.conversation import render_prompt as render_spec
from omnistage.entrypoints.openai.realtime.items import Item
from omnistage.pipeline.async_omni import AsyncOmni
from omnistage.pipeline.runtime import PipelineOptions
from tests.entrypoints.server_thread import ServerThread
from tests.entrypoints.test_realtime import open_session, send, spoken_like, stream_audio, until
from tests.pipeline.specs import small_dict, write_spec

pytestmark = pytest.mark.e2e
LONG_FRAMES = 160  # talker frames a response makes at least: long enough to cancel in the middle


class _Server:
    def __init__(self, base_url: str, engine: AsyncOmni) -> None:
        self.base_url, self.engine = base_url, engine


@pytest.fixture(scope="module")
def live(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    data = small_dict(talker_frames=LONG_FRAMES)
    config = write_spec(tmp_path_factory.mktemp("stages"), data)
    engine = AsyncOmni(tiny_dir, config, PipelineOptions(in_process=True, talker_min_new_tokens=LONG_FRAMES), "tiny")
    thread = ServerThread(build_app(engine))
    try:
        yield _Server(thread.start(), engine)
    finally:
        thread.stop()
        asyncio.run(engine.shutdown())


def _kv_in_use(engine: AsyncOmni) -> dict[str, int]:
    return {f"{r.stage}/{r.replica}": r.kv_blocks_used + r.running + r.queue_depth for r in engine.stats().replicas}


def _wait_idle(engine: AsyncOmni, timeout_s: float = 15.0) -> dict[str, int]:
    deadline = time.monotonic() + timeout_s
    while any(_kv_in_use(engine).values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _kv_in_use(engine)


def test_spoken_turn_streams_text_and_audio(live: _Server) -> None:
    async def scenario() -> None:
        async with await open_session(live, audio={"input": {"format": {"type": "audio/pcm", "rate": 16000},
                                                             "turn_detection": None}}) as ws:
            await stream_audio(ws, spoken_like(1.0, 16000), 16000)  # 100 ms pieces
            await send(ws, {"type": "input_audio_buffer.commit"})
            await send(ws, {"type": "response.create", "response": {"max_output_tokens": 6}})
            done, events = await until(ws, "response.done")
            kinds = [e["type"] for e in events]
            assert "response.output_audio_transcript.delta" in kinds and "response.output_audio.done" in kinds
            pcm = b"".join(base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta")
            assert len(pcm) > 0 and len(pcm) % 2 == 0
            assert done["response"]["status"] in ("completed", "incomplete")
    asyncio.run(scenario())
    assert not any(_wait_idle(live.engine).values())


def test_cancel_mid_response_frees_every_stage(live: _Server) -> None:
    """A sampled answer can end (or reach its token limit) before the cancel reaches the server, so the scenario is tried
    a few times: at least one response must end cancelled mid-audio, and every stage must be idle afterwards."""
    async def scenario() -> str:
        async with await open_session(live) as ws:
            await send(ws, {"type": "conversation.item.create",
                            "item": {"role": "user", "content": [{"type": "input_text", "text": "talk to me"}]}})
            await send(ws, {"type": "response.create", "response": {"max_output_tokens": 512}})
            await until(ws, "response.output_audio.delta")  # mid-response: audio is flowing
            await send(ws, {"type": "response.cancel"})
            done, _ = await until(ws, "response.done")
            return done["response"]["status"]
    statuses: list[str] = []
    while "cancelled" not in statuses and len(statuses) < 5:
        statuses.append(asyncio.run(scenario()))
    assert set(statuses) <= {"cancelled", "completed", "incomplete"} and "cancelled" in statuses, statuses
    assert _wait_idle(live.engine) == {k: 0 for k in _kv_in_use(live.engine)}


def test_spoken_turns_report_the_prefix_cache_hits(live: _Server) -> None:
    """Each spoken turn re-sends the conversation; from turn 2 on, the earlier turns (their audio included) come
    from the thinker's prefix cache, which response.done reports as usage.input_token_details.cached_tokens."""
    block = 16  # the preset thinker's block size
    usages: list[dict] = []

    async def scenario() -> None:
        async with await open_session(live, audio={"input": {"format": {"type": "audio/pcm", "rate": 16000},
                                                             "turn_detection": None}}) as ws:
            for seed, seconds in ((11, 1.0), (12, 1.4), (13, 0.6)):  # seeds no other test speaks with
                await stream_audio(ws, spoken_like(seconds, 16000, seed=seed), 16000)
                await send(ws, {"type": "input_audio_buffer.commit"})
                await send(ws, {"type": "response.create", "response": {"max_output_tokens": 6}})
                done, _ = await until(ws, "response.done")
                assert done["response"]["status"] in ("completed", "incomplete")
                usages.append(done["response"]["usage"])
    asyncio.run(scenario())
    inputs = [u["input_tokens"] for u in usages]
    cached = [u["input_token_details"]["cached_tokens"] for u in usages]
    print(f"\nspoken turns: prompt tokens {inputs}, from the prefix cache {cached}")
    assert cached[0] < inputs[0]  # a new audio: at most the text before it is shared
    for previous, now in zip(inputs, cached[1:]):
        assert now >= previous // block * block > 0  # every full block of the previous turn's prompt


def test_second_turn_reuses_the_cached_prefix(tiny_dir: Path) -> None:
    """The thinker engine itself (no server): turn 2's prompt, as the session renders it, hits turn 1's blocks."""
    from omnistage.config.pipeline import parse_pipeline
    from omnistage.families.qwen3_omni.payloads import ThinkerPrompt
    from omnistage.families.qwen3_omni.workers import ThinkerWorker
    from omnistage.ipc.messages import StageInput
    from omnistage.ipc.payloads import TokenDelta
    from omnistage.sampling_params import SamplingParams
    from omnistage.workers.base import WorkerSpec
    from omnistage.families.qwen3_omni.prompt import Qwen3OmniPromptProcessor

    spec = parse_pipeline(small_dict()).stage("thinker")
    assert spec.engine.enable_prefix_caching
    worker = ThinkerWorker(WorkerSpec(str(tiny_dir), spec))
    processor = Qwen3OmniPromptProcessor.from_folder(tiny_dir)
    instructions = "You are a helpful voice assistant. Answer briefly and kindly, in one sentence."
    turns = [Turn("item_1", "user", text="What is the weather like on the coast today?")]

    def run(request_id: str, token_ids: list[int]) -> list[int]:
        worker.handle(StageInput(request_id, ThinkerPrompt(token_ids, SamplingParams(temperature=0.0, max_tokens=12))))
        request = worker.requests[request_id]
        out: list[int] = []
        while True:
            for msg in worker.step().outputs:
                if isinstance(msg.payload, TokenDelta) and msg.request_id == request_id:
                    out.extend(msg.payload.token_ids)
                    if msg.finished:
                        run.cached = request.num_cached_tokens  # type: ignore[attr-defined]
                        return out

    first = render_prompt(processor, instructions, turns).token_ids
    answer = processor.tokenizer.decode(run("turn-1", first), skip_special_tokens=True)
    assert run.cached == 0  # type: ignore[attr-defined]
    turns += [Turn("item_2", "assistant", text=answer), Turn("item_3", "user", text="And tomorrow?")]
    second = render_prompt(processor, instructions, turns).token_ids
    assert second[:len(first)] == first
    run("turn-2", second)
    block = spec.engine.block_size
    assert run.cached >= len(first) // block * block > 0  # type: ignore[attr-defined]
    print(f"\nturn 2 prompt {len(second)} tokens, {run.cached} from the prefix cache "  # type: ignore[attr-defined]
          f"(turn 1 prompt {len(first)} tokens)")


def Turn(item_id: str, role: str, text: str = "", audio=None) -> Item:  # noqa: ANN001, N802 - a user turn's shape
    return Item(item_id, "message", role=role, text=text, audio=audio)


def render_prompt(processor, instructions: str, turns: list[Item]):  # noqa: ANN001, ANN201
    return render_spec(processor, PromptSpec(instructions, tuple(turns)))
