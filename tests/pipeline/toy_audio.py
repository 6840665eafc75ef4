"""Families with another codec's timing, for running the whole API: 25 Hz frames at 16 kHz, 7.5 Hz at 44.1 kHz.

Each is Qwen3-Omni's edges and payloads (a test may borrow them) with model-free stages: the fake thinker's
tokens, a talker making one frame per step at half real time, and a codec stage on the generic codec worker whose
vocoder turns each frame into ``samples_per_frame`` samples of one continuous 440 Hz tone at the family's rate.
The front end is the tiny Qwen3-Omni checkpoint's processor, so chat, speech, realtime and WebRTC requests are
rendered as for the real model. The folder's ``config.json`` names the family and carries its timing, which the
workers read back in their replicas.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch
import yaml
from omnistage.families.qwen3_omni.family import PRESET as OMNI_PRESET

from omnistage.audio_spec import AudioSpec, Codebooks
from omnistage.core import Modality
from omnistage.engine.generation_engine import ChunkDecoder
from omnistage.families.base import FrontEnd, StageModel
from omnistage.families.qwen3_omni.family import Qwen3OmniFamily
from omnistage.families.qwen3_omni.voices import OPENAI_VOICES
from omnistage.families.registry import DEFAULT_REGISTRY
from omnistage.models.qwen3_omni.config import Qwen3OmniConfig
from omnistage.pipeline.async_omni import AsyncOmni
from omnistage.pipeline.engine import OmniPipeline
from omnistage.pipeline.runtime import PipelineOptions
from omnistage.runner.generation_runner import GenerationRunner
from omnistage.workers.base import WorkerSpec
from omnistage.workers.codec import CodecWorker
from tests.pipeline.fakes import GROUPS, FakeThinker, FakeTalker

TONE_HZ = 440.0
TALKER_RTF = 0.5  # the toy talker makes a frame in half its duration


@dataclass(frozen=True)
class Timing:
    name: str
    sample_rate: int
    samples_per_frame: int

    @property
    def audio(self) -> AudioSpec:
        return AudioSpec(self.sample_rate, self.samples_per_frame, Codebooks(GROUPS, 1024))


HZ25_16K = Timing("toy-25hz-16k", 16000, 640)
HZ7_5_44K = Timing("toy-7.5hz-44k", 44100, 5880)


def _timing(folder: str | Path) -> Timing:
    raw = json.loads((Path(folder) / "config.json").read_text())["toy_audio"]
    return Timing(raw["name"], int(raw["sample_rate"]), int(raw["samples_per_frame"]))


class ToyThinker(FakeThinker):
    def __init__(self, spec: WorkerSpec) -> None:
        super().__init__(step_s=0.005)


class ToyTalker(FakeTalker):
    def __init__(self, spec: WorkerSpec) -> None:
        super().__init__(step_s=TALKER_RTF * _timing(spec.model_dir).audio.frame_s)


class ToneVocoder:
    """Each new frame → ``samples_per_frame`` samples of one tone, continuous across a stream's chunks."""

    def __init__(self, timing: Timing) -> None:
        self.rate, self.samples_per_frame = timing.sample_rate, timing.samples_per_frame
        self.made: dict[str, int] = {}  # stream → samples so far

    def decode_streams(self, streams: Sequence[str], indices: Sequence[int], chunks: Sequence[torch.Tensor],
                       left_contexts: Sequence[int], lasts: Sequence[bool]) -> list[torch.Tensor]:
        wavs = []
        for stream, chunk, context, last in zip(streams, chunks, left_contexts, lasts):
            start, count = self.made.get(stream, 0), (chunk.shape[-1] - context) * self.samples_per_frame
            t = torch.arange(start, start + count, dtype=torch.float64) / self.rate
            wavs.append((0.3 * torch.sin(2 * math.pi * TONE_HZ * t)).float())
            self.made[stream] = start + count
            if last:
                self.made.pop(stream)
        return wavs

    def drop(self, stream: str) -> None:
        self.made.pop(stream, None)


class ToyCodec(CodecWorker):
    def load_vocoder(self, spec: WorkerSpec, device: str, dtype: torch.dtype) -> ChunkDecoder:
        return GenerationRunner(ToneVocoder(_timing(spec.model_dir)), device)


class ToyAudioFamily(Qwen3OmniFamily):
    """Qwen3-Omni's pipeline shape with the toy stages and the timing the folder's config says."""

    name = "toy_audio"
    model_types = ("toy_audio",)
    stage_models = MappingProxyType({
        "thinker": StageModel("ar", f"{__name__}:ToyThinker", output=Modality.TEXT, entry=True),
        "talker": StageModel("ar", f"{__name__}:ToyTalker"),
        "code2wav": StageModel("generation", f"{__name__}:ToyCodec", output=Modality.AUDIO),
    })

    def recognises(self, raw: Any) -> bool:  # noqa: ANN401 - parsed JSON
        return raw.get("model_type") == "toy_audio"

    def load_config(self, folder: Path) -> Qwen3OmniConfig:
        return Qwen3OmniConfig.from_folder(folder)

    def front_end(self, folder: Path, config: object) -> FrontEnd:
        from omnistage.families.qwen3_omni.prompt import Qwen3OmniPromptProcessor

        processor = Qwen3OmniPromptProcessor(folder, config.processor)
        return FrontEnd(processor.tokenizer, processor, config.voices, config.max_positions,
                        _timing(folder).audio, openai_voices=OPENAI_VOICES)


def serve(folder: Path, timing: Timing, in_process: bool = False) -> AsyncOmni:
    """The toy family's pipeline behind ``AsyncOmni``, served as ``timing.name`` (replica processes by default:
    chunks cross processes)."""
    options = PipelineOptions(in_process=in_process, ready_timeout_s=120)
    pipeline = OmniPipeline(folder, folder / "toy_stages.yaml", options, timing.name,
                            registry=DEFAULT_REGISTRY.with_family(ToyAudioFamily()))
    return AsyncOmni(pipeline=pipeline)


def make_folder(tiny_dir: Path, target: Path, timing: Timing, talker_frames: int = 40) -> Path:
    """The tiny checkpoint's config and tokenizer files under the toy family's name, with its stage config
    (``toy_stages.yaml``: the Qwen3-Omni preset, small chunks)."""
    target.mkdir(parents=True, exist_ok=True)
    for item in tiny_dir.iterdir():
        if item.is_file() and not item.name.endswith(".safetensors") and item.name != "config.json":
            (target / item.name).write_bytes(item.read_bytes())
    raw = json.loads((tiny_dir / "config.json").read_text())
    raw["toy_audio"] = {"name": timing.name, "sample_rate": timing.sample_rate,
                        "samples_per_frame": timing.samples_per_frame}
    raw["model_type"] = "toy_audio"
    (target / "config.json").write_text(json.dumps(raw))
    stages = yaml.safe_load(OMNI_PRESET.read_text())
    stages["stages"][1]["sampling"]["max_tokens"] = talker_frames
    stages["streaming"] = {"codec_chunk_frames": 8, "initial_codec_chunk_frames": 2, "codec_left_context_frames": 0}
    (target / "toy_stages.yaml").write_text(yaml.safe_dump(stages))
    return target
