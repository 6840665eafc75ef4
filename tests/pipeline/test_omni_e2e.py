"""``Omni`` and ``AsyncOmni`` end to end on the tiny checkpoint, stages as threads of this process."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest

from omnistage.core import FinishReason, OmniOutput
from omnistage.entrypoints.openai.engine_protocol import OmniEngine
from omnistage.pipeline.async_omni import AsyncOmni
from omnistage.pipeline.omni import Omni
from omnistage.pipeline.runtime import PipelineOptions
from tests.pipeline.specs import small_dict, write_spec

PROMPT = "Tell me a story about a fox."
# A long answer (EOS ignored) keeps the thinker busy well after the talker's first frames.
LONG = dict(max_tokens=160, ignore_eos=True, temperature=0.9, seed=7)


@pytest.fixture(scope="module")
def omni(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    config = write_spec(tmp_path_factory.mktemp("stages"), small_dict(talker_frames=24))
    with Omni(tiny_dir, config, options=PipelineOptions(in_process=True, talker_min_new_tokens=12)) as omni:
        yield omni


def _run(outputs: list[OmniOutput]) -> tuple[str, np.ndarray | None]:
    audio = [o.audio for o in outputs if o.audio is not None]
    return "".join(o.text for o in outputs), np.concatenate(audio) if audio else None


def test_text_only(omni: Omni) -> None:
    outputs = list(omni.generate(PROMPT, stream=True, max_tokens=12))
    assert outputs[-1].finished and all(not o.finished for o in outputs[:-1])
    assert all(o.audio is None for o in outputs)
    assert outputs[-1].usage.completion_tokens == sum(len(o.token_ids) for o in outputs) <= 12
    whole = list(omni.generate(PROMPT, stream=False, max_tokens=12))  # greedy: the stage default
    assert len(whole) == 1 and whole[0].text == _run(outputs)[0]


def test_audio_streams_early_and_equals_non_streamed(omni: Omni) -> None:
    start = time.monotonic()
    streamed = list(omni.generate(PROMPT, modalities=["text", "audio"], stream=True, **LONG))
    total = time.monotonic() - start
    text, audio = _run(streamed)
    assert streamed[-1].finish_reason is FinishReason.LENGTH and audio is not None and audio.dtype == np.float32
    trace = omni.pipeline.runtime.orchestrator.trace(streamed[-1].request_id)
    # Async chunk: the talker started on the first token and audio left before the thinker was done.
    assert trace.entered["talker"] < trace.first_frames < trace.first_audio < trace.left["thinker"]
    first_audio = next(i for i, o in enumerate(streamed) if o.audio is not None)
    assert first_audio < max(i for i, o in enumerate(streamed) if o.text)
    print(f"in-process: time to first audio {trace.time_to_first_audio * 1000:.0f} ms, total {total * 1000:.0f} ms")

    (whole,) = omni.generate(PROMPT, modalities=["text", "audio"], stream=False, **LONG)
    # Streamed chunks follow the player, the whole answer takes full-size chunks: other boundaries, so other
    # matmul shapes. Seamless streams still join into the same samples, to rounding (a boundary artifact
    # would be ~1e-2).
    assert whole.text == text and whole.audio is not None and whole.audio.shape == audio.shape
    np.testing.assert_allclose(whole.audio, audio, atol=1e-5, rtol=1e-4)


def test_video_with_its_sound_track_speaks(omni: Omni) -> None:
    """use_audio_in_video from Python: the interleaved prompt runs through thinker, talker and code2wav."""
    from omnistage.processing.video import Video

    rng = np.random.default_rng(5)
    frames = [(rng.random((32, 32, 3)) * 255).astype(np.uint8) for _ in range(4)]
    track = (0.3 * np.sin(2 * np.pi * 440 * np.arange(32000) / 16000)).astype(np.float32)
    messages = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What happens?"}]}]
    request = omni.request(messages, ["text", "audio"], videos=[Video(frames, 2.0, audio=track)],
                           use_audio_in_video=True, max_tokens=8)
    assert int(request.prompt.mm.feature_attention_mask.sum()) == 200  # the track is the prompt's one audio
    outputs = list(omni.stream(request))
    text, audio = _run(outputs)
    assert outputs[-1].finished and outputs[-1].error is None and audio is not None and audio.size > 0
    assert outputs[-1].usage.prompt_tokens == len(request.prompt.token_ids)


def test_abort_frees_kv_blocks_in_every_stage(omni: Omni) -> None:
    stats = omni.pipeline.stats
    seen_used: dict[str, int] = {}
    outputs = omni.generate(PROMPT, modalities=["text", "audio"], stream=True, max_tokens=900, ignore_eos=True)
    for out in outputs:
        for r in stats().replicas:
            seen_used[r.stage] = max(seen_used.get(r.stage, 0), r.kv_blocks_used + r.running)
        if out.audio is not None:
            break  # the request is now in all three stages
    outputs.close()  # leaving the stream aborts the request
    assert seen_used["thinker"] > 0 and seen_used["talker"] > 0
    deadline = time.monotonic() + 5
    while any(r.kv_blocks_used or r.running or r.queue_depth for r in stats().replicas):
        assert time.monotonic() < deadline, stats()
        time.sleep(0.02)


def test_async_omni_is_the_servers_engine(omni: Omni) -> None:
    engine = AsyncOmni(pipeline=omni.pipeline)
    assert isinstance(engine, OmniEngine) and engine.supports_audio
    assert {v.lower() for v in engine.front_end.voices} == {"chelsie", "ethan", "aiden"}
    request = omni.request(PROMPT, ["text", "audio"], max_tokens=24, seed=1, voice="Chelsie")

    async def consume() -> list[OmniOutput]:
        return [out async for out in engine.generate(request)]

    outputs = asyncio.run(consume())
    assert outputs[-1].finished and any(o.audio is not None for o in outputs)
    assert engine.health().healthy


def test_two_talker_replicas_share_concurrent_requests(tiny_dir: Path, tmp_path: Path) -> None:
    import threading

    config = write_spec(tmp_path, small_dict(talker_replicas=2, talker_frames=16, gated=False))
    with Omni(tiny_dir, config, options=PipelineOptions(in_process=True, talker_min_new_tokens=8)) as omni:
        requests = [omni.request(PROMPT, ["text", "audio"], max_tokens=64, ignore_eos=True, seed=i)
                    for i in range(2)]
        results: dict[str, list[OmniOutput]] = {}
        threads = [threading.Thread(target=lambda r=r: results.__setitem__(r.request_id, list(omni.stream(r))))
                   for r in requests]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert all(any(o.audio is not None for o in outs) for outs in results.values())
        traces = [omni.pipeline.runtime.orchestrator.trace(r.request_id) for r in requests]
        assert sorted(t.replicas["talker"] for t in traces) == [0, 1]
        assert [r.stage for r in omni.pipeline.stats().replicas] == ["thinker", "talker", "talker", "code2wav"]


def test_streaming_pipeline_equals_the_sequential_offline_run(tiny_dir: Path, tmp_path: Path) -> None:
    """Async chunking changes when things run, never what they compute: greedy text, codes and audio
    equal the glue's one-stage-after-another reference run."""
    import torch

    from omnistage.engine.frame_chunker import ChunkPlan
    from omnistage.families.qwen3_omni.offline import GenerationSettings, StageModels, generate_offline

    data = small_dict(talker_frames=24)
    data["stages"][1]["sampling"]["temperature"] = 0.0
    options = PipelineOptions(in_process=True, talker_min_new_tokens=10, seamless_audio=True)
    with Omni(tiny_dir, write_spec(tmp_path, data), options=options) as omni:
        # Consumed whole: chunks of 4 then 8 frames, as the offline plan cuts them (a played stream's sizes
        # follow its player), so both run the same computation.
        request = omni.request(PROMPT, ["text", "audio"], max_tokens=20, temperature=0.0,
                               initial_codec_chunk_frames=4, stream=False)
        outputs = list(omni.stream(request))
    settings = GenerationSettings(max_new_tokens=20, talker_max_new_tokens=24, talker_min_new_tokens=10,
                                  chunks=ChunkPlan(chunk_frames=8, left_context=4, first_chunk_frames=4,
                                                   seamless=True))
    reference = generate_offline(StageModels.load(tiny_dir), request.prompt.token_ids, request.prompt.mm, settings)
    assert [t for o in outputs for t in o.token_ids] == reference.tokens
    audio = np.concatenate([o.audio for o in outputs if o.audio is not None])
    assert torch.equal(torch.from_numpy(audio), reference.wav.float())


def test_stop_string_ends_text_and_speech(omni: Omni) -> None:
    (full,) = omni.generate(PROMPT, max_tokens=40, ignore_eos=True)
    stop = full.text[len(full.text) // 2:][:3]
    assert stop.strip(), full.text
    (cut,) = omni.generate(PROMPT, modalities=["text", "audio"], max_tokens=40, ignore_eos=True, stop=[stop])
    assert cut.finish_reason is FinishReason.STOP and cut.text == full.text[:full.text.index(stop)]
    assert cut.usage.completion_tokens < 40
    deadline = time.monotonic() + 5  # the thinker was aborted in its stage: nothing is left running
    while any(r.running for r in omni.pipeline.stats().replicas):
        assert time.monotonic() < deadline
        time.sleep(0.02)
