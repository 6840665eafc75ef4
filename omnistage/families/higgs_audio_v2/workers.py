"""Higgs Audio v2's stage workers: the generator (frames under the staircase) and the windowed codec decoder.

The generator worker emits an utterance's frames as generic :class:`CodecFrames` ``[n, G]`` as sampled (delayed),
``FRAMES_PER_OUTPUT`` at a time; the codec edge de-delays them with the family's ``AudioSpec`` delays, so the codec
stage sees aligned frames. The all-EOS frame that ends an utterance is no audio: its output carries only the frames
still held (none: no payload).
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

# Every FRAMES_PER_OUTPUT steps each running utterance's frames made since go out (an ending one's at once): each
# output costs the codec edge and the orchestrator a cut and a notice whatever its size (~20 us), a third of what a
# tiny batch-8 step spends on a frame, and each pass that has outputs a socket send to the orchestrator and one to
# the codec replica (~50 us of CPU with the I/O thread's wake-up). On one clock for all utterances, a batch's
# outputs share a pass: one send each way per 8 steps, not one per step as when each utterance counted its own.
# 8 frames are 320 ms of audio, sent at most 7 steps (~3 ms at c=8) after the first of them was made; a first
# chunk (8 frames, 4 of look-ahead, 8 rows of staircase) needs 21 rows: it goes out 21-28 rows in.
FRAMES_PER_OUTPUT = 8


class GeneratorWorker(FrameLoopWorker):
    def __init__(self, spec: WorkerSpec) -> None:
        device, dtype = resolve_device(spec.stage.device, spec.stage.dtype)
        ckpt = HiggsCheckpoint.from_folder(spec.model_dir)
        self.runner = HiggsRunner(load_model(spec.model_dir, ckpt, device, dtype, spec.stage.quantization))
        self.last_ids: list[str] = []
        self.held: dict[str, list[torch.Tensor]] = {}  # frames made, not sent yet (fewer than FRAMES_PER_OUTPUT)
        self.steps = 0  # steps that made frames: every FRAMES_PER_OUTPUT-th sends every utterance's held ones

    def handle(self, message: StageInput) -> list[StageOutput | RequestFailed]:
        payload = message.payload
        if not isinstance(payload, HiggsSpeech):
            raise TypeError(f"the Higgs Audio generator does not take {type(payload).__name__}")
        self.runner.add(message.request_id, payload.prompt, payload.sampling, payload.prompt.max_frames())
        return []

    def abort(self, request_ids: list[str]) -> None:
        super().abort(request_ids)
        for rid in request_ids:
            self.held.pop(rid, None)

    def step(self) -> StepResult:
        frames = self.runner.step()
        self.last_ids = [f.request_id for f in frames]
        self.steps += bool(frames)
        flush = self.steps % FRAMES_PER_OUTPUT == 0
        outputs: list[StageOutput | RequestFailed] = []
        for f in frames:
            held = self.held.setdefault(f.request_id, [])
            if not f.finished or f.by_length:  # an all-EOS frame ends the utterance and is no audio
                held.append(f.codes)
            if not f.finished and not flush:
                continue
            del self.held[f.request_id]
            reason = (FinishReason.LENGTH if f.by_length else FinishReason.STOP) if f.finished else None
            outputs.append(StageOutput(f.request_id, CodecFrames(torch.stack(held)) if held else None, f.finished,
                                       reason))
        return StepResult(outputs, progressed=bool(frames))


class CodecDecoderWorker(CodecWorker):
    def load_vocoder(self, spec: WorkerSpec, device: str, dtype: torch.dtype) -> ChunkDecoder:
        return GenerationRunner(load_codec(spec.model_dir, device, dtype), device)
