"""Qwen3-ASR's stage worker: the recogniser on omnistage's AR engine (paged KV, continuous batching across
requests); its token deltas are the caller's text, as an omni thinker's are."""

from __future__ import annotations

from omnistage.engine import Request
from omnistage.families.qwen3_asr.config import Qwen3ASRCheckpoint
from omnistage.families.qwen3_asr.model import Qwen3ASR
from omnistage.families.qwen3_asr.payloads import RecogniserPrompt
from omnistage.families.qwen3_asr.stage import build_request
from omnistage.runner import build_ar_engine
from omnistage.workers.base import WorkerSpec, engine_config, resolve_device
from omnistage.workers.thinker import ThinkerWorker


class RecogniserWorker(ThinkerWorker[RecogniserPrompt]):
    prompt_type = RecogniserPrompt

    def __init__(self, spec: WorkerSpec) -> None:
        device, dtype = resolve_device(spec.stage.device, spec.stage.dtype)
        ckpt = Qwen3ASRCheckpoint.from_folder(spec.model_dir)
        if ckpt.aligner:
            raise ValueError(f"{spec.model_dir} is a forced aligner, not a recogniser: serve it with --aligner")
        self.model = Qwen3ASR.from_checkpoint(spec.model_dir, device, dtype, ckpt=ckpt,
                                              quantization=spec.stage.quantization)
        super().__init__(build_ar_engine(self.model, engine_config(spec.stage, device, dtype, ckpt.max_positions)))

    def build_request(self, request_id: str, prompt: RecogniserPrompt) -> Request:
        return build_request(self.model, request_id, prompt.token_ids, prompt.mels, prompt.sampling)
