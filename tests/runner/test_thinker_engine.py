"""The tiny Qwen3-Omni thinker under the real engine: batching never changes greedy tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from omnistage.engine import Request
from omnistage.sampling_params import SamplingParams
from tests.runner.helpers import config, generate, prompts

PARAMS = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)


@pytest.fixture(scope="module")
def thinker(tiny_dir: Path):
    from omnistage.models.qwen3_omni.thinker import Thinker

    return Thinker.from_checkpoint(tiny_dir, "cpu", torch.float32)


def _requests(thinker, token_lists: list[list[int]]) -> list[Request]:
    out = []
    for i, ids in enumerate(token_lists):
        positions, delta = thinker.positions(torch.tensor(ids))
        out.append(Request(f"r{i}", ids, PARAMS, prompt_positions=positions, rope_delta=int(delta)))
    return out


def test_batched_decoding_equals_each_request_alone(thinker) -> None:
    vocab = thinker.config.text_config.vocab_size
    token_lists = prompts(min(vocab, 600), [5, 23, 2, 40, 11, 17, 8, 31])
    cfg = config(block_size=16, max_num_batched_tokens=64, long_prefill_token_threshold=32)
    batched = generate(thinker, _requests(thinker, token_lists), cfg)
    for i, ids in enumerate(token_lists):
        alone = generate(thinker, _requests(thinker, [ids]), cfg)["r0"]
        assert batched[f"r{i}"] == alone, f"request {i} changed when batched"


def test_merged_embeddings_prompt_matches_ids(thinker) -> None:
    ids = prompts(600, [12], seed=4)[0]
    embeds = thinker.embed(torch.tensor(ids)).inputs_embeds
    reqs = [Request("ids", ids, PARAMS), Request("emb", ids, PARAMS, prompt_embeds=embeds)]
    out = generate(thinker, reqs, config(block_size=16))
    assert out["ids"] == out["emb"]


def _reference_greedy(thinker, ids: list[int], embeds, deepstack, n: int) -> tuple[list[int], torch.Tensor]:
    """Greedy tokens from whole-sequence forwards without any cache; also the prompt's accept hidden."""
    from omnistage.layers.attention import AttentionMetadata, ForwardContext, forward_context
    from omnistage.layers.attention.torch_sdpa import TorchSDPABackend

    out: list[int] = []
    accept_prompt = None
    for _ in range(n):
        seq = torch.tensor(ids + out)
        x = torch.cat([embeds, thinker.embed_tokens(torch.tensor(out, dtype=torch.long))])
        meta = AttentionMetadata.for_fresh_sequences([len(seq)])
        with forward_context(ForwardContext(meta, TorchSDPABackend(), None)):
            hidden, accept = thinker.forward_with_accept_hidden(seq, torch.arange(len(seq)), x, deepstack)
        accept_prompt = accept[:len(ids)] if accept_prompt is None else accept_prompt
        out.append(int(thinker.compute_logits(hidden[-1:]).argmax(-1)))
    return out, accept_prompt


def test_deepstack_chunks_and_hidden_capture_match_uncached_reference(thinker) -> None:
    from omnistage.models.decoder import Deepstack
    from omnistage.families.qwen3_omni.thinker_hook import ThinkerRequestData, ThinkerStepHook

    ids = prompts(600, [21], seed=7)[0]
    embeds = thinker.embed(torch.tensor(ids)).inputs_embeds
    gen = torch.Generator().manual_seed(0)
    hidden = embeds.shape[1]
    deepstack = Deepstack(torch.tensor([2, 3, 9, 15]), torch.randn(2, 4, hidden, generator=gen))
    expected, accept = _reference_greedy(thinker, ids, embeds, deepstack, n=6)

    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    data = ThinkerRequestData(deepstack=deepstack, capture_hidden=True)
    target = Request("mm", ids, params, prompt_embeds=embeds, stage_data=data)
    company = [Request("a", prompts(600, [9], seed=8)[0], params),
               Request("b", ids, params, prompt_embeds=embeds)]  # same prompt, no deepstack
    cfg = config(block_size=4, max_num_batched_tokens=8, max_num_seqs=4)  # prompt split over 3+ steps
    out = generate(thinker, [target, *company], cfg, hook=ThinkerStepHook())
    assert out["mm"] == expected
    assert out["b"] != expected  # the deepstack features do change the reply
    assert data.hidden.num_captured == len(ids) + 5  # the last sampled token is never fed
    torch.testing.assert_close(data.hidden.all()[:len(ids)], accept, atol=1e-5, rtol=1e-4)
