"""W8A8 on CPU: the int8 weight-only layers' weights (per-row scales, :mod:`omnistage.layers.quant.int8`) times
activations quantized per token on the fly, multiplied in int8 with int32 accumulation (``torch._int_mm``).

Why: the weight-only kernel (``aten._weight_int8pack_mm``) converts every weight to bf16 and multiplies row by
row, so its cost grows with the rows: on this project's 2-core AMD EPYC (one thread, cache-warm) a 6144x1024
weight takes 0.32 ms at 1 row, 1.3 ms at 8 and 2.9 ms at 16, where ``_int_mm`` takes 0.44-0.68 ms at 8 and
0.72-0.92 ms at 16 (0.26 ms at 1 row, cache-warm: no faster than weight-only there, where both should wait on
memory). So the int8 product runs from ``W8A8_MIN_ROWS`` rows up: a batched decode step, Qwen3-TTS's code
predictor's passes over every running stream. Below it the weight-only kernel runs, with the same weights.

The price is the activations' rounding: symmetric int8 per token (one scale per row of ``x``, its largest
magnitude over 127), an error the weight-only scheme does not have; ``bench quant --stage tts-talker`` measures
what it does to the codes. The weights keep their ``[N, K]`` layout (``_int_mm`` takes their transpose as a view).
"""

from __future__ import annotations

import torch
from torch import nn

from omnistage.layers.quant.int8 import INT8_MAX

# The rows from which the int8 product beats the weight-only kernel on CPU (measured above: 4 rows about even).
W8A8_MIN_ROWS = 4
# The layers' flag (a plain attribute of each quantized linear, stacked with its weights by FusedRows).
FLAG = "dynamic_input_scale"


def w8a8_linear(rows: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``rows [M, K]`` (float) x ``q [N, K]`` int8 with per-row ``scale [N]`` -> ``[M, N]`` float32."""
    x = rows.float()
    x_scale = x.abs().amax(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny) / INT8_MAX
    xq = torch.round(x / x_scale).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    return torch._int_mm(xq, q.t()).float().mul_(x_scale).mul_(scale.float())


def mark_dynamic_inputs_(linears: list[nn.Linear]) -> None:
    """Lets these (int8-quantized) linears run W8A8 from ``W8A8_MIN_ROWS`` rows up."""
    for linear in linears:
        if linear.weight.dtype != torch.int8:
            raise TypeError(f"W8A8 needs int8 weights first, not {linear.weight.dtype}")
        setattr(linear, FLAG, True)
