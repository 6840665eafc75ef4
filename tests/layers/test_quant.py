"""Quantized layers against their dequantised references: int8 weight-only (per row) and FP8 (per tensor, per
row, per block). The reference multiplies the same 1-byte values times their scales in fp32, so what is compared
is the kernel, not the quantization error; that error is bounded separately (half a step per value).

Tolerances, relative to the largest output: int8 on CPU runs torch's packed kernel on bf16 activations (8
significant bits): 1e-2. FP8 GEMMs quantise the activations per row to e4m3 (4 significant bits): 6e-2.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from omnistage.layers.linear import FusedRows, GatedMLP
from omnistage.layers.moe import SparseMoeBlock
from omnistage.layers.moe_torch import experts_sorted
from omnistage.layers.quant.apply import apply_quantization, quantize_int8_
from omnistage.layers.quant.fp8 import FP8, dequantize_fp8, fp8_linear, quantize_fp8, row_scales, scale_layout
from omnistage.layers.quant.int8 import dequantize_rows, int8_linear, quantize_rows
from tests.layers.moe_reference import experts_reference, random_experts, random_routing

INT8_REL = 1e-2
FP8_REL = 6e-2


def _close(got: torch.Tensor, want: torch.Tensor, rel: float) -> None:
    got, want = got.detach().float(), want.detach().float()
    assert want.abs().max() > 0.5  # outputs of a meaningful size, so the bound below is not trivially met
    torch.testing.assert_close(got, want, atol=rel * float(want.abs().max()), rtol=0.0)


def _weight(rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("cols", [64, 40])  # 64: torch's packed int8 kernel; 40: not a multiple of 16, dequantised
@pytest.mark.parametrize("rows", [1, 5])
def test_int8_linear_equals_its_dequantised_weight(rows: int, cols: int) -> None:
    w = _weight(48, cols)
    q, scale = quantize_rows(w, torch.bfloat16)
    assert q.dtype == torch.int8 and scale.shape == (48,)
    deq = dequantize_rows(q, scale)
    # Quantization error: at most half a step (plus the bf16 scale's rounding, already in the step).
    assert ((deq - w).abs() <= scale.float().unsqueeze(-1) * 0.5 + 1e-6).all()
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(rows))
    _close(int8_linear(x, q, scale), x @ deq.t(), INT8_REL)


@pytest.mark.parametrize("block", [None, (16, 32)])
def test_fp8_quantize_dequantize_round_trip(block: tuple[int, int] | None) -> None:
    w = _weight(40, 72)  # not multiples of the block: padded blocks at the edges
    q, scale = quantize_fp8(w, block)
    assert q.dtype == FP8
    assert scale_layout(scale, (40, 72), block) == ("tensor" if block is None else "block")
    deq = dequantize_fp8(q, scale, block)
    # e4m3 keeps 4 significant bits: each value within 1/16 of itself (relative), plus the subnormal floor.
    assert ((deq - w).abs() <= w.abs() / 16 + float(scale.max()) * 2**-6).all()


@pytest.mark.parametrize("shape", [(48, 64), (40, 24)])  # (40, 24): not 16-aligned, the widened fallback
def test_fp8_linear_equals_its_dequantised_weight(shape: tuple[int, int]) -> None:
    w = _weight(*shape)
    q, scale = quantize_fp8(w)
    rows = row_scales(scale, shape[0])
    x = torch.randn(3, shape[1])
    _close(fp8_linear(x, q, rows), x @ dequantize_fp8(q, scale).t(), FP8_REL)


def test_fused_rows_of_int8_linears_equal_their_dequantised_linears() -> None:
    torch.manual_seed(0)
    linears = [nn.Linear(64, n, bias=True) for n in (32, 16, 16)]
    fused = FusedRows(*linears)
    x = torch.randn(4, 64)
    for linear in linears:  # what quantize_int8_ does to each
        q, scale = quantize_rows(linear.weight, torch.bfloat16)
        linear.weight = nn.Parameter(q, requires_grad=False)
        linear.register_buffer("weight_scale", scale)
    got = fused(x)
    for out, linear in zip(got, linears):
        want = F.linear(x, dequantize_rows(linear.weight, linear.weight_scale), linear.bias)
        _close(out, want, INT8_REL)
    assert fused._scale is not None and fused._weight.dtype == torch.int8


def _dequantised_copy(module: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter of ``module`` as the reference sees it: quantized ones times their row scales."""
    out = {}
    for path, sub in module.named_modules():
        for name, p in sub.named_parameters(recurse=False):
            scale = sub._buffers.get("weight_scale" if name == "weight" else f"{name}_scale")
            out[f"{path}.{name}" if path else name] = p if scale is None else dequantize_rows(p, scale)
    return out


def test_int8_gated_mlp_equals_its_dequantised_reference() -> None:
    torch.manual_seed(1)
    mlp = GatedMLP(64, 96)
    x = torch.randn(3, 64) * 8
    assert quantize_int8_(mlp) == 3
    ref = GatedMLP(64, 96)
    ref.load_state_dict(_dequantised_copy(mlp))
    _close(mlp(x), ref(x), INT8_REL)


def test_int8_experts_equal_the_dequantised_definition() -> None:
    gate_up, down = random_experts(8, 64, 32, seed=2)
    gu_q, gu_s = quantize_rows(gate_up, torch.bfloat16)
    dn_q, dn_s = quantize_rows(down, torch.bfloat16)
    x = torch.randn(5, 64) * 4
    ids, weights = random_routing(5, 8, 3, seed=2)
    got = experts_sorted(x, ids, weights, gu_q, dn_q, F.silu, gu_s, dn_s)
    want = experts_reference(x, ids, weights, dequantize_rows(gu_q, gu_s), dequantize_rows(dn_q, dn_s))
    _close(got, want, INT8_REL)


def test_int8_keeps_router_norms_and_gates_in_full_precision() -> None:
    torch.manual_seed(3)
    moe = SparseMoeBlock(64, 8, 2, 32, True, shared_expert_intermediate_size=32)
    with torch.no_grad():
        for p in moe.parameters():
            p.normal_(0.0, 0.2)
    x = torch.randn(4, 64)
    full = {k: v.clone() for k, v in moe.state_dict().items()}
    apply_quantization(moe, "int8")
    assert moe.gate.weight.dtype == torch.float32 and torch.equal(moe.gate.weight, full["gate.weight"])
    assert moe.shared_expert_gate.weight.dtype == torch.float32
    assert moe.experts.gate_up_proj.dtype == torch.int8 and moe.shared_expert.down_proj.weight.dtype == torch.int8
    ref = SparseMoeBlock(64, 8, 2, 32, True, shared_expert_intermediate_size=32)
    deq = _dequantised_copy(moe)
    ref.load_state_dict({**deq, "experts.gate_up_proj": dequantize_rows(moe.experts.gate_up_proj,
                                                                         moe.experts.gate_up_proj_scale),
                         "experts.down_proj": dequantize_rows(moe.experts.down_proj, moe.experts.down_proj_scale)})
    with torch.inference_mode():
        _close(moe(x), ref(x), INT8_REL)
    with pytest.raises(ValueError, match="unknown quantization"):
        apply_quantization(moe, "int4")


# Triton, interpreted ----------------------------------------------------------------------------


def test_triton_w8_gemm_equals_the_dequantised_product(interpreted_triton: None) -> None:
    from omnistage.layers.quant import int8_triton

    w = _weight(70, 40)  # not multiples of the 64-wide tiles: the masks are exercised
    q, scale = quantize_rows(w, torch.float32)
    x = torch.randn(3, 40)
    torch.testing.assert_close(int8_triton.w8_linear(x, q, scale), x @ dequantize_rows(q, scale).t(),
                               atol=1e-4, rtol=1e-4)  # fp32 throughout: summation order only


def test_triton_fused_experts_with_int8_scales(interpreted_triton: None) -> None:
    from omnistage.layers import fused_moe_triton

    gate_up, down = random_experts(8, 40, 20, seed=4)
    gu_q, gu_s = quantize_rows(gate_up, torch.float32)
    dn_q, dn_s = quantize_rows(down, torch.float32)
    x = torch.randn(6, 40)
    ids, weights = random_routing(6, 8, 2, seed=4)
    got = fused_moe_triton.fused_experts(x, ids, weights, gu_q, dn_q, F.silu, gu_s, dn_s)
    want = experts_reference(x, ids, weights, dequantize_rows(gu_q, gu_s), dequantize_rows(dn_q, dn_s))
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
