"""Higgs Audio v2's stage workers: the generator (frames under the staircase) and the windowed codec decoder.

The generator worker emits each frame as generic :class:`CodecFrames` ``[1, G]`` as sampled (delayed); the codec
edge de-delays them with the family's ``AudioSpec`` delays, so the codec stage sees aligned frames. The all-EOS
frame that ends an utterance is no audio: its output carries no frames.
"""

from __future__ import annotations

import torch

from omnistage.engine import FinishReason
from omnistage.engine.generation_engine import ChunkDecoder
from omnistage.families.higgs_audio_v2.checkpoint import load_codec, load_model
from omnistage.families.higgs_audio_v2.config import HiggsCheckpoint
from omnistage.families.higgs_audio_v2.payloads import HiggsSpeech
from omnistage.families.higgs_audio_v2.runner import HiggsRunner
from omnistage.ipc.messages import RequestFailed, StageInput, StageOutput
from omnistage.ipc.payloads import CodecFrames
from omnistage.runner import GenerationRunner
from omnistage.workers.base import StepResult, WorkerSpec, resolve_device
from omnistage.workers.codec import CodecWorker
from omnistage.workers.frame_loop import FrameLoopWorker


class GeneratorWorker(FrameLoopWorker):
    def __init__(self, spec: WorkerSpec) -> None:
        device, dtype = resolve_device(spec.stage.device, spec.stage.dtype)
        ckpt = HiggsCheckpoint.from_folder(spec.model_dir)
        self.runner = HiggsRunner(load_model(spec.model_dir, ckpt, device, dtype))
        self.last_ids: list[str] = []

    def handle(self, message: StageInput) -> list[StageOutput | RequestFailed]:
        payload = message.payload
        if not isinstance(payload, HiggsSpeech):
            raise TypeError(f"the Higgs Audio generator does not take {type(payload).__name__}")
        self.runner.add(message.request_id, payload.prompt, payload.sampling, payload.prompt.max_frames())
        return []

    def step(self) -> StepResult:
        frames = self.runner.step()
        self.last_ids = [f.request_id for f in frames]
        outputs: list[StageOutput | RequestFailed] = []
        for f in frames:
            audio = not f.finished or f.by_length  # an all-EOS frame ends the utterance and is no audio
            reason = (FinishReason.LENGTH if f.by_length else FinishReason.STOP) if f.finished else None
            outputs.append(StageOutput(f.request_id, CodecFrames(f.codes[None]) if audio else None, f.finished,
                                       reason))
        return StepResult(outputs, progressed=bool(frames))


class CodecDecoderWorker(CodecWorker):
    def load_vocoder(self, spec: WorkerSpec, device: str, dtype: torch.dtype) -> ChunkDecoder:
        return GenerationRunner(load_codec(spec.model_dir, device, dtype), device)
