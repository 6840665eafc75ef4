"""Checkpoint → preset: the Instruct checkpoint gets thinker + talker + code2wav, a Thinking (talker-less)
checkpoint gets the thinker alone and answers audio requests with a clear 400."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import openai
import pytest
from safetensors.torch import load_file, save_file

from omnistage.config.pipeline import ConfigError, load_preset
from omnistage.pipeline.async_omni import AsyncOmni
from omnistage.families.qwen3_omni.family import FAMILY, PRESET, TEXT_ONLY_PRESET
from omnistage.models.qwen3_omni.config import Qwen3OmniConfig
from omnistage.pipeline.engine import OmniPipeline, preset_for
from omnistage.pipeline.graph import resolve_graph
from omnistage.pipeline.runtime import PipelineOptions
from tests.entrypoints.server_thread import ServerThread
from tests.pipeline.specs import small_spec


def make_thinking(tiny_dir: Path, out: Path, keep_talker_config: bool = True) -> Path:
    """The tiny checkpoint as a Thinking variant: ``enable_audio_output: false`` and no talker/code2wav tensors."""
    out.mkdir(parents=True, exist_ok=True)
    for path in tiny_dir.iterdir():
        if path.is_file() and path.suffix != ".safetensors" and path.name != "config.json":
            shutil.copy(path, out / path.name)
    config = json.loads((tiny_dir / "config.json").read_text())
    config["enable_audio_output"] = False
    if not keep_talker_config:
        config.pop("talker_config")
        config.pop("code2wav_config")
    (out / "config.json").write_text(json.dumps(config))
    tensors = load_file(tiny_dir / "model.safetensors")
    kept = {k: v for k, v in tensors.items() if k.startswith("thinker.")}
    assert len(kept) < len(tensors)
    save_file(kept, out / "model.safetensors")
    return out


@pytest.fixture(scope="module")
def thinking_dir(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_thinking(tiny_dir, tmp_path_factory.mktemp("thinking"))


def test_presets_are_recognised_from_config_json(tiny_dir: Path, thinking_dir: Path) -> None:
    assert preset_for(tiny_dir) == PRESET and preset_for(thinking_dir) == TEXT_ONLY_PRESET
    raw = json.loads((tiny_dir / "config.json").read_text())
    raw.pop("talker_config")
    assert not Qwen3OmniConfig.from_dict(raw).has_talker  # no talker_config at all
    assert resolve_graph(load_preset(PRESET), FAMILY).supports_audio
    assert not resolve_graph(load_preset(TEXT_ONLY_PRESET), FAMILY).supports_audio


def test_thinking_checkpoint_with_a_talker_stage_config_is_refused(thinking_dir: Path) -> None:
    with pytest.raises(ConfigError, match="has no talker"):
        OmniPipeline(thinking_dir, small_spec(), PipelineOptions(in_process=True))


@pytest.mark.e2e
def test_thinking_checkpoint_serves_text_and_refuses_audio(tiny_dir: Path, tmp_path: Path) -> None:
    from websockets.sync.client import connect

    from omnistage.entrypoints.openai.api_server import build_app

    folder = make_thinking(tiny_dir, tmp_path / "thinking", keep_talker_config=False)
    engine = AsyncOmni(folder, None, PipelineOptions(in_process=True), "tiny-thinking")
    assert not engine.supports_audio and [s.stage for s in engine.health().stages] == ["thinker"]
    thread = ServerThread(build_app(engine))
    try:
        base = thread.start()
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=60)
        reply = client.chat.completions.create(model="tiny-thinking", messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=8, seed=0)
        assert reply.choices[0].message.content and reply.choices[0].message.audio is None
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model="tiny-thinking", messages=[{"role": "user", "content": "hi"}],
                                           modalities=["text", "audio"], audio={"voice": "Ethan", "format": "wav"},
                                           max_tokens=8)
        assert info.value.status_code == 400 and info.value.body["code"] == "audio_not_supported"
        assert "text-only" in info.value.body["message"]
        with connect(base.replace("http", "ws") + "/v1/realtime", open_timeout=10) as ws:
            created = json.loads(ws.recv(timeout=10))
            assert created["session"]["output_modalities"] == ["text"]
            ws.send(json.dumps({"type": "conversation.item.create",
                                "item": {"role": "user", "content": [{"type": "input_text", "text": "hi"}]}}))
            ws.send(json.dumps({"type": "response.create", "response": {"max_output_tokens": 4}}))
            events = []
            while not events or events[-1]["type"] != "response.done":
                events.append(json.loads(ws.recv(timeout=30)))
            assert any(e["type"] == "response.output_text.delta" for e in events)
            assert not any(e["type"] == "response.output_audio.delta" for e in events)
            assert events[-1]["response"]["status"] in ("completed", "incomplete")
    finally:
        thread.stop()
        asyncio.run(engine.shutdown())
