"""Qwen3-Omni's stage workers: thinker, talker and code2wav engines behind stage messages.

Each worker parses the checkpoint's config once and loads only its own stage's
weights (the talker also the thinker's embedding table, which it projects text
rows from); :mod:`omnistage.families.qwen3_omni.stages` does the per-request work.
"""

from __future__ import annotations

import torch

from omnistage.engine import Request, RequestOutput
from omnistage.engine.frame_chunker import ChunkPlan
from omnistage.engine.generation_engine import ChunkDecoder
from omnistage.families.qwen3_omni.sharded_thinker import load_thinker
from omnistage.families.qwen3_omni.payloads import PromptHidden, TalkerStart, TextFeed, ThinkerPrompt
from omnistage.families.qwen3_omni.stages import (TalkerContext, TalkerTextFeed, build_talker_request,
                                                  build_thinker_request, code2wav_runner,
                                                  multimodal_hidden, talker_mrope_tokens)
from omnistage.families.qwen3_omni.thinker_hook import ThinkerRequestData, ThinkerStepHook
from omnistage.ipc.messages import RequestFailed, StageInput, StageOutput
from omnistage.models.qwen3_omni.code2wav import load_code2wav
from omnistage.models.qwen3_omni.config import Qwen3OmniConfig
from omnistage.models.qwen3_omni.mrope import MRopeTokens
from omnistage.models.qwen3_omni.talker import Talker
from omnistage.models.thinker_embedding import load_thinker_embedding
from omnistage.runner import build_ar_engine
from omnistage.workers.base import WorkerSpec, engine_config, resolve_device
from omnistage.workers.codec import CodecWorker
from omnistage.workers.talker import TalkerWorker as FramesWorker
from omnistage.workers.thinker import ThinkerWorker as OmniThinkerWorker


def _tensor(x: torch.Tensor | None) -> torch.Tensor | None:
    return None if x is None or x.numel() == 0 else x


class ThinkerWorker(OmniThinkerWorker[ThinkerPrompt]):
    prompt_type = ThinkerPrompt

    def __init__(self, spec: WorkerSpec) -> None:
        device, dtype = resolve_device(spec.stage.device, spec.stage.dtype)
        config = Qwen3OmniConfig.from_folder(spec.model_dir)
        stage = spec.stage
        self.model, self.tp = load_thinker(spec.model_dir, device, dtype, stage.tensor_parallel_size,
                                           stage.quantization, config)
        self.eos_token_id = config.im_end_token_id
        cfg = self.model.config
        self.multimodal = frozenset((cfg.audio_token_id, cfg.image_token_id, cfg.video_token_id))
        super().__init__(build_ar_engine(self.model, engine_config(stage, device, dtype, config.max_positions),
                                         ThinkerStepHook(cfg.text_config.hidden_size), tp=self.tp))
        self.awaiting_hidden: set[str] = set()  # requests whose talker waits for their prompt's states

    def close(self) -> None:
        if self.tp is not None:
            self.tp.close()

    def build_request(self, request_id: str, prompt: ThinkerPrompt) -> Request:
        request = build_thinker_request(self.model, request_id, prompt.token_ids, prompt.mm, prompt.sampling,
                                        self.eos_token_id, for_talker=prompt.capture_hidden)
        if prompt.capture_hidden:
            self.awaiting_hidden.add(request_id)
        return request

    def failed(self, out: RequestOutput) -> RequestFailed:
        self.awaiting_hidden.discard(out.request_id)
        return super().failed(out)

    def abort(self, request_ids: list[str]) -> None:
        super().abort(request_ids)
        self.awaiting_hidden.difference_update(request_ids)  # aborted before its first output: never sent

    def hidden_payload(self, request: Request) -> PromptHidden | None:
        """Once, before the first tokens: the states at the prompt's multimodal rows, and its items' keys."""
        if request.request_id not in self.awaiting_hidden:
            return None
        self.awaiting_hidden.discard(request.request_id)
        hidden = multimodal_hidden(request, self.multimodal)
        data = request.stage_data
        if isinstance(data, ThinkerRequestData):
            # The talker needs prompt rows only: stop keeping a hidden row per decoded token.
            data.capture_hidden = False
            data.hidden.chunks = []
        return PromptHidden(hidden, tuple(request.mm_spans or ()))


class TalkerWorker(FramesWorker):
    def __init__(self, spec: WorkerSpec) -> None:
        device, dtype = resolve_device(spec.stage.device, spec.stage.dtype)
        folder = spec.model_dir
        config = Qwen3OmniConfig.from_folder(folder)
        if config.talker_ids is None:
            raise ValueError(f"{folder} has no talker (a Thinking/text-only checkpoint)")
        talker = Talker.from_checkpoint(folder, device, dtype, spec.stage.quantization, config=config)
        mrope = talker_mrope_tokens(talker.config, MRopeTokens.from_thinker_config(config.hf.thinker_config))
        self.ctx = TalkerContext(talker, load_thinker_embedding(folder, device, dtype), config.talker_ids, mrope)
        self.num_groups = talker.num_code_groups
        positions = int(talker.config.text_config.max_position_embeddings)
        super().__init__(build_ar_engine(talker, engine_config(spec.stage, device, dtype, positions),
                                         self.ctx.step_hook()))
        self.requests: dict[str, TalkerTextFeed]
        self.profile_with(spec.stage, talker.codec_head.weight)

    @torch.inference_mode()
    def handle(self, message: StageInput) -> list[StageOutput | RequestFailed]:
        payload, rid = message.payload, message.request_id
        if isinstance(payload, TalkerStart):
            request, feed = build_talker_request(self.ctx, rid, payload.layout, _tensor(payload.mm_hidden),
                                                 payload.first_token, payload.sampling, payload.voice,
                                                 payload.thinker_items)
            self.engine.add_request(request)
            self.requests[rid] = feed
        elif isinstance(payload, TextFeed):
            feed = self.requests.get(rid)
            if feed is not None:  # None: the talker already finished (EOS before the text ran out)
                feed.extend(payload.token_ids)
                if payload.finished:
                    feed.finish()
        else:
            raise TypeError(f"the talker does not take {type(payload).__name__}")
        return []


class Code2WavWorker(CodecWorker):
    def load_vocoder(self, spec: WorkerSpec, device: str, dtype: torch.dtype) -> ChunkDecoder:
        config = Qwen3OmniConfig.from_folder(spec.model_dir)
        if config.code2wav is None:
            raise ValueError(f"{spec.model_dir} has no code2wav (a Thinking/text-only checkpoint)")
        model = load_code2wav(spec.model_dir, config.code2wav, device, dtype)
        return code2wav_runner(model, ChunkPlan(seamless=spec.seamless_audio), device)
