"""Hostile input against the real tiny pipeline: each case a 4xx JSON error, the server still serving after
them all, no request left in any stage, and the process's memory back to its baseline."""

from __future__ import annotations

import asyncio
import copy
import gc
import time
from pathlib import Path

import httpx
import pytest

from omnistage.entrypoints.openai.api_server import build_app
from omnistage.entrypoints.openai.server_config import MediaPolicy, ServerLimits
from omnistage.pipeline.async_omni import AsyncOmni
from omnistage.pipeline.runtime import PipelineOptions
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


def test_hostile_bodies_against_the_real_pipeline(tiny_dir: Path, tmp_path: Path) -> None:
    config = write_spec(tmp_path, small_dict(talker_frames=8))
    engine = AsyncOmni(tiny_dir, config, PipelineOptions(in_process=True, talker_min_new_tokens=4), "tiny")
    media = tmp_path / "media"
    media.mkdir()
    thread = ServerThread(build_app(engine, LIMITS, MediaPolicy(allowed_local_media_path=media)))
    url = thread.start()
    try:
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
        def idle() -> bool:  # a replica's load arrives with its next message: allow it a moment
            return all(r.kv_blocks_used == 0 and r.running == 0 and r.queue_depth == 0
                       for r in engine.stats().replicas)

        deadline = time.monotonic() + 15
        while not idle() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert idle(), engine.stats()
        print(f"hostile x{len(HOSTILE)} twice: RSS growth on the second pass {growth:.1f} MiB")
    finally:
        thread.stop()
        asyncio.run(engine.shutdown())
