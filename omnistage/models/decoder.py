"""The Qwen3 decoder stack shared by the thinker's text model, the talker and the code predictor.

Each layer: RMSNorm -> attention (per-head q/k RMSNorm, GQA, rotary, the
backend from the forward context) -> residual -> RMSNorm -> dense or MoE MLP
-> residual. The stack works on one flattened batch ``[T, H]``; attention
metadata and KV caches come from :mod:`omnistage.layers.attention.context`, so
``forward`` takes only embeddings and positions (plus deepstack features for
visual rows).

Module names mirror transformers' modules (``layers.{i}.self_attn.q_proj``,
``layers.{i}.mlp.experts.gate_up_proj``, ``norm``); :func:`load_checkpoint`
also reads the hub layout of released checkpoints (other prefixes, one tensor
per expert): :mod:`omnistage.models.decoder_checkpoint`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Protocol

import torch
from torch import nn

from omnistage.layers.attention.context import get_forward_context
from omnistage.layers.linear import FusedRows, GatedMLP
from omnistage.layers.moe import SparseMoeBlock
from omnistage.layers.norm import RMSNorm, rms_norm
from omnistage.layers.parallel import UNSHARDED, ShardSpec, TensorParallel
from omnistage.layers.rotary import RotaryEmbedding, Rotation

if TYPE_CHECKING:
    from transformers import PretrainedConfig


class KVCacheSpec(NamedTuple):
    """What the engine needs to size a model's paged KV cache."""

    num_layers: int
    num_kv_heads: int
    head_dim: int


@dataclass(frozen=True)
class MoeConfig:
    num_experts: int
    top_k: int
    intermediate_size: int
    norm_topk_prob: bool
    shared_expert_intermediate_size: int = 0  # 0: no shared expert


@dataclass(frozen=True)
class DecoderConfig:
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    mrope_section: tuple[int, int, int] | None  # None: 1-D RoPE
    attention_bias: bool = False
    hidden_act: str = "silu"
    moe: MoeConfig | None = None
    sparse_layers: tuple[bool, ...] = ()  # per layer: MoE (True) or dense MLP; empty = all dense
    sliding_windows: tuple[int | None, ...] = ()  # per layer; empty = full attention everywhere

    def is_sparse(self, layer_idx: int) -> bool:
        return bool(self.sparse_layers) and self.sparse_layers[layer_idx]

    def sliding_window(self, layer_idx: int) -> int | None:
        return self.sliding_windows[layer_idx] if self.sliding_windows else None

    def kv_cache_spec(self) -> KVCacheSpec:
        return KVCacheSpec(self.num_layers, self.num_kv_heads, self.head_dim)


def decoder_config(hf: PretrainedConfig, mrope: bool, sparse_layers: Sequence[bool] = ()) -> DecoderConfig:
    """A :class:`DecoderConfig` from a transformers text config; every size comes from ``hf``."""
    rope = dict(hf.rope_parameters or {})
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise NotImplementedError(f"rope_type {rope_type!r} is not supported (only 'default')")
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    section = tuple(rope.get("mrope_section", (24, 20, 20))) if mrope else None
    moe = None
    if any(sparse_layers):
        moe = MoeConfig(
            num_experts=hf.num_experts, top_k=hf.num_experts_per_tok, intermediate_size=hf.moe_intermediate_size,
            norm_topk_prob=bool(hf.norm_topk_prob),
            shared_expert_intermediate_size=getattr(hf, "shared_expert_intermediate_size", 0) or 0,
        )
    return DecoderConfig(
        hidden_size=hf.hidden_size, num_layers=hf.num_hidden_layers, num_heads=hf.num_attention_heads,
        num_kv_heads=hf.num_key_value_heads, head_dim=head_dim, intermediate_size=hf.intermediate_size,
        rms_norm_eps=hf.rms_norm_eps, rope_theta=float(rope["rope_theta"]), mrope_section=section,
        attention_bias=bool(getattr(hf, "attention_bias", False)), hidden_act=getattr(hf, "hidden_act", "silu"),
        moe=moe, sparse_layers=tuple(sparse_layers), sliding_windows=_sliding_windows(hf),
    )


def _sliding_windows(hf: PretrainedConfig) -> tuple[int | None, ...]:
    layer_types = getattr(hf, "layer_types", None)
    if not layer_types or "sliding_attention" not in layer_types:
        return ()
    return tuple(hf.sliding_window if kind == "sliding_attention" else None for kind in layer_types)


class Attention(nn.Module):
    """Under tensor parallelism a rank holds its share of the query and KV heads (q/k/v column parallel) and
    the matching columns of o_proj (row parallel): its output is a partial sum, all-reduced here."""

    def __init__(self, cfg: DecoderConfig, layer_idx: int, tp: TensorParallel = UNSHARDED) -> None:
        super().__init__()
        if cfg.num_heads % cfg.num_kv_heads:
            raise ValueError(f"num_heads={cfg.num_heads} is not a multiple of num_kv_heads={cfg.num_kv_heads}")
        self.layer_idx = layer_idx
        self.head_dim = cfg.head_dim
        self.scale = cfg.head_dim**-0.5
        self.sliding_window = cfg.sliding_window(layer_idx)
        self.tp = tp
        self.heads = tp.heads(cfg.num_heads, cfg.num_kv_heads)
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, self.heads.q * cfg.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.heads.kv * cfg.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.heads.kv * cfg.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads.q * cfg.head_dim, cfg.hidden_size, bias=bias)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.qkv = FusedRows(self.q_proj, self.k_proj, self.v_proj)
        self.qk_norm = HeadNorms((self.q_norm, self.heads.q), (self.k_norm, self.heads.kv))
        self.head_eps = cfg.rms_norm_eps  # q_norm's and k_norm's (a plain attribute: read every layer call)
        self.num_heads, self.num_kv_heads = self.heads.q, self.heads.kv  # this rank's share
        self.o = FusedRows(self.o_proj, use_bias=tp.rank == 0)  # added once, by rank 0, before the all-reduce

    def forward(self, x: torch.Tensor, rotation: Rotation) -> torch.Tensor:
        # Functional calls on the modules' weights, queries and keys normed and rotated together: this runs for
        # every layer of every decode step, where the per-call overhead adds up (the code predictor makes 15
        # passes per frame).
        q, k, v = self.rotated_qkv(self.qkv.joint(x), self.qk_norm.weight(), rotation)
        ctx = get_forward_context()
        out = ctx.backend.forward(q, k, v, ctx.kv_cache(self.layer_idx), ctx.meta, self.scale, self.sliding_window)
        return self.tp.all_reduce(self.o.joint(out.reshape(x.shape[0], -1)))

    def rotated_qkv(self, qkv: torch.Tensor, head_norm: torch.Tensor,
                    rotation: Rotation) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The stacked projection ``[T, (H + 2 Hkv) D]`` -> q ``[T, H, D]`` and k (normed per head with
        ``head_norm``, :meth:`HeadNorms.weight`, and rotated) and v ``[T, Hkv, D]``."""
        num_tokens, heads, dim = qkv.shape[0], self.num_heads + self.num_kv_heads, self.head_dim
        qk = rotation.apply(rms_norm(qkv[:, :heads * dim].view(num_tokens, heads, dim), head_norm, self.head_eps))
        v = qkv[:, heads * dim:].view(num_tokens, self.num_kv_heads, dim)
        return qk[:, :self.num_heads], qk[:, self.num_heads:], v

    def quantizable_linears(self) -> list[nn.Linear]:
        return [self.q_proj, self.k_proj, self.v_proj, self.o_proj]

    def tp_shards(self) -> dict[str, ShardSpec]:
        shards = {"q_proj.weight": self.heads.q_shard, "k_proj.weight": self.heads.kv_shard,
                  "v_proj.weight": self.heads.kv_shard, "o_proj.weight": self.tp.rows()}
        if self.q_proj.bias is not None:
            shards.update({"q_proj.bias": self.heads.q_shard, "k_proj.bias": self.heads.kv_shard,
                           "v_proj.bias": self.heads.kv_shard})
        return shards


class HeadNorms:
    """Per-head RMSNorm weights of several norms side by side (q_norm for the query heads, then k_norm for the key
    heads), so one norm call covers them all: ``[heads, head_dim]``, rebuilt when a weight changes."""

    def __init__(self, *norms: tuple[RMSNorm, int]) -> None:
        if len({norm.eps for norm, _ in norms}) != 1:
            raise ValueError("norms normed together must share their eps")
        self.norms = norms
        self._key: tuple[int, ...] = ()
        self._weight: torch.Tensor | None = None

    def weight(self) -> torch.Tensor:
        # An inference tensor (loaded under inference_mode) keeps no version counter: its storage pointer is the key.
        key = tuple(v for norm, _ in self.norms
                    for v in (norm.weight.data_ptr(), -1 if norm.weight.is_inference() else norm.weight._version))
        if key != self._key or self._weight is None:
            with torch.inference_mode(False), torch.no_grad():
                self._weight = torch.cat([norm.weight.detach().expand(count, -1) for norm, count in self.norms])
            self._key = key
        return self._weight


class DecoderLayer(nn.Module):
    def __init__(self, cfg: DecoderConfig, layer_idx: int, tp: TensorParallel = UNSHARDED) -> None:
        super().__init__()
        self.self_attn = Attention(cfg, layer_idx, tp)
        self.mlp: nn.Module
        if cfg.is_sparse(layer_idx):
            moe = cfg.moe
            self.mlp = SparseMoeBlock(
                cfg.hidden_size, moe.num_experts, moe.top_k, moe.intermediate_size, moe.norm_topk_prob,
                cfg.hidden_act, moe.shared_expert_intermediate_size, tp,
            )
        else:
            self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act, tp)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, rotation: Rotation) -> torch.Tensor:
        norm1, norm2 = self.input_layernorm, self.post_attention_layernorm
        x = x + self.self_attn(rms_norm(x, norm1.weight, norm1.eps), rotation)
        return x + self.mlp(rms_norm(x, norm2.weight, norm2.eps))


@dataclass
class Deepstack:
    """Visual features added to the hidden states after the first ``len(features)`` layers.

    rows: int64 ``[V]``, the rows of the flattened batch that hold visual tokens (ascending).
    features: ``[num_deepstack_layers, V, H]``, row-aligned with ``rows``.
    """

    rows: torch.Tensor
    features: torch.Tensor

    def select(self, start: int, end: int) -> Deepstack | None:
        """The part for batch rows ``[start, end)``, re-based to start at row 0 (a prefill chunk)."""
        keep = (self.rows >= start) & (self.rows < end)
        if not bool(keep.any()):
            return None
        return Deepstack(self.rows[keep] - start, self.features[:, keep])

    @staticmethod
    def concat(parts: Sequence[tuple[int, Deepstack | None]]) -> Deepstack | None:
        """Joins per-sequence parts given as ``(row offset in the batch, part)``."""
        present = [(offset, part) for offset, part in parts if part is not None]
        if not present:
            return None
        rows = torch.cat([part.rows + offset for offset, part in present])
        return Deepstack(rows, torch.cat([part.features for _, part in present], dim=1))


class StepLeader(Protocol):
    """Rank 0 of a tensor-parallel decoder: hands each forward's inputs to the other ranks, then runs it."""

    def run(self, forward: Callable[..., tuple[torch.Tensor, torch.Tensor | None]], inputs_embeds: torch.Tensor,
            positions: torch.Tensor, deepstack: Deepstack | None, capture_layer: int | None,
            rotation: Rotation | None) -> tuple[torch.Tensor, torch.Tensor | None]: ...


class Decoder(nn.Module):
    """``layers`` + final ``norm``; the owners add their embeddings and heads.

    Built for a rank of a tensor-parallel group (``tp``), it holds that rank's shards; rank 0's ``leader`` (set
    by the runner that owns the group) makes every other rank run the same forward.
    """

    def __init__(self, cfg: DecoderConfig, tp: TensorParallel = UNSHARDED) -> None:
        super().__init__()
        self.cfg = cfg
        self.tp = tp
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, tp) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.rope_theta, cfg.mrope_section)
        self.leader: StepLeader | None = None

    def kv_cache_spec(self) -> KVCacheSpec:
        """This rank's KV cache: its share of the KV heads."""
        return KVCacheSpec(self.cfg.num_layers, self.layers[0].self_attn.heads.kv, self.cfg.head_dim)

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        positions: torch.Tensor,
        deepstack: Deepstack | None = None,
        capture_layer: int | None = None,
        rotation: Rotation | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``[T, H]`` embeddings -> (normed final hidden ``[T, H]``, captured hidden or None).

        ``capture_layer`` indexes hidden states as transformers'
        ``output_hidden_states`` does: 0 = the embeddings, k = the output of
        layer k-1 (before that layer's deepstack addition, which transformers
        applies outside the recorded layer), ``num_layers`` = the normed output. ``rotation``: the positions'
        rotary angles when the caller keeps them (:meth:`rotation`), else made here.
        """
        if self.leader is not None:
            return self.leader.run(self.run_layers, inputs_embeds, positions, deepstack, capture_layer, rotation)
        return self.run_layers(inputs_embeds, positions, deepstack, capture_layer, rotation)

    def run_layers(
        self,
        inputs_embeds: torch.Tensor,
        positions: torch.Tensor,
        deepstack: Deepstack | None = None,
        capture_layer: int | None = None,
        rotation: Rotation | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The forward itself (what every rank runs)."""
        num_layers = len(self.layers)
        if capture_layer is not None and not 0 <= capture_layer <= num_layers:
            raise ValueError(f"capture_layer={capture_layer} outside 0..{num_layers}")
        rotation = rotation or self.rotation(positions)
        hidden = inputs_embeds
        captured = hidden if capture_layer == 0 else None
        for i, layer in enumerate(self.layers):
            hidden = layer(hidden, rotation)
            if capture_layer == i + 1 and i + 1 < num_layers:
                captured = hidden
            if deepstack is not None and i < deepstack.features.shape[0]:
                # Out of place: ``captured`` may be this very tensor.
                hidden = hidden.index_add(0, deepstack.rows, deepstack.features[i].to(hidden.dtype))
        hidden = self.norm(hidden)
        if capture_layer == num_layers:
            captured = hidden
        return hidden, captured

    def rotation(self, positions: torch.Tensor) -> Rotation:
        """The rotary angles of ``positions``, in float32: RoPE (like RMSNorm) computes in fp32 whatever the dtype."""
        return Rotation.of(*self.rotary(positions))
