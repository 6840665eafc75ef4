"""One Qwen3-Omni request offline, stage after stage: what ``omnistage verify`` holds against transformers.

The same request builders and engines the streaming workers use, run in order
on one device: the thinker to completion, then the talker fed the whole text,
then the vocoder over the frames cut into chunks (transformers'
``chunked_decode(300, 25)`` unless the plan says otherwise).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import torch

from omnistage.engine import EngineConfig, RequestOutput
from omnistage.engine.frame_chunker import ChunkPlan, FrameChunker
from omnistage.engine.generation_engine import ChunkOutput, GenerationEngineCore
from omnistage.families.qwen3_omni.sharded_thinker import load_thinker
from omnistage.families.qwen3_omni.stages import (TalkerContext, build_talker_request, build_thinker_request,
                                                  code2wav_runner, multimodal_hidden, talker_mrope_tokens)
from omnistage.families.qwen3_omni.thinker_hook import ThinkerStepHook
from omnistage.models.qwen3_omni.code2wav import Code2Wav, load_code2wav
from omnistage.models.qwen3_omni.config import Qwen3OmniConfig
from omnistage.models.qwen3_omni.inputs import MultimodalInputs, PromptLayout
from omnistage.models.qwen3_omni.talker import Talker
from omnistage.models.qwen3_omni.thinker import Thinker
from omnistage.runner.tp_executor import TPExecutor
from omnistage.runner import build_ar_engine
from omnistage.sampling_params import SamplingParams
from omnistage.workers.talker import talker_frames


@dataclass(frozen=True)
class GenerationSettings:
    """One request's settings for all three stages; defaults are verify's greedy run. min_new_tokens: transformers
    cannot build a talker prompt from a reply that is only EOS. Talker temperature 0 is transformers'
    ``talker_do_sample=False`` (the code predictor greedy too)."""

    max_new_tokens: int = 12
    min_new_tokens: int = 2
    talker_max_new_tokens: int = 24
    talker_min_new_tokens: int = 16
    talker_temperature: float = 0.0
    talker_top_k: int = 50
    talker_top_p: float = 1.0
    talker_repetition_penalty: float = 1.05
    talker_seed: int | None = None
    speaker: str = "ethan"
    chunks: ChunkPlan = field(default_factory=ChunkPlan)

    def thinker_params(self) -> SamplingParams:
        return SamplingParams(temperature=0.0, max_tokens=self.max_new_tokens, min_tokens=self.min_new_tokens)

    def talker_params(self) -> SamplingParams:
        return SamplingParams(
            temperature=self.talker_temperature, top_k=self.talker_top_k, top_p=self.talker_top_p,
            repetition_penalty=self.talker_repetition_penalty, seed=self.talker_seed,
            max_tokens=self.talker_max_new_tokens, min_tokens=self.talker_min_new_tokens,
        )


@dataclass
class StageModels:
    """The three stage models of one checkpoint folder, on one device in one dtype (the thinker possibly as rank 0
    of a tensor-parallel group: ``close()`` stops its other ranks)."""

    thinker: Thinker
    talker: Talker
    code2wav: Code2Wav
    config: Qwen3OmniConfig
    device: torch.device
    dtype: torch.dtype
    thinker_tp: TPExecutor | None = None

    @classmethod
    def load(cls, folder: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
             tensor_parallel_size: int = 1) -> StageModels:
        config = Qwen3OmniConfig.from_folder(folder)
        if config.talker_ids is None or config.code2wav is None:
            raise ValueError(f"{folder} is a checkpoint without a talker: it makes no audio")
        thinker, tp = load_thinker(folder, device, dtype, tensor_parallel_size, config=config)
        return cls(thinker, Talker.from_checkpoint(folder, device, dtype, config=config),
                   load_code2wav(folder, config.code2wav, device, dtype), config, torch.device(device), dtype, tp)

    def close(self) -> None:
        if self.thinker_tp is not None:
            self.thinker_tp.close()

    @property
    def eos_token_id(self) -> int:
        return self.config.im_end_token_id

    def talker_context(self) -> TalkerContext:
        assert self.config.talker_ids is not None  # checked at load
        mrope = talker_mrope_tokens(self.talker.config, self.thinker.mrope_tokens)
        return TalkerContext(self.talker, self.thinker.embed_tokens, self.config.talker_ids, mrope)

    def engine_config(self, max_len: int) -> EngineConfig:
        """One request of up to ``max_len`` tokens: eager (nothing to amortise a graph capture over)."""
        block = 16
        return EngineConfig(block_size=block, num_blocks=-(-max_len // block) + 2, max_num_seqs=1,
                            max_num_batched_tokens=max(max_len, 1), max_model_len=max_len, device=str(self.device),
                            dtype=self.dtype, enforce_eager=True)


class OfflineOutput(NamedTuple):
    tokens: list[int]  # generated thinker ids
    codes: torch.Tensor  # [G, frames]
    wav: torch.Tensor  # [samples] at 24 kHz


def generate_offline(models: StageModels, token_ids: list[int], mm: MultimodalInputs,
                     settings: GenerationSettings) -> OfflineOutput:
    """Thinker engine to completion, then the talker engine, then code2wav: one request, in order."""
    ctx = models.talker_context()
    thinker_req = build_thinker_request(models.thinker, "offline", token_ids, mm, settings.thinker_params(),
                                        models.eos_token_id, for_talker=True)
    engine = build_ar_engine(models.thinker, models.engine_config(len(token_ids) + settings.max_new_tokens),
                             ThinkerStepHook(), tp=models.thinker_tp)
    engine.add_request(thinker_req)
    engine.run_until_done()
    tokens = list(thinker_req.output_token_ids)
    talker_req, feed = build_talker_request(
        ctx, "offline", PromptLayout.of(token_ids, mm), multimodal_hidden(thinker_req, ctx.token_ids.multimodal),
        tokens[0], settings.talker_params(), settings.speaker)
    feed.extend(tokens[1:])
    feed.finish()
    engine = build_ar_engine(models.talker, models.engine_config(
        talker_req.num_prompt_tokens + settings.talker_max_new_tokens), ctx.step_hook())
    engine.add_request(talker_req)
    outputs = engine.run_until_done()
    return OfflineOutput(tokens, *_vocode(models, outputs, settings.chunks))


def _vocode(models: StageModels, outputs: list[RequestOutput], plan: ChunkPlan) -> tuple[torch.Tensor, torch.Tensor]:
    groups = models.talker.num_code_groups
    chunker = FrameChunker("offline", plan, groups)
    vocoder = GenerationEngineCore(code2wav_runner(models.code2wav, plan, models.device))
    frames = [f for f in map(talker_frames, outputs) if f is not None and len(f)]
    for f in frames:
        for job in chunker.push(f):
            vocoder.add_job(job)
    for job in chunker.finish():
        vocoder.add_job(job)
    codes = torch.cat(frames).T.cpu() if frames else torch.zeros(groups, 0, dtype=torch.long)
    return codes, join_chunks(vocoder.run_until_done())


def join_chunks(outputs: Iterable[ChunkOutput]) -> torch.Tensor:
    """One request's chunk outputs -> its waveform, in chunk order."""
    wavs = [o.wav for o in sorted(outputs, key=lambda o: o.chunk_index)]
    return torch.cat(wavs) if wavs else torch.zeros(0)
