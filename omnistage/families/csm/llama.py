"""The Llama stack CSM runs twice (backbone and depth decoder), named as transformers' ``CsmDecoderLayer``.

Three ways through it, each with its own keys/values:
- ``forward``: one sequence's new positions ``[1, T, H]`` continuing its :class:`SequenceCache` (a prompt);
- ``step``: one new position for each of ``B`` sequences ``[B, 1, H]``, each continuing its own cache (the
  backbone's decode: every weight read once per step, attention over each sequence's own keys);
- ``lockstep``: ``B`` sequences all at the same positions ``[B, T, H]``, sharing one :class:`LockstepCache`
  (the depth decoder: every utterance's frame walks its 32 codebooks together).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.families.csm.config import LlamaShape
from omnistage.layers.linear import FusedRows, GatedMLP
from omnistage.layers.norm import RMSNorm
from omnistage.layers.rotary import rotate_half
from omnistage.models.sequence_cache import SequenceCache


class LockstepCache(SequenceCache):
    """``B`` sequences' keys/values per layer ``[B, kv_heads, T, head_dim]``, all of one length."""


class Attention(nn.Module):
    def __init__(self, shape: LlamaShape) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = shape.num_attention_heads, shape.num_key_value_heads, shape.head_dim
        q_dim, kv_dim = self.heads * self.head_dim, self.kv_heads * self.head_dim
        self.q_proj = nn.Linear(shape.hidden_size, q_dim, bias=False)
        self.k_proj = nn.Linear(shape.hidden_size, kv_dim, bias=False)
        self.v_proj = nn.Linear(shape.hidden_size, kv_dim, bias=False)
        self.o_proj = nn.Linear(q_dim, shape.hidden_size, bias=False)
        self.qkv = FusedRows(self.q_proj, self.k_proj, self.v_proj)  # one matmul: decode is call-bound
        self.out = FusedRows(self.o_proj)  # a quantized o_proj's matmul (plain or int8)

    def quantizable_linears(self) -> list[nn.Linear]:
        return [self.q_proj, self.k_proj, self.v_proj, self.o_proj]

    def _qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        batch, length, _ = x.shape
        q, k, v = self.qkv(x)
        q = q.view(batch, length, self.heads, self.head_dim).transpose(1, 2)
        k, v = (t.view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2) for t in (k, v))
        q, k = (t * cos + rotate_half(t) * sin for t in (q, k))
        return q, k, v

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=self.head_dim**-0.5,
                                              enable_gqa=self.kv_heads != self.heads)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: SequenceCache,
                layer: int, past: int) -> torch.Tensor:
        """New positions of one sequence (or of ``B`` in lockstep) after the ``past`` ones ``cache`` holds."""
        q, k, v = self._qkv(x, cos, sin)
        k, v = cache.extend(layer, k, v)
        length = q.shape[2]
        if past and length > 1:  # causal over the new positions, every cached one visible
            mask = torch.ones(length, past + length, dtype=torch.bool, device=x.device).tril(past)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.head_dim**-0.5,
                                                 enable_gqa=self.kv_heads != self.heads)
        else:
            out = self._attend(q, k, v, causal=length > 1)
        return self.out.joint(out.transpose(1, 2).reshape(x.shape[0], length, -1))

    def step(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, caches: list[SequenceCache],
             layer: int) -> torch.Tensor:
        """One new position for each of ``B`` sequences (``cos``/``sin`` ``[B, 1, 1, d]``)."""
        q, k, v = self._qkv(x, cos, sin)
        rows = []
        for i, cache in enumerate(caches):
            keys, values = cache.extend(layer, k[i:i + 1], v[i:i + 1])
            rows.append(self._attend(q[i:i + 1], keys, values, causal=False))
        return self.out.joint(torch.cat(rows).transpose(1, 2).reshape(x.shape[0], 1, -1))


class DecoderLayer(nn.Module):
    def __init__(self, shape: LlamaShape) -> None:
        super().__init__()
        self.self_attn = Attention(shape)
        self.mlp = GatedMLP(shape.hidden_size, shape.intermediate_size, shape.hidden_act)
        self.input_layernorm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: SequenceCache,
                layer: int, past: int) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, layer, past)
        return x + self.mlp(self.post_attention_layernorm(x))

    def step(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, caches: list[SequenceCache],
             layer: int) -> torch.Tensor:
        x = x + self.self_attn.step(self.input_layernorm(x), cos, sin, caches, layer)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaStack(nn.Module):
    """``layers`` and ``norm`` (the owner keeps its embeddings)."""

    def __init__(self, shape: LlamaShape) -> None:
        super().__init__()
        self.shape = shape
        self.layers = nn.ModuleList(DecoderLayer(shape) for _ in range(shape.num_hidden_layers))
        self.norm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.register_buffer("inv_freq", shape.rope.inv_freq(shape.head_dim), persistent=False)
        self._table: tuple[torch.Tensor, torch.Tensor] | None = None  # cos/sin of positions 0..n-1

    def rotary(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin ``[..., head_dim]`` of ``positions``, looked up in a table grown on demand (computed in fp32)."""
        table = self._table
        need = int(positions.max()) + 1 if positions.numel() else 0
        if table is None or table[0].shape[0] < need or table[0].dtype != dtype:
            size = max(need, 64 if table is None else 2 * table[0].shape[0])
            angles = torch.arange(size, device=positions.device).float()[:, None] * self.inv_freq.float()
            angles = torch.cat((angles, angles), dim=-1)
            table = self._table = (angles.cos().to(dtype), angles.sin().to(dtype))
        return table[0][positions], table[1][positions]

    def forward(self, embeds: torch.Tensor, cache: SequenceCache) -> torch.Tensor:
        """``[B, T, H]`` new positions after ``cache`` (one sequence, or ``B`` in lockstep) -> normed states."""
        past = cache.length
        cos, sin = self.rotary(torch.arange(past, past + embeds.shape[1], device=embeds.device), embeds.dtype)
        x = embeds
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, cache, i, past)
        return self.norm(x)

    def step(self, embeds: torch.Tensor, caches: list[SequenceCache]) -> torch.Tensor:
        """``[B, 1, H]``: one new position per sequence, each continuing its own cache."""
        positions = torch.tensor([c.length for c in caches], device=embeds.device)
        cos, sin = (t[:, None, None] for t in self.rotary(positions, embeds.dtype))
        x = embeds
        for i, layer in enumerate(self.layers):
            x = layer.step(x, cos, sin, caches, i)
        return self.norm(x)
