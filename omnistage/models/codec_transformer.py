"""The sliding-window codec transformer shared by Qwen3-Omni's code2wav and Qwen3-TTS's 12 Hz codec decoder.

A causal transformer over frames with layer scale and rotary positions (transformers'
``Qwen3OmniMoeCode2WavTransformerModel``); :class:`KVWindow` keeps a stream's last frames' keys and values so
streamed chunks attend exactly as one whole pass. :class:`Code2WavConfig` is the vocoder's whole shape (the TTS
codec builds one for its transformer).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.layers.norm import RMSNorm

_ACTIVATIONS = {"silu": F.silu, "gelu": F.gelu, "relu": F.relu}


@dataclass(frozen=True)
class Code2WavConfig:
    """The vocoder's shape; defaults are Qwen3-Omni-30B-A3B's. Build with ``from_hf``."""

    codebook_size: int = 2048
    num_quantizers: int = 16
    hidden_size: int = 1024
    num_hidden_layers: int = 8
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    head_dim: int | None = None  # None: hidden_size // num_attention_heads
    intermediate_size: int = 3072
    hidden_act: str = "silu"
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    sliding_window: int = 72
    layer_scale_initial_scale: float = 0.01
    attention_bias: bool = False
    upsampling_ratios: tuple[int, ...] = (2, 2)
    upsample_rates: tuple[int, ...] = (8, 5, 4, 3)
    decoder_dim: int = 1536

    def __post_init__(self) -> None:
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        object.__setattr__(self, "upsampling_ratios", tuple(self.upsampling_ratios))
        object.__setattr__(self, "upsample_rates", tuple(self.upsample_rates))
        self._validate()

    @property
    def samples_per_frame(self) -> int:
        """Output samples of one frame: every upsampling stage's factor."""
        return math.prod(self.upsampling_ratios) * math.prod(self.upsample_rates)

    @property
    def sample_rate(self) -> int:
        return 24000  # fixed by training; config.json does not carry it

    def _validate(self) -> None:
        sizes = ("codebook_size", "num_quantizers", "hidden_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "intermediate_size", "sliding_window", "decoder_dim")
        problems = [f"{name} must be positive" for name in sizes if int(getattr(self, name)) < 1]
        problems += [message for bad, message in (
            (self.num_attention_heads % max(self.num_key_value_heads, 1), "heads must be a multiple of KV heads"),
            (self.head_dim % 2, "head_dim must be even for rotary embeddings"),
            (self.hidden_act not in _ACTIVATIONS, f"hidden_act must be one of {sorted(_ACTIVATIONS)}"),
            (not self.upsample_rates or min(self.upsample_rates + self.upsampling_ratios) < 1, "bad rates"),
            (self.decoder_dim % 2 ** len(self.upsample_rates), "decoder_dim must divide by 2**len(upsample_rates)"),
        ) if bad]
        if problems:
            raise ValueError(f"invalid code2wav config {self}: " + "; ".join(problems))

    @classmethod
    def from_hf(cls, source: Mapping[str, Any] | Any) -> Code2WavConfig:
        """From config.json's ``code2wav_config`` dict or transformers' config object."""
        raw = dict(source) if isinstance(source, Mapping) else source.to_dict()
        # transformers 5 nests rope settings in rope_parameters; 4.x configs keep them at the top.
        rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
        if rope.get("rope_type", rope.get("type", "default")) != "default":
            raise ValueError(f"code2wav supports only default rotary embeddings, got {rope}")
        raw["rope_theta"] = float(rope.get("rope_theta", raw.get("rope_theta", cls.rope_theta)))
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in known and v is not None})


class LayerScale(nn.Module):
    def __init__(self, dim: int, initial: float) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), initial))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: Code2WavConfig) -> None:
        super().__init__()
        self.head_dim = int(cfg.head_dim)
        self.kv_groups = cfg.num_attention_heads // cfg.num_key_value_heads
        q_dim, kv_dim = cfg.num_attention_heads * self.head_dim, cfg.num_key_value_heads * self.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, q_dim, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, kv_dim, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, kv_dim, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(q_dim, cfg.hidden_size, bias=cfg.attention_bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor,
                window: KVWindow | None = None) -> torch.Tensor:
        batch, length, _ = x.shape
        q, k, v = (proj(x).view(batch, length, -1, self.head_dim).transpose(1, 2)
                   for proj in (self.q_proj, self.k_proj, self.v_proj))
        q, k = (t * cos + _rotate_half(t) * sin for t in (q, k))
        if window is not None:  # a stream's earlier frames: attend over them too, keep the newest
            k, v = window.extend(k, v)
        if self.kv_groups > 1:  # KV head h serves query heads h * groups ... (h + 1) * groups - 1
            k, v = (t.repeat_interleave(self.kv_groups, dim=1) for t in (k, v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.head_dim**-0.5)
        return self.o_proj(out.transpose(1, 2).reshape(batch, length, -1))


class Mlp(nn.Module):
    def __init__(self, cfg: Code2WavConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.act = _ACTIVATIONS[cfg.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class TransformerLayer(nn.Module):
    def __init__(self, cfg: Code2WavConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = Mlp(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)
        self.mlp_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor,
                window: KVWindow | None = None) -> torch.Tensor:
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), cos, sin, mask, window))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


@dataclass
class KVWindow:
    """One layer's keys/values ``[B, Hkv, L, D]`` of a stream's last ``size`` frames (the sliding window less
    one), so the next chunk's frames attend exactly as in a whole-utterance pass."""

    size: int
    keys: torch.Tensor | None = None
    values: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.keys is None else self.keys.shape[2]

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The earlier frames' keys/values followed by ``k``/``v``; the newest ``size`` are kept."""
        if self.keys is not None and self.values is not None:
            k, v = torch.cat([self.keys, k], dim=2), torch.cat([self.values, v], dim=2)
        self.keys, self.values = k[:, :, -self.size:], v[:, :, -self.size:]
        return k, v


class PreTransformer(nn.Module):
    """Causal sliding-window transformer over frames; no KV cache (each call sees its whole chunk)."""

    def __init__(self, cfg: Code2WavConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList([TransformerLayer(cfg) for _ in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, windows: list[KVWindow] | None = None, offset: int = 0) -> torch.Tensor:
        """``[B, T, hidden]`` -> ``[B, T, hidden]``. With ``windows`` (one per layer) the frames continue a
        stream at position ``offset``, attending over its earlier frames kept there."""
        length = x.shape[1]
        cos, sin = self._rope(length, x, offset)
        past = windows[0].length if windows else 0
        mask = sliding_causal_mask(length, self.cfg.sliding_window, x.device, past)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, mask, windows[i] if windows else None)
        return self.norm(x)

    def windows(self) -> list[KVWindow]:
        """Empty per-layer windows for a new stream."""
        return [KVWindow(self.cfg.sliding_window - 1) for _ in self.layers]

    def _rope(self, length: int, x: torch.Tensor, offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        # Computed per call in fp32 (not a buffer) so module.to(bf16) cannot coarsen the frequencies; positions
        # start at ``offset`` (0 for a stateless chunk; a stream's frames decoded so far when it carries a cache).
        dim = int(self.cfg.head_dim)
        steps = torch.arange(0, dim, 2, dtype=torch.float32, device=x.device) / dim
        inv_freq = 1.0 / (self.cfg.rope_theta**steps)
        positions = torch.arange(offset, offset + length, device=x.device, dtype=torch.float32)
        freqs = positions[:, None] * inv_freq
        angles = torch.cat((freqs, freqs), dim=-1)
        return angles.cos().to(x.dtype), angles.sin().to(x.dtype)


def sliding_causal_mask(length: int, window: int, device: torch.device, past: int = 0) -> torch.Tensor:
    """``[T, past + T]`` bool, True where query q may see key k: q - window < k <= q. The keys are ``past``
    earlier frames then the ``T`` queried ones."""
    queries = torch.arange(past, past + length, device=device)
    offset = queries[:, None] - torch.arange(past + length, device=device)[None, :]
    return (offset >= 0) & (offset < window)
