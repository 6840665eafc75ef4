"""CSM's stage workers: the backbone (its depth decoder included) and the streaming Mimi decoder.

The backbone worker emits each frame as generic :class:`CodecFrames` ``[1, 32]``; the EOS frame is no audio,
so an utterance that ends by it finishes with no frame.
"""

from __future__ import annotations

import torch

from omnistage.engine.generation_engine import ChunkDecoder
from omnistage.families.csm.checkpoint import load_codec, load_model
from omnistage.families.csm.config import CsmConfig
from omnistage.families.csm.payloads import CsmSpeech
from omnistage.families.csm.runner import CsmRunner
from omnistage.models.mimi_stream import MimiStreams
from omnistage.runner import GenerationRunner
from omnistage.workers.base import WorkerSpec, resolve_device
from omnistage.workers.codec import CodecWorker
from omnistage.workers.frame_loop import FrameLoopWorker


class BackboneWorker(FrameLoopWorker):
    accepts = CsmSpeech

    def __init__(self, spec: WorkerSpec) -> None:
        device, dtype = resolve_device(spec.stage.device, spec.stage.dtype)
        cfg = CsmConfig.from_folder(spec.model_dir)
        super().__init__(CsmRunner(load_model(spec.model_dir, cfg, device, dtype, spec.stage.quantization)))


class MimiDecoderWorker(CodecWorker):
    def load_vocoder(self, spec: WorkerSpec, device: str, dtype: torch.dtype) -> ChunkDecoder:
        cfg = CsmConfig.from_folder(spec.model_dir)
        codec = load_codec(spec.model_dir, cfg, encoder=False, device=device, dtype=dtype)
        return GenerationRunner(MimiStreams(codec), device)
