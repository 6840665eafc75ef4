"""The plain definition of the experts, token by token, that every fast MoE path is compared with."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def experts_reference(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, gate_up: torch.Tensor,
                      down: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            gate, up = F.linear(x[t], gate_up[e]).chunk(2)
            out[t] += weights[t, j] * F.linear(F.silu(gate) * up, down[e])
    return out


def random_experts(num_experts: int, hidden: int, inner: int, seed: int = 0,
                   dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    gate_up = torch.randn(num_experts, 2 * inner, hidden, generator=gen) * hidden**-0.5
    down = torch.randn(num_experts, hidden, inner, generator=gen) * inner**-0.5
    return gate_up.to(dtype), down.to(dtype)


def random_routing(num_tokens: int, num_experts: int, top_k: int, seed: int = 0,
                   crowd: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """ids ``[T, k]`` (distinct per token) and normalised weights; ``crowd``: draw from the first few experts only."""
    gen = torch.Generator().manual_seed(seed)
    pool = crowd or num_experts
    ids = torch.stack([torch.randperm(pool, generator=gen)[:top_k] for _ in range(num_tokens)])
    weights = torch.rand(num_tokens, top_k, generator=gen) + 0.1
    return ids, weights / weights.sum(-1, keepdim=True)
