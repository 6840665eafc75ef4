"""Qwen2.5-Omni's stage workers: the thinker on omnistage's AR engine (paged KV, continuous batching)."""

from __future__ import annotations

import torch

from omnistage.engine import FinishReason, Request
from omnistage.families.qwen2_5_omni.payloads import ThinkerPrompt
from omnistage.families.qwen2_5_omni.thinker_stage import build_thinker_request
from omnistage.ipc.messages import RequestFailed, StageInput, StageOutput
from omnistage.ipc.payloads import TokenDelta
from omnistage.models.qwen2_5_omni.config import Qwen25OmniConfig
from omnistage.models.qwen2_5_omni.thinker import Thinker
from omnistage.runner import build_ar_engine
from omnistage.workers.base import ARWorker, StepResult, WorkerSpec, engine_config, resolve_device


class ThinkerWorker(ARWorker[Request]):
    def __init__(self, spec: WorkerSpec) -> None:
        device, dtype = resolve_device(spec.stage.device, spec.stage.dtype)
        config = Qwen25OmniConfig.from_folder(spec.model_dir)
        self.model = Thinker.from_checkpoint(spec.model_dir, device, dtype, config=config)
        self.eos_token_id = config.eos_token_id
        super().__init__(build_ar_engine(self.model, engine_config(spec.stage, device, dtype, config.max_positions)))

    @torch.inference_mode()
    def handle(self, message: StageInput) -> list[StageOutput | RequestFailed]:
        prompt = message.payload
        if not isinstance(prompt, ThinkerPrompt):
            raise TypeError(f"the Qwen2.5-Omni thinker does not take {type(prompt).__name__}")
        request = build_thinker_request(self.model, message.request_id, prompt.token_ids, prompt.mm,
                                        prompt.sampling, self.eos_token_id)
        self.engine.add_request(request)
        self.requests[message.request_id] = request
        return []

    def step(self) -> StepResult:
        outputs: list[StageOutput | RequestFailed] = []
        for out in self.engine.step():
            request = self.requests.get(out.request_id)
            if request is None:
                continue
            if out.finish_reason is FinishReason.ERROR:
                outputs.append(self.failed(out))
                continue
            delta = TokenDelta(out.new_token_ids, request.num_prompt_tokens, max(request.num_cached_tokens, 0),
                               out.logprobs)
            outputs.append(StageOutput(out.request_id, delta, out.finished, out.finish_reason))
            if out.finished:
                self.requests.pop(out.request_id, None)
        return StepResult(outputs, progressed=self.progressed())
