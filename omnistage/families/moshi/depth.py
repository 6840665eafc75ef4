"""Moshi's depth transformer: a frame's codes one after another, each step with its own weights.

Step 0 reads the frame's text token, step k its code k-1; every step adds its own projection of the temporal
transformer's state, runs the layers with that step's weights (no positions: the step index picks the weights)
and scores codebook k with its own head. Parameter names are transformers' ``MoshiDepthDecoder``'s (stacked
``[steps, out, in]`` tensors); PersonaPlex's 16 steps predict the user's codes after the agent's, which a
duplex session does not need: :meth:`Depth.codes` runs only the steps asked for (later steps never change
earlier ones).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from omnistage.families.moshi.config import MoshiConfig
from omnistage.families.moshi.temporal import RMSNorm, gated


class StepLinear(nn.Module):
    """One weight per step (transformers' ``MoshiFlexibleLinear``)."""

    def __init__(self, steps: int, d_in: int, d_out: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(steps, d_out, d_in))

    def forward(self, x: torch.Tensor, step: int) -> torch.Tensor:
        return nn.functional.linear(x, self.weight[step])


class StepProj(nn.Module):
    """``<proj>.linear.weight`` as transformers names a per-step attention projection."""

    def __init__(self, steps: int, d_in: int, d_out: int) -> None:
        super().__init__()
        self.linear = StepLinear(steps, d_in, d_out)

    def forward(self, x: torch.Tensor, step: int) -> torch.Tensor:
        return self.linear(x, step)


class DepthAttention(nn.Module):
    def __init__(self, steps: int, dim: int, heads: int) -> None:
        super().__init__()
        self.q_proj, self.k_proj = StepProj(steps, dim, dim), StepProj(steps, dim, dim)
        self.v_proj, self.o_proj = StepProj(steps, dim, dim), StepProj(steps, dim, dim)
        self.heads = heads


class DepthMlp(nn.Module):
    def __init__(self, steps: int, dim: int, ffn_dim: int) -> None:
        super().__init__()
        self.fc1 = StepLinear(steps, dim, ffn_dim)
        self.fc2 = StepLinear(steps, ffn_dim // 2, dim)


class DepthLayer(nn.Module):
    def __init__(self, cfg: MoshiConfig) -> None:
        super().__init__()
        d = cfg.depth
        self.self_attn = DepthAttention(d.steps, d.hidden_size, d.num_heads)
        self.mlp = DepthMlp(d.steps, d.hidden_size, d.ffn_dim)
        self.input_layernorm = RMSNorm(d.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(d.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, step: int, past: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """``x`` [B, Hd] at ``step``; ``past``: this layer's keys and values of the earlier steps (appended)."""
        attn = self.self_attn
        h = self.input_layernorm(x)
        b, heads = h.shape[0], attn.heads
        q = attn.q_proj(h, step).view(b, heads, 1, -1)
        past.append((attn.k_proj(h, step).view(b, heads, 1, -1), attn.v_proj(h, step).view(b, heads, 1, -1)))
        keys = torch.cat([k for k, _ in past], dim=2)
        values = torch.cat([v for _, v in past], dim=2)
        weights = torch.softmax((q @ keys.transpose(2, 3)) / math.sqrt(q.shape[-1]), dim=-1, dtype=torch.float32)
        x = x + attn.o_proj((weights.to(q.dtype) @ values).reshape(b, -1), step)
        h = self.post_attention_layernorm(x)
        return x + self.mlp.fc2(gated(self.mlp.fc1(h, step)), step)


class Depth(nn.Module):
    def __init__(self, cfg: MoshiConfig) -> None:
        super().__init__()
        d = cfg.depth
        self.text_embed_tokens = nn.Embedding(cfg.vocab_size + 1, d.hidden_size)
        self.embed_tokens = nn.ModuleList(nn.Embedding(cfg.audio_vocab_size + 1, d.hidden_size)
                                          for _ in range(d.steps - 1))
        self.input_projections = StepLinear(d.steps, cfg.hidden_size, d.hidden_size)
        self.layers = nn.ModuleList(DepthLayer(cfg) for _ in range(d.num_layers))
        self.lm_heads = StepLinear(d.steps, d.hidden_size, cfg.audio_vocab_size)

    def codes(self, hidden: torch.Tensor, text: torch.Tensor, steps: int,
              choose: object) -> torch.Tensor:
        """``steps`` codes per row [B, steps] from the temporal state ``hidden`` [B, H] and the frame's text
        token ``text`` [B]; ``choose(logits [B, V], step) -> [B]`` picks each code (greedy or sampled)."""
        past: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in self.layers]
        token, out = text, []
        for step in range(steps):
            table = self.text_embed_tokens if step == 0 else self.embed_tokens[step - 1]
            x = table(token) + self.input_projections(hidden, step)
            for layer, layer_past in zip(self.layers, past):
                x = layer(x, step, layer_past)
            token = choose(self.lm_heads(x, step), step)  # type: ignore[operator]
            out.append(token)
        return torch.stack(out, dim=1)
