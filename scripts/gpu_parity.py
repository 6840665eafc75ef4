"""Kernel parity for scripts/gpu_check.py: each Triton kernel against the torch path it replaces, without pytest.

On CUDA in bf16 at the real widths (thinker and talker experts, their attention heads, an int8 projection):
the first time these kernels run in bf16 anywhere (Triton's interpreter cannot compute a bf16 ``tl.dot``).
Elsewhere in fp32 at toy widths, interpreted (``TRITON_INTERPRET=1``), to check the script itself.
A case holds when ``|got - want| <= atol + rtol * |want|`` everywhere (``torch.testing.assert_close``'s rule).
"""

from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn.functional as F

from tests.layers.moe_reference import random_experts, random_routing
from tests.layers.paged_cases import dense_attention, make_case

BF16_TOL = (2e-2, 2e-2)  # bf16 inputs, fp32 accumulation
FP32_TOL = (1e-4, 1e-4)


def _compare(name: str, got: torch.Tensor, want: torch.Tensor, tol: tuple[float, float]) -> dict:
    got, want = got.float().cpu(), want.float().cpu()
    err = (got - want).abs()
    atol, rtol = tol
    ok = bool(torch.isfinite(got).all() and (err <= atol + rtol * want.abs()).all())
    row = {"case": name, "max_abs_err": float(err.max()), "max_abs_want": float(want.abs().max()), "ok": ok}
    print(f"  {name}: max |err| {row['max_abs_err']:.3g} (max |want| {row['max_abs_want']:.3g}) "
          f"-> {'OK' if ok else 'FAIL'}", flush=True)
    return row


@lru_cache(maxsize=2)
def _experts(experts: int, hidden: int, inner: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One draw per shape: at the thinker's widths a draw is 0.9 G values made on the CPU (seconds)."""
    return random_experts(experts, hidden, inner, seed=0)


def moe_case(name: str, device: str, dtype: torch.dtype, tokens: int, experts: int, hidden: int, inner: int,
             top_k: int, tol: tuple[float, float]) -> dict:
    from omnistage.layers import fused_moe_triton
    from omnistage.layers.moe_torch import experts_sorted

    gate_up, down = _experts(experts, hidden, inner)
    x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(tokens))
    ids, weights = random_routing(tokens, experts, top_k, seed=tokens)
    dev = {"x": x, "gate_up": gate_up, "down": down}
    dev = {k: v.to(device, dtype) for k, v in dev.items()}
    got = fused_moe_triton.fused_experts(dev["x"], ids.to(device), weights.to(device, dtype), dev["gate_up"],
                                         dev["down"], F.silu)
    # The reference: the torch path in fp32 on the same (rounded) inputs.
    want = experts_sorted(dev["x"].float().cpu(), ids, weights.to(dtype).float(), dev["gate_up"].float().cpu(),
                          dev["down"].float().cpu(), F.silu)
    return _compare(name, got, want, tol)


def attention_case(name: str, device: str, dtype: torch.dtype, batch: list[tuple[int, int]], heads: int,
                   kv_heads: int, head_dim: int, tol: tuple[float, float]) -> dict:
    from omnistage.layers.attention.triton_paged import TritonPagedBackend

    case = make_case(batch, page=16, heads=heads, kv_heads=kv_heads, head_dim=head_dim, seed=3)
    for attr in ("q", "k", "v", "kv_cache"):  # the reference sees the same rounded inputs
        setattr(case, attr, getattr(case, attr).to(dtype).to(torch.float32))
    scale = head_dim**-0.5
    want = dense_attention(case, scale)
    moved = {attr: getattr(case, attr).to(device, dtype) for attr in ("q", "k", "v", "kv_cache")}
    meta = case.meta
    meta_dev = type(meta)(meta.query_start_loc.to(device), meta.context_lens.to(device),
                          meta.slot_mapping.to(device), meta.block_tables.to(device), meta.query_lens,
                          meta.context_lens_cpu)
    got = TritonPagedBackend().forward(moved["q"], moved["k"], moved["v"], moved["kv_cache"], meta_dev, scale)
    return _compare(name, got, want, tol)


def int8_case(name: str, device: str, dtype: torch.dtype, rows: int, n: int, k: int,
              tol: tuple[float, float]) -> dict:
    from omnistage.layers.quant.int8 import dequantize_rows, quantize_rows, scale_dtype
    from omnistage.layers.quant.int8_triton import w8_linear

    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(n, k, generator=gen) * k**-0.5
    q, scale = quantize_rows(weight, scale_dtype(torch.device(device), dtype))
    x = torch.randn(rows, k, generator=gen).to(dtype)
    got = w8_linear(x.to(device), q.to(device), scale.to(device))
    want = x.float() @ dequantize_rows(q, scale).t()
    return _compare(name, got, want, tol)


def run(device: str) -> dict:
    """All cases: bf16 at real widths on CUDA, fp32 at toy widths elsewhere."""
    decode = [(1, 1), (16, 1), (17, 1), (40, 1)]
    mixed = [(20, 20), (33, 1), (40, 9), (2, 1)]
    if device.startswith("cuda"):
        dt, tol = torch.bfloat16, BF16_TOL
        cases = [
            lambda: moe_case("moe thinker 1 token", device, dt, 1, 128, 2048, 768, 8, tol),
            lambda: moe_case("moe thinker 16 tokens", device, dt, 16, 128, 2048, 768, 8, tol),
            lambda: moe_case("moe thinker 300 tokens", device, dt, 300, 128, 2048, 768, 8, tol),
            lambda: moe_case("moe talker 16 tokens", device, dt, 16, 128, 1024, 384, 6, tol),
            lambda: attention_case("attention thinker decode", device, dt, decode, 32, 4, 128, (3e-2, 3e-2)),
            lambda: attention_case("attention thinker mixed", device, dt, mixed, 32, 4, 128, (3e-2, 3e-2)),
            lambda: attention_case("attention talker decode", device, dt, decode, 16, 2, 128, (3e-2, 3e-2)),
            lambda: int8_case("int8 linear 16x2048->6144", device, dt, 16, 6144, 2048, tol),
        ]
    else:
        dt, tol = torch.float32, FP32_TOL
        cases = [
            lambda: moe_case("moe 7 tokens (toy)", device, dt, 7, 16, 40, 20, 4, tol),
            lambda: attention_case("attention decode (toy)", device, dt, decode, 4, 2, 24, tol),
            lambda: attention_case("attention mixed (toy)", device, dt, mixed, 8, 1, 24, tol),
            lambda: int8_case("int8 linear (toy)", device, dt, 5, 48, 64, tol),
        ]
    rows = [case() for case in cases]
    failed = [r["case"] for r in rows if not r["ok"]]
    return {"dtype": str(dt).removeprefix("torch."), "cases": rows, "ok": not failed,
            "error": f"parity fails: {', '.join(failed)}" if failed else ""}
