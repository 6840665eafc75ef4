"""Mixture-of-experts feed-forward: top-k router, fused expert weights, optional shared expert.

Expert weights are stored fused, as the checkpoint stores them:
``gate_up_proj [E, 2I, H]`` (gate rows first, then up rows) and ``down_proj
[E, H, I]``. Two compute paths give the same result:

* grouped: (token, expert) pairs are sorted by expert and each *active* expert
  runs one matmul over its rows. Cost follows the tokens; needs one host sync to
  learn the group sizes. Used for prefill-sized batches.
* gathered: each pair gathers its expert's weights and one batched matmul runs
  them all. No host sync (CUDA-graph friendly), but it reads ``T * top_k``
  weight slabs, so it is used only while that is no more than reading every
  expert once (``T * top_k <= num_experts``): decode of small batches.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.layers.linear import GatedMLP, activation


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
    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, hidden_act: str = "silu") -> None:
        super().__init__()
        self.num_experts = num_experts
        # torch.empty: every value is overwritten by the checkpoint; no point initialising.
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))
        self.act = activation(hidden_act)
        self.gather_max_pairs = num_experts

    def forward(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """x ``[T, H]``, ids/weights ``[T, k]`` -> ``sum_k weight * expert(x)`` ``[T, H]``."""
        if ids.numel() <= self.gather_max_pairs:
            return self.forward_gathered(x, ids, weights)
        return self.forward_grouped(x, ids, weights)

    def forward_grouped(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        top_k = ids.shape[1]
        flat = ids.flatten()
        order = torch.argsort(flat, stable=True)
        token_of_pair = order // top_k
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()  # the one host sync
        rows = x.index_select(0, token_of_pair)
        out = torch.empty_like(rows)
        start = 0
        for expert, n in enumerate(counts):
            if n:
                out[start : start + n] = self._expert(rows[start : start + n], expert)
                start += n
        out = out * weights.flatten()[order, None]
        # Pairs are in expert order, so each token sums its experts in ascending
        # expert id, the reference's order.
        return torch.zeros_like(x).index_add_(0, token_of_pair, out)

    def forward_gathered(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        num_tokens, top_k = ids.shape
        flat = ids.flatten()
        rows = x.repeat_interleave(top_k, dim=0)[:, :, None]  # [P, H, 1]
        gate, up = torch.bmm(self.gate_up_proj[flat], rows)[..., 0].chunk(2, dim=-1)
        hidden = (self.act(gate) * up)[:, :, None]
        out = torch.bmm(self.down_proj[flat], hidden)[..., 0]  # [P, H]
        return (out.view(num_tokens, top_k, -1) * weights[..., None]).sum(dim=1)

    def _expert(self, rows: torch.Tensor, expert: int) -> torch.Tensor:
        gate, up = F.linear(rows, self.gate_up_proj[expert]).chunk(2, dim=-1)
        return F.linear(self.act(gate) * up, self.down_proj[expert])


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
    ) -> None:
        super().__init__()
        self.gate = TopKRouter(hidden_size, num_experts, top_k, norm_topk_prob)
        self.experts = FusedExperts(num_experts, hidden_size, intermediate_size, hidden_act)
        self.shared_expert: GatedMLP | None = None
        self.shared_expert_gate: nn.Linear | None = None
        if shared_expert_intermediate_size > 0:
            self.shared_expert = GatedMLP(hidden_size, shared_expert_intermediate_size, hidden_act)
            self.shared_expert_gate = nn.Linear(hidden_size, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.gate(x)
        out = self.experts(x, ids, weights)
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out
