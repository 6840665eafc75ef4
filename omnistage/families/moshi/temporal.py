"""Moshi's temporal transformer: one position per 80 ms frame, the text "inner monologue" head on top.

Parameter names are transformers' (``decoder.model.layers...``); the loader maps Kyutai's layout onto them.
Attention reads and writes a :class:`RingCache`, so a session's KV stays within Moshi's window however long it
talks. The step's input embedding is :class:`omnistage.families.moshi.model.MoshiLM`'s.
"""

from __future__ import annotations

import torch
from torch import nn

from omnistage.families.moshi.config import MoshiConfig
from omnistage.families.moshi.ring_cache import RingCache


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * self.weight.float()).type_as(x)


def gated(h: torch.Tensor) -> torch.Tensor:
    """Moshi's gating: the first projection's halves, SiLU of the first times the second."""
    h = h.view(*h.shape[:-1], 2, -1)
    return nn.functional.silu(h[..., 0, :]) * h[..., 1, :]


class Rotary(nn.Module):
    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        self.register_buffer("inv_freq", inv, persistent=False)

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """``x`` [B, H, T, D] rotated at positions ``pos`` [B, T] (rotate-half, transformers' convention)."""
        freqs = pos[..., None].float() * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)[:, None]
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin


class Linear(nn.Module):
    """A bias-free projection under transformers' ``MoshiLinear`` name (``<proj>.linear.weight``)."""

    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__()
        self.linear = nn.Linear(d_in, d_out, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


class Attention(nn.Module):
    def __init__(self, cfg: MoshiConfig) -> None:
        super().__init__()
        hd = cfg.head_dim
        self.q_proj = Linear(cfg.hidden_size, cfg.num_heads * hd)
        self.k_proj = Linear(cfg.hidden_size, cfg.num_kv_heads * hd)
        self.v_proj = Linear(cfg.hidden_size, cfg.num_kv_heads * hd)
        self.o_proj = Linear(cfg.num_heads * hd, cfg.hidden_size)
        self.head_dim = hd


class Mlp(nn.Module):
    def __init__(self, dim: int, ffn_dim: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, ffn_dim, bias=False)
        self.fc2 = nn.Linear(ffn_dim // 2, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(gated(self.fc1(x)))


class Layer(nn.Module):
    def __init__(self, cfg: MoshiConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = Mlp(cfg.hidden_size, cfg.ffn_dim)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class TextModel(nn.Module):
    def __init__(self, cfg: MoshiConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size + 1, cfg.hidden_size)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Decoder(nn.Module):
    """transformers' ``MoshiForCausalLM`` (``decoder.model...``, ``decoder.lm_head``) and its cached passes."""

    def __init__(self, cfg: MoshiConfig) -> None:
        super().__init__()
        self.model = TextModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.rotary = Rotary(cfg.head_dim, cfg.rope_theta)

    def step(self, x: torch.Tensor, pos: torch.Tensor, cache: RingCache) -> torch.Tensor:
        """One position for each of rows ``0..B-1`` (``x`` [B, 1, H]); the normed last hidden state."""
        layers, span = self.model.layers, cache.span(pos)
        for i, layer in enumerate(layers):
            q, k, v = self._qkv(layer, x, pos[:, None])
            a = cache.step(i, q, k, v, pos, last_layer=i == len(layers) - 1, span=span)
            x = self._finish(layer, x, a)
        return self.model.norm(x)

    def prefill(self, x: torch.Tensor, row: int, start: int, cache: RingCache) -> torch.Tensor:
        """``T`` positions of one session at once (``x`` [1, T, H]), the prompt's path."""
        pos = torch.arange(start, start + x.shape[1], device=x.device)[None]
        layers = self.model.layers
        for i, layer in enumerate(layers):
            q, k, v = self._qkv(layer, x, pos)
            a = cache.prefill(i, row, q, k, v, start, last_layer=i == len(layers) - 1)
            x = self._finish(layer, x, a)
        return self.model.norm(x)

    def text_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def _qkv(self, layer: Layer, x: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, ...]:
        attn = layer.self_attn
        h = layer.input_layernorm(x)
        b, t, _ = h.shape
        q = attn.q_proj(h).view(b, t, -1, attn.head_dim).transpose(1, 2)
        k = attn.k_proj(h).view(b, t, -1, attn.head_dim).transpose(1, 2)
        v = attn.v_proj(h).view(b, t, -1, attn.head_dim).transpose(1, 2)
        return self.rotary(q, pos), self.rotary(k, pos), v

    @staticmethod
    def _finish(layer: Layer, x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        b, _, t, _ = a.shape
        x = x + layer.self_attn.o_proj(a.transpose(1, 2).reshape(b, t, -1))
        return x + layer.mlp(layer.post_attention_layernorm(x))
