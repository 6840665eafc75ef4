"""Pocket TTS's stage workers: the backbone (flow and EOS heads included) and the streaming latent decoder.

The backbone worker emits each utterance's latents as generic :class:`CodecFrames` ``[n, 32]`` (float: the
codec edge cuts them like codes, as the family's ``AudioSpec`` declares a :class:`Latent`); every frame is audio,
the EOS frame and its tail included, as the reference keeps them.
"""

from __future__ import annotations

import torch

from omnistage.engine.generation_engine import ChunkDecoder
from omnistage.families.pocket_tts.backbone_runner import BackboneRunner
from omnistage.families.pocket_tts.checkpoint import load_decoder, load_model
from omnistage.families.pocket_tts.config import PocketCheckpoint
from omnistage.families.pocket_tts.decoder_stream import StreamingLatentDecoder
from omnistage.families.pocket_tts.generate import FlowDefaults
from omnistage.families.pocket_tts.payloads import PocketSpeech
from omnistage.layers.quant.apply import apply_quantization
from omnistage.runner import GenerationRunner
from omnistage.workers.base import WorkerSpec, resolve_device
from omnistage.workers.codec import CodecWorker
from omnistage.workers.frame_loop import FrameLoopWorker


class BackboneWorker(FrameLoopWorker):
    accepts = PocketSpeech

    def __init__(self, spec: WorkerSpec) -> None:
        device, dtype = resolve_device(spec.stage.device, spec.stage.dtype)
        ckpt = PocketCheckpoint.from_folder(spec.model_dir)
        model = load_model(spec.model_dir, ckpt, device, dtype)
        # int8: the backbone's layers (a frame step reads every weight once: bound by their bytes); the flow and
        # EOS heads, embeddings and latent projections keep the dtype.
        apply_quantization(model.model, spec.stage.quantization)
        super().__init__(BackboneRunner(model, FlowDefaults.from_folder(spec.model_dir)))


class LatentDecoderWorker(CodecWorker):
    def load_vocoder(self, spec: WorkerSpec, device: str, dtype: torch.dtype) -> ChunkDecoder:
        ckpt = PocketCheckpoint.from_folder(spec.model_dir)
        return GenerationRunner(StreamingLatentDecoder(load_decoder(spec.model_dir, ckpt, device, dtype)), device)
