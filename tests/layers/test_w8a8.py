"""W8A8 on CPU: per-token int8 activations times the int8 weight-only layers' weights, from a few rows up."""

from __future__ import annotations

import torch
from torch import nn

from omnistage.layers.linear import GatedMLP
from omnistage.layers.quant.apply import apply_quantization
from omnistage.layers.quant.int8 import dequantize_rows, int8_linear, quantize_rows
from omnistage.layers.quant.w8a8 import W8A8_MIN_ROWS, mark_dynamic_inputs_, w8a8_linear

# Both operands rounded to int8 (per row, per token): a relative error of a few 1/127 steps at worst.
RTOL = 0.03


def _case(rows: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x, w = torch.randn(rows, 64, generator=gen), torch.randn(48, 64, generator=gen)
    q, scale = quantize_rows(w, torch.bfloat16)
    return x, q, scale


def test_w8a8_is_close_to_the_dequantized_product() -> None:
    x, q, scale = _case(8)
    exact = x @ dequantize_rows(q, scale).t()
    out = w8a8_linear(x, q, scale)
    assert out.dtype == torch.float32 and out.shape == (8, 48)
    error = (out - exact).abs().max()
    assert 0 < error <= RTOL * exact.abs().max()  # activations rounded: not the weight-only result


def test_marked_linears_run_w8a8_from_the_minimum_rows() -> None:
    mlp = GatedMLP(64, 96)
    apply_quantization(mlp, "int8")
    few, many = torch.randn(W8A8_MIN_ROWS - 1, 64), torch.randn(W8A8_MIN_ROWS + 4, 64)
    weight_only = mlp(few), mlp(many)
    mark_dynamic_inputs_(mlp.quantizable_linears())
    assert mlp.gate_up.stacked().dynamic_inputs and mlp.down.stacked().dynamic_inputs
    torch.testing.assert_close(mlp(few), weight_only[0], rtol=0, atol=0)  # the same kernel below the minimum
    w8a8 = mlp(many)
    assert not torch.equal(w8a8, weight_only[1])
    torch.testing.assert_close(w8a8, weight_only[1], rtol=RTOL, atol=RTOL * weight_only[1].abs().max().item())


def test_only_int8_weights_can_be_marked() -> None:
    try:
        mark_dynamic_inputs_([nn.Linear(16, 16)])
    except TypeError:
        return
    raise AssertionError("a float weight was marked for W8A8")


def test_the_weight_only_kernel_is_unchanged_by_the_flag_below_the_minimum() -> None:
    x, q, scale = _case(1, seed=1)
    torch.testing.assert_close(int8_linear(x, q, scale), x @ dequantize_rows(q, scale).t(), rtol=0.02, atol=0.05)
