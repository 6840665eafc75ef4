"""Qwen2.5-Omni's thinker on omnistage's engine equals transformers' on the tiny checkpoint: TMRoPE positions
(``get_rope_index``), prompt logits within ATOL, and greedy tokens through the paged engine, on text, audio,
image, video and audio-in-video prompts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from omnistage.engine import EngineConfig
from omnistage.layers.attention import AttentionMetadata, ForwardContext, forward_context
from omnistage.layers.attention.torch_sdpa import TorchSDPABackend
from omnistage.families.qwen2_5_omni.thinker_stage import build_thinker_request
from omnistage.models.qwen2_5_omni.thinker import Thinker
from omnistage.runner import build_ar_engine
from omnistage.sampling_params import SamplingParams
from tests.families.qwen2_5_omni.conftest import Case, prompt_cases

ATOL = 1e-4  # fp32 logits; different matmul orders (fused qkv, paged vs dense attention) differ by ~1e-6
NEW_TOKENS = 8
CASES = ("text", "audio", "image", "video", "audio_in_video")


@pytest.fixture(scope="module")
def ours(omni25_dir: Path) -> Thinker:
    return Thinker.from_checkpoint(omni25_dir, dtype=torch.float32)


@pytest.fixture(scope="module")
def cases(reference: torch.nn.Module) -> dict[str, Case]:
    return prompt_cases(reference.config)


@pytest.mark.parametrize("name", CASES)
def test_tmrope_positions_equal_get_rope_index(name: str, ours: Thinker, reference: torch.nn.Module,
                                               cases: dict[str, Case]) -> None:
    case = cases[name]
    mm = case.mm
    ids = torch.tensor([case.ids])
    lens = None if mm.feature_attention_mask is None else mm.feature_attention_mask.sum(-1)
    theirs, delta = reference.thinker.model.get_rope_index(
        ids, mm.image_grid_thw, mm.video_grid_thw, torch.ones_like(ids), mm.use_audio_in_video, lens,
        mm.video_second_per_grid)
    positions, our_delta = ours.positions(ids[0], mm)
    assert torch.equal(positions, theirs[:, 0]) and our_delta == int(delta)


@pytest.mark.parametrize("name", CASES)
def test_prompt_logits_match(name: str, ours: Thinker, reference: torch.nn.Module, cases: dict[str, Case]) -> None:
    case = cases[name]
    ids = torch.tensor(case.ids)
    positions, _ = ours.positions(ids, case.mm)
    with torch.no_grad(), forward_context(ForwardContext(AttentionMetadata.for_fresh_sequences([len(ids)]),
                                                         TorchSDPABackend())):
        logits = ours.compute_logits(ours(ids, positions, ours.embed(ids, case.mm)))
        # Without an attention mask transformers cannot lay out TMRoPE and falls back to 1-D positions.
        theirs = reference.thinker(input_ids=ids[None], attention_mask=torch.ones_like(ids[None]),
                                   **case.hf_kwargs()).logits[0]
    assert (logits - theirs).abs().max().item() < ATOL


@pytest.mark.parametrize("name", CASES)
def test_greedy_tokens_through_the_engine(name: str, ours: Thinker, reference: torch.nn.Module,
                                          cases: dict[str, Case]) -> None:
    case = cases[name]
    request = build_thinker_request(ours, name, case.ids, case.mm, SamplingParams(temperature=0.0,
                                                                                  max_tokens=NEW_TOKENS), None)
    engine = build_ar_engine(ours, EngineConfig(block_size=4, num_blocks=64, max_num_seqs=1,
                                                max_num_batched_tokens=32, max_model_len=256, enforce_eager=True))
    engine.add_request(request)  # block size 4 and a 32-token budget: a chunked prefill over many paged blocks
    engine.run_until_done()
    with torch.no_grad():
        theirs = reference.thinker.generate(torch.tensor([case.ids]), max_new_tokens=NEW_TOKENS,
                                            min_new_tokens=NEW_TOKENS, do_sample=False, **case.hf_kwargs())
    assert list(request.output_token_ids) == theirs[0, len(case.ids):].tolist()
