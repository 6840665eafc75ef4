"""Pocket TTS's stage workers: the backbone (flow and EOS heads included) and the streaming latent decoder.

The backbone worker emits each utterance's latents as generic :class:`CodecFrames` ``[n, 32]`` (float: the
codec edge cuts them like codes, as the family's ``AudioSpec`` declares a :class:`Latent`); every frame is audio,
the EOS frame and its tail included, as the reference keeps them.
"""

from __future__ import annotations

import torch

from omnistage.engine import FinishReason
from omnistage.engine.generation_engine import ChunkDecoder
from omnistage.families.pocket_tts.backbone_runner import BackboneRunner
from omnistage.families.pocket_tts.checkpoint import load_decoder, load_model
from omnistage.families.pocket_tts.config import PocketCheckpoint
from omnistage.families.pocket_tts.decoder_stream import StreamingLatentDecoder
from omnistage.families.pocket_tts.generate import FlowDefaults
from omnistage.families.pocket_tts.payloads import PocketSpeech
from omnistage.ipc.messages import RequestFailed, StageInput, StageOutput
from omnistage.ipc.payloads import CodecFrames
from omnistage.runner import GenerationRunner
from omnistage.workers.base import StepResult, WorkerSpec, resolve_device
from omnistage.workers.codec import CodecWorker
from omnistage.workers.frame_loop import FrameLoopWorker


class BackboneWorker(FrameLoopWorker):
    def __init__(self, spec: WorkerSpec) -> None:
        device, dtype = resolve_device(spec.stage.device, spec.stage.dtype)
        ckpt = PocketCheckpoint.from_folder(spec.model_dir)
        self.runner = BackboneRunner(load_model(spec.model_dir, ckpt, device, dtype),
                                     FlowDefaults.from_folder(spec.model_dir))
        self.last_ids: list[str] = []

    def handle(self, message: StageInput) -> list[StageOutput | RequestFailed]:
        payload = message.payload
        if not isinstance(payload, PocketSpeech):
            raise TypeError(f"the Pocket TTS backbone does not take {type(payload).__name__}")
        self.runner.add(message.request_id, payload.prompt, payload.sampling)
        return []

    def step(self) -> StepResult:
        frames = self.runner.step()
        self.last_ids = [f.request_id for f in frames]
        outputs: list[StageOutput | RequestFailed] = [
            StageOutput(f.request_id, CodecFrames(f.latent[None].cpu()), f.finished,
                        (FinishReason.LENGTH if f.by_length else FinishReason.STOP) if f.finished else None)
            for f in frames]
        return StepResult(outputs, progressed=bool(frames))



class LatentDecoderWorker(CodecWorker):
    def load_vocoder(self, spec: WorkerSpec, device: str, dtype: torch.dtype) -> ChunkDecoder:
        ckpt = PocketCheckpoint.from_folder(spec.model_dir)
        return GenerationRunner(StreamingLatentDecoder(load_decoder(spec.model_dir, ckpt, device, dtype)), device)
