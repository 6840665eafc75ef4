"""The Qwen2 decoder of Qwen2.5-Omni's thinker and talker, on omnistage's layers and attention backend.

Qwen2 differs from the shared Qwen3 stack (:mod:`omnistage.models.decoder`) in exactly what that stack fixes:
q/k/v carry biases while o_proj has none, there is no per-head q/k RMSNorm, and M-RoPE's sections are
consecutive (frequencies ``[0, t)`` read the temporal position, ``[t, t+h)`` the height, the rest the width)
rather than interleaved. Everything else is the shared pieces: :class:`FusedRows` for one q/k/v matmul,
:class:`Rotation` in fp32, the backend from the forward context over the paged KV cache, :class:`GatedMLP`,
RMSNorm in fp32. Module names are transformers' (``layers.{i}.self_attn.q_proj``, ``mlp.gate_proj``, ``norm``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from omnistage.layers.attention.context import get_forward_context
from omnistage.layers.linear import FusedRows, GatedMLP
from omnistage.layers.norm import RMSNorm, rms_norm
from omnistage.layers.rotary import RotaryEmbedding, Rotation
from omnistage.models.decoder import KVCacheSpec


@dataclass(frozen=True)
class Qwen2Widths:
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    mrope_section: tuple[int, int, int]
    hidden_act: str = "silu"

    @classmethod
    def from_hf(cls, hf: object) -> Qwen2Widths:
        """From a transformers thinker-text or talker config (head_dim defaults to hidden / heads)."""
        rope = dict(hf.rope_parameters or {})
        if rope.get("rope_type", "default") != "default":
            raise NotImplementedError(f"rope_type {rope.get('rope_type')!r} is not supported (only 'default')")
        if getattr(hf, "use_sliding_window", False):
            raise NotImplementedError("Qwen2.5-Omni with use_sliding_window is not supported")
        head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
        return cls(hf.hidden_size, hf.num_hidden_layers, hf.num_attention_heads, hf.num_key_value_heads, head_dim,
                   hf.intermediate_size, hf.rms_norm_eps, float(rope["rope_theta"]),
                   tuple(rope.get("mrope_section", (16, 24, 24))), getattr(hf, "hidden_act", "silu"))


class SectionedMRope(RotaryEmbedding):
    """M-RoPE with consecutive sections (transformers' Qwen2.5 ``recomposition_frequencies``)."""

    def __init__(self, head_dim: int, theta: float, mrope_section: Sequence[int]) -> None:
        super().__init__(head_dim, theta, mrope_section)
        if sum(mrope_section) != head_dim // 2:
            raise ValueError(f"mrope_section {list(mrope_section)} must sum to head_dim/2={head_dim // 2}")
        self.axis = torch.repeat_interleave(torch.arange(3), torch.tensor(list(mrope_section)))


class Qwen2Attention(nn.Module):
    def __init__(self, cfg: Qwen2Widths, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx, self.head_dim = layer_idx, cfg.head_dim
        self.num_heads, self.num_kv_heads = cfg.num_heads, cfg.num_kv_heads
        self.scale = cfg.head_dim**-0.5
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * cfg.head_dim, bias=True)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=True)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=True)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=False)
        self.qkv = FusedRows(self.q_proj, self.k_proj, self.v_proj)

    def forward(self, x: torch.Tensor, rotation: Rotation) -> torch.Tensor:
        tokens, heads = x.shape[0], self.num_heads + self.num_kv_heads
        qkv = self.qkv.joint(x)
        qk = rotation.apply(qkv[:, :heads * self.head_dim].view(tokens, heads, self.head_dim))
        v = qkv[:, heads * self.head_dim:].view(tokens, self.num_kv_heads, self.head_dim)
        ctx = get_forward_context()
        out = ctx.backend.forward(qk[:, :self.num_heads], qk[:, self.num_heads:], v,
                                  ctx.kv_cache(self.layer_idx), ctx.meta, self.scale, None)
        return self.o_proj(out.reshape(tokens, -1))


class Qwen2Layer(nn.Module):
    def __init__(self, cfg: Qwen2Widths, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = Qwen2Attention(cfg, layer_idx)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, rotation: Rotation) -> torch.Tensor:
        norm1, norm2 = self.input_layernorm, self.post_attention_layernorm
        x = x + self.self_attn(rms_norm(x, norm1.weight, norm1.eps), rotation)
        return x + self.mlp(rms_norm(x, norm2.weight, norm2.eps))


class Qwen2Decoder(nn.Module):
    """``embed_tokens`` + ``layers`` + final ``norm`` over one flattened batch ``[T, H]``, positions ``[3, T]``."""

    def __init__(self, cfg: Qwen2Widths, vocab_size: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Qwen2Layer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = SectionedMRope(cfg.head_dim, cfg.rope_theta, cfg.mrope_section)

    def kv_cache_spec(self) -> KVCacheSpec:
        return KVCacheSpec(self.cfg.num_layers, self.cfg.num_kv_heads, self.cfg.head_dim)

    def forward(self, inputs_embeds: torch.Tensor, positions: torch.Tensor,
                capture_layer: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """-> (normed final hidden ``[T, H]``, transformers' ``hidden_states[capture_layer]`` or None: 0 the
        embeddings, k the output of layer k - 1, ``num_layers`` the normed output)."""
        rotation = Rotation.of(*self.rotary(positions))
        hidden = inputs_embeds
        captured = hidden if capture_layer == 0 else None
        for i, layer in enumerate(self.layers):
            hidden = layer(hidden, rotation)
            if capture_layer == i + 1:
                captured = hidden
        hidden = self.norm(hidden)
        if capture_layer == len(self.layers):
            captured = hidden
        return hidden, captured
