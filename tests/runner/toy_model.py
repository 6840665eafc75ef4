"""A tiny llama-like model on the paged-attention backend, for runner and engine tests.

It follows the stage contract of ``omnistage.runner.base``: ``forward(ids,
positions, inputs_embeds)`` reading attention from the forward context,
``compute_logits``, ``kv_cache_spec``, ``embed_tokens``. ``ToyTalker`` adds
the talker's residual-code prediction and frame embedding.
"""

from __future__ import annotations

import torch
from torch import nn

from omnistage.layers.attention.context import get_forward_context


def _rotate(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Plain RoPE over x ``[T, H, D]``; M-RoPE positions ``[3, T]`` use their temporal row."""
    if positions.dim() == 2:
        positions = positions[0]
    half = x.shape[-1] // 2
    freqs = 1.0 / (10000 ** (torch.arange(half, dtype=torch.float64, device=x.device) / half))
    angles = positions.double()[:, None] * freqs[None, :]
    cos, sin = angles.cos().to(x.dtype)[:, None], angles.sin().to(x.dtype)[:, None]
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


class ToyLayer(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, idx: int) -> None:
        super().__init__()
        self.idx, self.heads, self.kv_heads, self.head_dim = idx, heads, kv_heads, head_dim
        self.qkv = nn.Linear(hidden, (heads + 2 * kv_heads) * head_dim, bias=False)
        self.o = nn.Linear(heads * head_dim, hidden, bias=False)
        self.norm1, self.norm2 = nn.RMSNorm(hidden), nn.RMSNorm(hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.SiLU(), nn.Linear(4 * hidden, hidden))

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        t, d = x.shape[0], self.head_dim
        q, k, v = self.qkv(self.norm1(x)).split([self.heads * d, self.kv_heads * d, self.kv_heads * d], dim=-1)
        q = _rotate(q.view(t, self.heads, d), positions)
        k = _rotate(k.view(t, self.kv_heads, d), positions)
        ctx = get_forward_context()
        out = ctx.backend.forward(q, k, v.reshape(t, self.kv_heads, d), ctx.kv_cache(self.idx), ctx.meta, d**-0.5)
        x = x + self.o(out.reshape(t, -1))
        return x + self.mlp(self.norm2(x))


class ToyLM(nn.Module):
    def __init__(self, vocab: int = 97, hidden: int = 32, layers: int = 2, heads: int = 4, kv_heads: int = 2,
                 seed: int = 0, mrope: bool = False) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.uses_mrope = mrope
        self.head_dim = hidden // heads
        self.kv_heads = kv_heads
        self.embed = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(ToyLayer(hidden, heads, kv_heads, self.head_dim, i) for i in range(layers))
        self.norm = nn.RMSNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)
        with torch.no_grad():  # large logits: sampled tokens depend visibly on the context
            self.head.weight.mul_(8.0)
        self.eval().requires_grad_(False)

    def kv_cache_spec(self) -> tuple[int, int, int]:
        return len(self.layers), self.kv_heads, self.head_dim

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed(input_ids)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        x = self.embed(input_ids) if inputs_embeds is None else inputs_embeds
        for layer in self.layers:
            x = layer(x, positions)
        return self.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.head(hidden)


class ToyTalker(ToyLM):
    """Codebook 0 from the LM head; ``groups - 1`` residual codebooks from small heads."""

    def __init__(self, vocab: int = 48, codebook: int = 16, groups: int = 4, **kwargs: int) -> None:
        super().__init__(vocab=vocab, **kwargs)
        hidden = self.embed.embedding_dim
        self.residual_embeds = nn.ModuleList(nn.Embedding(codebook, hidden) for _ in range(groups - 1))
        self.residual_heads = nn.ModuleList(nn.Linear(hidden, codebook, bias=False) for _ in range(groups - 1))
        self.num_code_groups, self.residual_vocab_size = groups, codebook
        self.eval().requires_grad_(False)

    def predict_residual_codes(self, hidden_last: torch.Tensor, code0: torch.Tensor, sampler) -> torch.Tensor:
        codes = [code0]
        h = hidden_last + self.embed(code0)
        for step, (head, emb) in enumerate(zip(self.residual_heads, self.residual_embeds)):
            code = sampler.sample(head(h), step)
            codes.append(code)
            h = h + emb(code)
        return torch.stack(codes, dim=1)

    def frame_embedding(self, codes: torch.Tensor) -> torch.Tensor:
        out = self.embed(codes[:, 0])
        for g, emb in enumerate(self.residual_embeds):
            out = out + emb(codes[:, g + 1])
        return out
