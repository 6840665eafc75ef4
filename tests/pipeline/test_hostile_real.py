"""Hostile input against the real tiny pipeline: each case a 4xx JSON error, the server still serving after
them all, no request left in any stage, and the process's memory back to its baseline."""

from __future__ import annotations

import asyncio
import copy
import gc
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import msgspec
import pytest

from omnistage.core import FinishReason, Modality, OmniOutput, OmniRequest
from omnistage.entrypoints.openai.api_server import build_app
from omnistage.entrypoints.openai.server_config import MediaPolicy, ServerLimits
from omnistage.pipeline.async_omni import AsyncOmni
from omnistage.pipeline.runtime import PipelineOptions
from omnistage.sampling_params import SamplingParams
from tests.entrypoints.server_thread import ServerThread
from tests.entrypoints.test_hostile_inputs import HOSTILE
from tests.pipeline.specs import small_dict, write_spec

pytestmark = pytest.mark.e2e
LIMITS = ServerLimits(max_audio_seconds=5.0, max_base64_bytes=2_000_000, max_media_bytes=2_000_000,
                      max_image_pixels=512 * 512, max_text_chars=2000, max_request_bytes=4_000_000)


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _body(fields: dict[str, object], media_dir: Path) -> dict[str, object]:
    body = copy.deepcopy({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], **fields})
    messages = body["messages"]
    for part in messages if isinstance(messages, list) else []:
        content = part.get("content") if isinstance(part, dict) else None
        for item in content if isinstance(content, list) else []:
            if isinstance(item, dict) and isinstance(item.get("audio_url"), dict):
                item["audio_url"]["url"] = item["audio_url"]["url"].replace("/MEDIA", str(media_dir))
    return body


@dataclass
class _Live:
    url: str
    engine: AsyncOmni
    media: Path


@pytest.fixture(scope="module")
def live(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Live]:
    tmp_path = tmp_path_factory.mktemp("hostile")
    config = write_spec(tmp_path, small_dict(talker_frames=8))
    engine = AsyncOmni(tiny_dir, config, PipelineOptions(in_process=True, talker_min_new_tokens=4), "tiny")
    media = tmp_path / "media"
    media.mkdir()
    thread = ServerThread(build_app(engine, LIMITS, MediaPolicy(allowed_local_media_path=media)))
    try:
        yield _Live(thread.start(), engine, media)
    finally:
        thread.stop()
        asyncio.run(engine.shutdown())


def _idle(engine: AsyncOmni) -> bool:
    """No KV block, queued or running request left in any stage (a replica's load arrives with its next
    message: callers allow it a moment)."""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if all(r.kv_blocks_used == 0 and r.running == 0 and r.queue_depth == 0 for r in engine.stats().replicas):
            return True
        time.sleep(0.1)
    return False


def test_hostile_bodies_against_the_real_pipeline(live: _Live) -> None:
    url, engine, media = live.url, live.engine, live.media

    def attack() -> None:
        for case, fields, status in HOSTILE:
            r = httpx.post(f"{url}/v1/chat/completions", json=_body(fields, media), timeout=60)
            assert r.status_code == status, (case, r.text)
            assert r.json()["error"]["message"], case

    attack()  # first pass: warms caches (tokenizer, decoders) so the second measures growth only
    gc.collect()
    baseline = _rss_mib()
    attack()
    gc.collect()
    growth = _rss_mib() - baseline
    assert growth < 40, f"RSS grew {growth:.1f} MiB over one pass of hostile bodies"
    # Still serving, and nothing hostile left anything in a stage.
    assert httpx.get(f"{url}/health", timeout=10).status_code == 200
    reply = httpx.post(f"{url}/v1/chat/completions", timeout=60, json={
        "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
        "modalities": ["text", "audio"], "audio": {"voice": "Ethan", "format": "wav"}})
    assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["audio"]["data"]
    assert _idle(engine), engine.stats()
    print(f"hostile x{len(HOSTILE)} twice: RSS growth on the second pass {growth:.1f} MiB")


def test_a_penalty_forced_past_the_api_fails_only_its_request(live: _Live) -> None:
    """``repetition_penalty: 1e300`` is a 400 at the API; forced into the pipeline anyway (as a caller of the
    Python API could), the thinker refuses that request alone and the requests beside it finish with audio."""
    r = httpx.post(f"{live.url}/v1/chat/completions", timeout=30, json={
        "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "repetition_penalty": 1e300})
    assert r.status_code == 400 and r.json()["error"]["param"] == "repetition_penalty"
    engine = live.engine
    processor = engine.front_end.processor
    prompt = processor.process(processor.apply_chat_template([{"role": "user", "content": "hello"}]))

    async def one(i: int) -> OmniOutput:
        sampling = SamplingParams(max_tokens=6, seed=i)
        if i == 0:
            msgspec.structs.force_setattr(sampling, "repetition_penalty", 1e300)
        request = OmniRequest(f"poison-{i}", prompt, frozenset({Modality.TEXT, Modality.AUDIO}), sampling,
                              voice="Ethan")
        audio, last = 0, None
        async for out in engine.generate(request):
            audio += 0 if out.audio is None else out.audio.size
            last = out
        assert last is not None
        return last if i == 0 or audio else OmniOutput(last.request_id, error="no audio", finished=True)

    async def all_of_them() -> list[OmniOutput]:
        return await asyncio.gather(*(one(i) for i in range(4)))

    finals = asyncio.run(all_of_them())
    assert finals[0].finish_reason is FinishReason.ERROR and "repetition_penalty" in (finals[0].error or "")
    for out in finals[1:]:
        assert out.finish_reason in (FinishReason.STOP, FinishReason.LENGTH), out
    assert _idle(engine), engine.stats()
