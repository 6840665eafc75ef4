"""Mixture-of-experts feed-forward: top-k router, fused expert weights, optional shared expert.

Expert weights are stored fused, as the checkpoint stores them:
``gate_up_proj [E, 2I, H]`` (gate rows first, then up rows) and ``down_proj
[E, H, I]``. Each step reads each *active* expert's weights once and copies
none: on CUDA with Triton one fused kernel over all experts
(:mod:`omnistage.layers.fused_moe_triton`: no host sync, CUDA-graph capturable),
elsewhere one matmul per active expert on a view of its weights
(:mod:`omnistage.layers.moe_torch`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.layers import fused_moe_triton
from omnistage.layers.linear import GatedMLP, activation
from omnistage.layers.moe_torch import experts_sorted
from omnistage.layers.parallel import UNSHARDED, ShardSpec, TensorParallel


class TopKRouter(nn.Module):
    """softmax over experts (float32) -> top-k -> optional renormalisation of the k weights."""

    def __init__(self, hidden_size: int, num_experts: int, top_k: int, norm_topk_prob: bool) -> None:
        super().__init__()
        if not 0 < top_k <= num_experts:
            raise ValueError(f"top_k={top_k} must be in 1..num_experts={num_experts}")
        self.top_k = top_k
        self.norm_topk_prob = norm_topk_prob
        self.weight = nn.Parameter(torch.zeros(num_experts, hidden_size))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x ``[T, H]`` -> (weights ``[T, k]`` in x's dtype, expert ids ``[T, k]``)."""
        logits = F.linear(x, self.weight)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(logits.dtype), ids


class FusedExperts(nn.Module):
    """All experts of a layer in two fused tensors. Under tensor parallelism each rank holds every expert's
    share of the intermediate dimension (``gate_up`` rows and ``down`` columns): its output is a partial sum.
    Quantized (:mod:`omnistage.layers.quant`), both tensors hold 1-byte values and ``gate_up_proj_scale [E, 2I]``,
    ``down_proj_scale [E, H]`` one scale per row; ``None`` otherwise."""

    gate_up_proj_scale: torch.Tensor | None
    down_proj_scale: torch.Tensor | None

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, hidden_act: str = "silu",
                 tp: TensorParallel = UNSHARDED) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.tp = tp
        local = tp.split(intermediate_size, "moe_intermediate_size")
        # torch.empty: every value is overwritten by the checkpoint; no point initialising.
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * local, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, local))
        self.register_buffer("gate_up_proj_scale", None)
        self.register_buffer("down_proj_scale", None)
        self.act = activation(hidden_act)

    def forward(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """x ``[T, H]``, ids/weights ``[T, k]`` -> ``sum_k weight * expert(x)`` ``[T, H]`` (this rank's part)."""
        scales = (self.gate_up_proj_scale, self.down_proj_scale)
        if x.is_cuda and fused_moe_triton.AVAILABLE:
            return fused_moe_triton.fused_experts(x, ids, weights, self.gate_up_proj, self.down_proj, self.act,
                                                  *scales)
        return experts_sorted(x, ids, weights, self.gate_up_proj, self.down_proj, self.act, *scales)

    def tp_shards(self) -> dict[str, ShardSpec]:
        shards = {"gate_up_proj": self.tp.columns(blocks=2, dim=1), "down_proj": self.tp.rows(dim=2)}
        if self.gate_up_proj_scale is not None:
            shards["gate_up_proj_scale"] = self.tp.columns(blocks=2, dim=1)
        return shards


class SparseMoeBlock(nn.Module):
    """Router + experts, plus (talker) a shared expert scaled by ``sigmoid(shared_expert_gate(x))``.

    Submodule names (gate, experts, shared_expert, shared_expert_gate) are the checkpoint's.
    """

    def __init__(
        self,
        hidden_size: int,
        num_experts: int,
        top_k: int,
        intermediate_size: int,
        norm_topk_prob: bool,
        hidden_act: str = "silu",
        shared_expert_intermediate_size: int = 0,
        tp: TensorParallel = UNSHARDED,
    ) -> None:
        super().__init__()
        self.tp = tp
        # The router is replicated: every rank routes the same (all-reduced, identical) hidden states alike.
        self.gate = TopKRouter(hidden_size, num_experts, top_k, norm_topk_prob)
        self.experts = FusedExperts(num_experts, hidden_size, intermediate_size, hidden_act, tp)
        self.shared_expert: GatedMLP | None = None
        self.shared_expert_gate: nn.Linear | None = None
        if shared_expert_intermediate_size > 0:
            self.shared_expert = GatedMLP(hidden_size, shared_expert_intermediate_size, hidden_act, tp)
            self.shared_expert_gate = nn.Linear(hidden_size, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.gate(x)
        out = self.experts(x, ids, weights)
        if self.shared_expert is not None:
            # Both parts are this rank's partial sums (the gate is a per-token factor): one all-reduce for both.
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert.partial(x)
        return self.tp.all_reduce(out)
