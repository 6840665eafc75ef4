"""FusedRows: linears over one input as one matmul, the checkpoint's parameters kept as views of the stack."""

from __future__ import annotations

import torch
from torch import nn

from omnistage.layers.linear import FusedRows, GatedMLP


def _linears(bias: bool = False) -> list[nn.Linear]:
    torch.manual_seed(0)
    return [nn.Linear(16, n, bias=bias) for n in (8, 4, 4)]


def test_one_matmul_equals_the_separate_linears_and_shares_their_memory() -> None:
    linears = _linears(bias=True)
    x = torch.randn(5, 16)
    expected = [linear(x) for linear in linears]
    fused = FusedRows(*linears)
    got = fused(x)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)  # one GEMM of another shape
    stack = fused._weight
    assert stack is not None and stack.shape == (16, 16)
    assert [linear.weight.data_ptr() for linear in linears] == [stack[i].data_ptr() for i in (0, 8, 12)]


def test_loads_write_through_and_replaced_storage_is_restacked() -> None:
    linears = _linears()
    fused = FusedRows(*linears)
    x = torch.randn(2, 16)
    fused(x)
    with torch.no_grad():
        linears[1].weight.copy_(torch.ones(4, 16))  # an in-place load (what load_module does)
    torch.testing.assert_close(fused(x)[1], x.sum(-1, keepdim=True).expand(2, 4), atol=1e-5, rtol=1e-5)
    linears[2].weight = nn.Parameter(torch.zeros(4, 16))  # a new tensor (what .to() does)
    assert torch.equal(fused(x)[2], torch.zeros(2, 4))
    assert linears[2].weight.data_ptr() == fused._weight[12].data_ptr()


def test_gated_mlp_keeps_the_checkpoint_names() -> None:
    mlp = GatedMLP(16, 32)
    assert set(mlp.state_dict()) == {"gate_proj.weight", "up_proj.weight", "down_proj.weight"}
    x = torch.randn(3, 16)
    expected = mlp.down_proj(mlp.act(mlp.gate_proj(x)) * mlp.up_proj(x))
    torch.testing.assert_close(mlp(x), expected, atol=1e-6, rtol=1e-5)


def test_head_norms_follow_their_weights() -> None:
    from omnistage.layers.norm import RMSNorm
    from omnistage.models.decoder import HeadNorms

    q_norm, k_norm = RMSNorm(8), RMSNorm(8)
    norms = HeadNorms((q_norm, 3), (k_norm, 1))
    assert torch.equal(norms.weight(), torch.ones(4, 8))
    with torch.no_grad():
        k_norm.weight.fill_(2.0)  # an in-place load after first use
    assert torch.equal(norms.weight()[3], torch.full((8,), 2.0)) and torch.equal(norms.weight()[:3], torch.ones(3, 8))
