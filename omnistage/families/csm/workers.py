"""CSM's stage workers: the backbone (its depth decoder included) and the streaming Mimi decoder.

The backbone worker emits each frame as generic :class:`CodecFrames` ``[1, 32]``; the EOS frame is no audio,
so an utterance that ends by it finishes with no frame.
"""

from __future__ import annotations

import torch

from omnistage.engine import FinishReason
from omnistage.engine.generation_engine import ChunkDecoder
from omnistage.families.csm.checkpoint import load_codec, load_model
from omnistage.families.csm.config import CsmConfig
from omnistage.families.csm.payloads import CsmSpeech
from omnistage.families.csm.runner import CsmRunner, Frame
from omnistage.ipc.messages import ReplicaLoad, RequestFailed, StageInput, StageOutput
from omnistage.ipc.payloads import CodecFrames
from omnistage.models.mimi_stream import MimiStreams
from omnistage.runner import GenerationRunner
from omnistage.workers.base import StageWorker, StepResult, WorkerSpec, resolve_device
from omnistage.workers.codec import CodecWorker


class BackboneWorker(StageWorker):
    def __init__(self, spec: WorkerSpec) -> None:
        device, dtype = resolve_device(spec.stage.device, spec.stage.dtype)
        self.runner = CsmRunner(load_model(spec.model_dir, CsmConfig.from_folder(spec.model_dir), device, dtype))
        self.last_ids: list[str] = []

    def handle(self, message: StageInput) -> list[StageOutput | RequestFailed]:
        payload = message.payload
        if not isinstance(payload, CsmSpeech):
            raise TypeError(f"the CSM backbone does not take {type(payload).__name__}")
        self.runner.add(message.request_id, payload.prompt, payload.sampling)
        return []

    def abort(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self.runner.abort(rid)

    def has_work(self) -> bool:
        return bool(self.runner.running)

    def step(self) -> StepResult:
        frames = self.runner.step()
        self.last_ids = [f.request_id for f in frames]
        return StepResult([_output(f) for f in frames], progressed=bool(frames))

    def load(self) -> ReplicaLoad:
        return ReplicaLoad(waiting=0, running=len(self.runner.running))

    def request_ids(self) -> list[str]:
        return list(self.runner.running)

    def scheduled_ids(self) -> list[str]:
        return self.last_ids


def _output(frame: Frame) -> StageOutput:
    payload = None if frame.codes is None else CodecFrames(frame.codes[None])
    reason = (FinishReason.LENGTH if frame.by_length else FinishReason.STOP) if frame.finished else None
    return StageOutput(frame.request_id, payload, frame.finished, reason)


class MimiDecoderWorker(CodecWorker):
    def load_vocoder(self, spec: WorkerSpec, device: str, dtype: torch.dtype) -> ChunkDecoder:
        cfg = CsmConfig.from_folder(spec.model_dir)
        codec = load_codec(spec.model_dir, cfg, encoder=False, device=device, dtype=dtype)
        return GenerationRunner(MimiStreams(codec), device)
