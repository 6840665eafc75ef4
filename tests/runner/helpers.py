"""Runs requests through a real EngineCore + ARModelRunner and collects their tokens."""

from __future__ import annotations

from dataclasses import replace

import torch

from omnistage.engine import EngineConfig, EngineCore, Request, RequestOutput
from omnistage.runner import ARModel, StepHook, build_ar_engine
from omnistage.sampling_params import SamplingParams

CONFIG = EngineConfig(block_size=4, num_blocks=128, max_num_seqs=16, max_num_batched_tokens=256, max_model_len=128)
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def config(**overrides: object) -> EngineConfig:
    return replace(CONFIG, **overrides)


def make_engine(model: ARModel, cfg: EngineConfig = CONFIG, hook: StepHook | None = None) -> EngineCore:
    return build_ar_engine(model, cfg, hook)


def collect(outputs: list[RequestOutput]) -> dict[str, list[int]]:
    tokens: dict[str, list[int]] = {}
    for out in outputs:
        tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    return tokens


def generate(model: ARModel, requests: list[Request], cfg: EngineConfig = CONFIG,
             hook: StepHook | None = None) -> dict[str, list[int]]:
    engine = make_engine(model, cfg, hook)
    for request in requests:
        engine.add_request(request)
    return collect(engine.run_until_done())


def prompts(vocab: int, lengths: list[int], seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in lengths]


def requests(token_lists: list[list[int]], params: SamplingParams = GREEDY, **kwargs: object) -> list[Request]:
    return [Request(f"r{i}", ids, params, **kwargs) for i, ids in enumerate(token_lists)]
