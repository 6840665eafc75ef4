"""Mimi's windowed transformer (``encoder_transformer`` / ``decoder_transformer``): LayerNorm, rotary attention
over the last ``sliding_window`` frames, layer scale, a plain two-layer MLP; no final norm.

Each layer's :class:`KVWindow` in the stream keeps its last ``sliding_window - 1`` keys and values, so a chunk's
frames attend exactly as in a whole pass (transformers keeps a whole cache and masks it to the same window).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.layers.linear import activation
from omnistage.layers.rotary import rope_inv_freq, rotate_half
from omnistage.models.codec_transformer import KVWindow, LayerScale, sliding_causal_mask
from omnistage.models.mimi_config import MimiConfig
from omnistage.models.mimi_convs import ConvStream


class WindowAttention(nn.Module):
    def __init__(self, cfg: MimiConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        q_dim, kv_dim, bias = self.heads * self.head_dim, self.kv_heads * self.head_dim, cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, q_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, kv_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, kv_dim, bias=bias)
        self.o_proj = nn.Linear(q_dim, cfg.hidden_size, bias=bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor,
                window: KVWindow) -> torch.Tensor:
        batch, length, _ = x.shape
        q = self.q_proj(x).view(batch, length, self.heads, self.head_dim).transpose(1, 2)
        k, v = (p(x).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
                for p in (self.k_proj, self.v_proj))
        q, k = (t * cos + rotate_half(t) * sin for t in (q, k))
        k, v = window.extend(k, v)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.head_dim**-0.5,
                                             enable_gqa=self.kv_heads != self.heads)
        return self.o_proj(out.transpose(1, 2).reshape(batch, length, -1))


class Mlp(nn.Module):
    def __init__(self, cfg: MimiConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.act = activation(cfg.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class TransformerLayer(nn.Module):
    def __init__(self, cfg: MimiConfig) -> None:
        super().__init__()
        self.self_attn = WindowAttention(cfg)
        self.mlp = Mlp(cfg)
        self.input_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.post_attention_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.self_attn_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)
        self.mlp_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor,
                window: KVWindow) -> torch.Tensor:
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), cos, sin, mask, window))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class WindowTransformer(nn.Module):
    def __init__(self, cfg: MimiConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(TransformerLayer(cfg) for _ in range(cfg.num_hidden_layers))

    def windows(self) -> list[KVWindow]:
        return [KVWindow(self.cfg.sliding_window - 1) for _ in self.layers]

    def forward(self, x: torch.Tensor, state: ConvStream) -> torch.Tensor:
        """``[B, T, hidden]`` continuing ``state`` (its windows and position) -> ``[B, T, hidden]``."""
        cos, sin = self._rope(state.position, x)
        mask = sliding_causal_mask(x.shape[1], self.cfg.sliding_window, x.device, state.windows[0].length)
        for layer, window in zip(self.layers, state.windows):
            x = layer(x, cos, sin, mask, window)
        state.position += x.shape[1]
        return x

    def _rope(self, start: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # In fp32 per call: a buffer would follow the module's dtype and coarsen the frequencies.
        positions = torch.arange(start, start + x.shape[1], device=x.device, dtype=torch.float32)
        angles = positions[:, None] * rope_inv_freq(self.cfg.head_dim, self.cfg.rope_theta).to(x.device)
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos().to(x.dtype), angles.sin().to(x.dtype)
