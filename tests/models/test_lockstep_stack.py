"""The code predictor's passes through :class:`LockstepStack` are the decoder's own forward, bit for bit.

The stack runs the same operations in the same order on the same tensors as ``Decoder.run_layers`` with the
lockstep backend, so the comparison is exact. The decoder's own path is forced with a pass-through step leader
(what a tensor-parallel rank 0 has), which the stack does not cover.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn

from omnistage.layers.rotary import Rotation
from omnistage.models.decoder import Decoder, Deepstack
from omnistage.models.lockstep_stack import LockstepStack
from omnistage.models.qwen3_omni.talker import Talker
from omnistage.runner.sampler import Sampler, SamplingBatch


class _PassThrough:
    """A step leader with no other ranks: runs the forward it is handed (the decoder's own path)."""

    def __init__(self) -> None:
        self.calls = 0

    def run(self, forward, inputs_embeds: torch.Tensor, positions: torch.Tensor,  # noqa: ANN001
            deepstack: Deepstack | None, capture_layer: int | None,
            rotation: Rotation | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        self.calls += 1
        return forward(inputs_embeds, positions, deepstack, capture_layer, rotation)


@pytest.fixture(scope="module")
def talker(tiny_dir: Path) -> Talker:
    return Talker.from_checkpoint(tiny_dir, dtype=torch.float32)


def _inputs(n: int, hidden: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, hidden, generator=gen) * 3, torch.randint(0, 64, (n,), generator=gen)


def _both_paths(talker: Talker, hidden: torch.Tensor, code0: torch.Tensor,
                sampler=None) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: ANN001
    """Codes through the stack, then through the decoder's forward (a fresh copy with a pass-through leader)."""
    fast = talker.predict_residual_codes(hidden, code0, sampler)
    slow_talker = copy.deepcopy(talker)
    decoder = slow_talker.code_predictor.model
    decoder.leader = leader = _PassThrough()
    assert not LockstepStack.supports(decoder)
    slow = slow_talker.predict_residual_codes(hidden, code0, sampler)
    assert leader.calls == talker.num_code_groups - 1  # every pass went through the decoder's forward
    return fast, slow


@pytest.mark.parametrize("n", [1, 3, 8])
def test_greedy_codes_are_the_decoder_forwards(talker: Talker, n: int) -> None:
    hidden, code0 = _inputs(n, talker.config.text_config.hidden_size, n)
    fast, slow = _both_paths(talker, hidden, code0)
    assert torch.equal(fast, slow)


def test_every_pass_hidden_is_the_same_bits(talker: Talker) -> None:
    """Not only the argmax: the final hidden of every pass, fed the same rows, is identical."""
    predictor = talker.code_predictor
    n, groups = 3, talker.num_code_groups
    hidden, code0 = _inputs(n, talker.config.text_config.hidden_size, 7)
    x0 = torch.stack([hidden, talker.embed_tokens(code0)], dim=1).flatten(0, 1)
    feeds = [torch.randn(n, x0.shape[-1], generator=torch.Generator().manual_seed(s)) for s in range(groups - 2)]
    slow_decoder = copy.deepcopy(predictor.model)
    slow_decoder.leader = _PassThrough()
    with torch.no_grad():
        fast = predictor.workspace.passes(predictor.model, n, x0)
        slow = predictor.workspace.passes(slow_decoder, n, x0)
        assert fast.stack is not None and slow.stack is None
        for step in range(groups - 1):
            x = x0 if step == 0 else feeds[step - 1]
            a = fast.run(x, step)
            b = slow.run(x, step)
            assert torch.equal(a, b), step


def test_sampled_codes_are_the_decoder_forwards(talker: Talker) -> None:
    n = 4
    hidden, code0 = _inputs(n, talker.config.text_config.hidden_size, 11)
    batch = SamplingBatch(temperature=torch.full((n,), 0.9), top_k=torch.full((n,), 50), top_p=torch.ones(n),
                          generators=[torch.Generator().manual_seed(100 + i) for i in range(n)], all_greedy=False,
                          any_greedy=False, needs_sort=True, max_top_k=50, any_top_p=False)
    sampling = Sampler().residual(batch, talker.num_code_groups - 1, talker.residual_vocab_size,
                                  torch.device("cpu"))
    fast, slow = _both_paths(talker, hidden, code0, sampling)  # the same drawn noise for both
    assert torch.equal(fast, slow)
    assert not torch.equal(fast, talker.predict_residual_codes(hidden, code0))  # sampling did something


def test_a_weight_replaced_between_calls_is_used(talker: Talker) -> None:
    """Replacing a parameter's storage (as quantization or ``.to()`` does) is seen at the next predict call."""
    mine = copy.deepcopy(talker)
    hidden, code0 = _inputs(2, mine.config.text_config.hidden_size, 3)
    before = mine.predict_residual_codes(hidden, code0)
    layer = mine.code_predictor.model.layers[0]
    gen = torch.Generator().manual_seed(5)
    layer.mlp.down_proj.weight = nn.Parameter(torch.randn(layer.mlp.down_proj.weight.shape, generator=gen) * 5,
                                              requires_grad=False)
    layer.self_attn.q_norm.weight = nn.Parameter(torch.full_like(layer.self_attn.q_norm.weight, 3.0),
                                                 requires_grad=False)
    fast, slow = _both_paths(mine, hidden, code0)
    assert torch.equal(fast, slow)
    assert not torch.equal(fast, before)  # the new weights changed the codes: they were read


def test_int8_predictor_matches_its_decoder_forward(tiny_dir: Path) -> None:
    quantized = Talker.from_checkpoint(tiny_dir, dtype=torch.float32, quantization="int8")
    hidden, code0 = _inputs(3, quantized.config.text_config.hidden_size, 9)
    fast, slow = _both_paths(quantized, hidden, code0)
    assert torch.equal(fast, slow)


def test_the_stack_covers_dense_single_rank_stacks_only(talker: Talker) -> None:
    predictor_model: Decoder = talker.code_predictor.model
    assert LockstepStack.supports(predictor_model)
    assert not LockstepStack.supports(talker.model)  # MoE layers
    led = copy.deepcopy(predictor_model)
    led.leader = _PassThrough()
    assert not LockstepStack.supports(led)
    with pytest.raises(ValueError, match="dense"):
        LockstepStack(talker.model)
