"""RMSNorm, RoPE / M-RoPE and the MoE block against transformers' Qwen3-Omni modules."""

from __future__ import annotations

import pytest
import torch
from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as hf
from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import (
    Qwen3OmniMoeTalkerCodePredictorConfig,
    Qwen3OmniMoeTalkerTextConfig,
    Qwen3OmniMoeTextConfig,
)

from omnistage.layers.moe import SparseMoeBlock
from omnistage.layers.norm import RMSNorm
from omnistage.layers.rotary import RotaryEmbedding, apply_rotary, mrope_axis_index


def _text_config(head_dim: int, section: list[int], **extra: object) -> Qwen3OmniMoeTextConfig:
    rope = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": section, "interleaved": True}
    return Qwen3OmniMoeTextConfig(hidden_size=64, head_dim=head_dim, num_attention_heads=4, rope_parameters=rope,
                                  **extra)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm_matches_transformers(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    ref = hf.Qwen3OmniMoeThinkerTextRMSNorm(48, eps=1e-6).to(dtype)
    ref.weight.data.normal_()
    ours = RMSNorm(48, eps=1e-6).to(dtype)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(5, 3, 48).to(dtype)
    if dtype == torch.bfloat16:
        assert torch.equal(ours(x), ref(x))  # the reference's order of casts, bit for bit
    else:
        # float32 on a CPU takes the norm by another summation (omnistage.layers.norm): rounding apart only.
        torch.testing.assert_close(ours(x), ref(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("head_dim", "section"), [(16, [4, 2, 2]), (128, [24, 20, 20]), (64, [16, 8, 8])])
def test_mrope_matches_transformers(head_dim: int, section: list[int]) -> None:
    ref = hf.Qwen3OmniMoeThinkerTextRotaryEmbedding(_text_config(head_dim, section))
    ours = RotaryEmbedding(head_dim, 1e6, section)
    torch.manual_seed(0)
    positions = torch.randint(0, 5000, (3, 23))
    ref_cos, ref_sin = ref(torch.zeros(1), positions[:, None, :])
    cos, sin = ours(positions)
    assert torch.equal(cos, ref_cos[0]) and torch.equal(sin, ref_sin[0])


def test_mrope_text_positions_equal_1d() -> None:
    ours = RotaryEmbedding(16, 1e6, [4, 2, 2])
    positions = torch.arange(9) + 5
    cos3, sin3 = ours(positions.expand(3, -1))
    cos1, sin1 = ours(positions)
    assert torch.equal(cos3, cos1) and torch.equal(sin3, sin1)
    plain_cos, _ = RotaryEmbedding(16, 1e6)(positions)
    assert torch.equal(cos1, plain_cos)


def test_mrope_axis_is_interleaved() -> None:
    assert mrope_axis_index([4, 2, 2], 8).tolist() == [0, 1, 2, 0, 1, 2, 0, 0]
    with pytest.raises(ValueError, match="sum"):
        mrope_axis_index([4, 2, 1], 8)


def test_rope_1d_and_apply_match_transformers() -> None:
    config = Qwen3OmniMoeTalkerCodePredictorConfig(hidden_size=32, head_dim=8, num_attention_heads=4)
    ref = hf.Qwen3OmniMoeRotaryEmbedding(config)
    ours = RotaryEmbedding(8, config.rope_parameters["rope_theta"])
    positions = torch.arange(7)
    ref_cos, ref_sin = ref(torch.zeros(1), positions[None])
    cos, sin = ours(positions)
    assert torch.equal(cos, ref_cos[0]) and torch.equal(sin, ref_sin[0])
    q, k = torch.randn(7, 4, 8), torch.randn(7, 2, 8)
    ref_q, ref_k = hf.apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], ref_cos, ref_sin)
    got_q, got_k = apply_rotary(q, k, cos, sin)
    assert torch.equal(got_q, ref_q[0].transpose(0, 1)) and torch.equal(got_k, ref_k[0].transpose(0, 1))


def _moe_pair(
    shared: bool, norm_topk: bool, experts: int = 8, top_k: int = 2
) -> tuple[torch.nn.Module, SparseMoeBlock]:
    torch.manual_seed(1)
    kwargs = dict(hidden_size=32, moe_intermediate_size=24, num_experts=experts, num_experts_per_tok=top_k,
                  norm_topk_prob=norm_topk)
    if shared:
        ref = hf.Qwen3OmniMoeTalkerTextSparseMoeBlock(
            Qwen3OmniMoeTalkerTextConfig(shared_expert_intermediate_size=40, **kwargs))
    else:
        ref = hf.Qwen3OmniMoeThinkerTextSparseMoeBlock(Qwen3OmniMoeTextConfig(**kwargs))
    for param in ref.parameters():
        param.data.normal_(0, 0.3)
    ours = SparseMoeBlock(32, experts, top_k, 24, norm_topk, "silu", 40 if shared else 0)
    ours.load_state_dict(ref.state_dict())
    return ref.eval(), ours


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("norm_topk", [False, True])
@pytest.mark.parametrize("num_tokens", [1, 3, 4, 37])
def test_moe_matches_transformers(shared: bool, norm_topk: bool, num_tokens: int) -> None:
    ref, ours = _moe_pair(shared, norm_topk)
    x = torch.randn(num_tokens, 32)
    with torch.no_grad():
        expected = ref(x[None])[0]
        got = ours(x)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_rope_in_bf16_rotates_in_float32() -> None:
    """bf16 q/k are rotated with float32 angles and arithmetic, then rounded once: closer to the fp32 result
    than rotating with bf16 cos/sin."""
    ours = RotaryEmbedding(64, 1e6)
    positions = torch.arange(4000, 4007)
    torch.manual_seed(0)
    q, k = torch.randn(7, 4, 64), torch.randn(7, 2, 64)
    cos, sin = ours(positions)
    want_q, _ = apply_rotary(q, k, cos, sin)
    got_q, got_k = apply_rotary(q.bfloat16(), k.bfloat16(), cos, sin)
    assert got_q.dtype == torch.bfloat16 and got_k.dtype == torch.bfloat16
    bf16_angles, _ = apply_rotary(q.bfloat16(), k.bfloat16(), cos.bfloat16(), sin.bfloat16())
    err_fp32 = (got_q.float() - want_q).abs().max()
    err_bf16 = (bf16_angles.float() - want_q).abs().max()
    assert err_fp32 < err_bf16
    torch.testing.assert_close(got_q.float(), want_q, atol=2e-2, rtol=1e-2)  # one bf16 rounding
