"""Mimi's shape (transformers' ``MimiConfig``), parsed once: SEANet convs, the two windowed transformers, the split RVQ.

Kyutai's Mimi codec (CSM's and Moshi's audio codes) and the codecs built like it (Pocket TTS's latent VAE, which
keeps the convs and transformers and drops the quantizer) share this type; a family whose config differs says so
with its own defaults and ``model_types``. Defaults are ``kyutai/mimi``'s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

MIMI_MODEL_TYPES = ("mimi",)
# Fields transformers' config may carry that the modules here do not implement, with the only value they take.
_FIXED = (("use_causal_conv", True), ("use_conv_shortcut", False), ("trim_right_ratio", 1.0), ("audio_channels", 1))


@dataclass(frozen=True)
class MimiConfig:
    sampling_rate: int = 24000
    hidden_size: int = 512
    num_filters: int = 64
    num_residual_layers: int = 1
    upsampling_ratios: tuple[int, ...] = (8, 6, 5, 4)
    kernel_size: int = 7
    last_kernel_size: int = 3
    residual_kernel_size: int = 3
    dilation_growth_rate: int = 2
    compress: int = 2
    pad_mode: str = "constant"
    codebook_size: int = 2048
    codebook_dim: int = 256
    num_quantizers: int = 32
    vector_quantization_hidden_dimension: int = 256
    num_semantic_quantizers: int = 1
    upsample_groups: int = 512
    num_hidden_layers: int = 8
    intermediate_size: int = 2048
    num_attention_heads: int = 8
    num_key_value_heads: int | None = None  # None: as many as query heads
    head_dim: int | None = None  # None: hidden_size // num_attention_heads
    hidden_act: str = "gelu"
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    sliding_window: int = 250
    layer_scale_initial_scale: float = 0.01
    attention_bias: bool = False
    latent_stride: int = 2  # the SEANet frames per codec frame (Mimi: 25 Hz -> 12.5 Hz)
    latent_dim: int | None = None  # what the encoder's downsample outputs; None: hidden_size (Mimi's)

    def __post_init__(self) -> None:
        defaults = (("num_key_value_heads", self.num_attention_heads), ("latent_dim", self.hidden_size),
                    ("head_dim", self.hidden_size // max(self.num_attention_heads, 1)))
        for name, value in defaults:
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)
        object.__setattr__(self, "upsampling_ratios", tuple(self.upsampling_ratios))
        problems = [message for bad, message in (
            (self.num_attention_heads % self.num_key_value_heads, "heads must be a multiple of KV heads"),
            (self.head_dim % 2, "head_dim must be even for rotary embeddings"),
            (not 0 < self.num_semantic_quantizers < self.num_quantizers, "0 < semantic quantizers < quantizers"),
            (self.pad_mode not in ("constant", "replicate"), "pad_mode must be 'constant' or 'replicate'"),
            (self.sliding_window < 1 or self.latent_stride < 1, "sliding_window and latent_stride must be >= 1"),
        ) if bad]
        if problems:
            raise ValueError("invalid Mimi config: " + "; ".join(problems))

    @property
    def hop_length(self) -> int:
        """Samples per SEANet frame (960 at 25 Hz)."""
        return math.prod(self.upsampling_ratios)

    @property
    def frame_size(self) -> int:
        """Samples per codec frame (1920: 80 ms at 24 kHz)."""
        return self.hop_length * self.latent_stride

    @property
    def frame_rate(self) -> float:
        return self.sampling_rate / self.frame_size

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], model_types: tuple[str, ...] = MIMI_MODEL_TYPES) -> MimiConfig:
        """From a config.json dict (``model_type`` one of ``model_types``, or absent)."""
        if raw.get("model_type") not in (None, *model_types):
            raise ValueError(f"not a {'/'.join(model_types)} config: model_type {raw.get('model_type')!r}")
        for flag, wanted in _FIXED:
            if raw.get(flag, wanted) != wanted:
                raise ValueError(f"{cls.__name__} supports {flag}={wanted!r} only, got {raw[flag]!r}")
        names = {f.name for f in fields(cls)}
        known = {k: (tuple(v) if isinstance(v, list) else v) for k, v in raw.items() if k in names and v is not None}
        return cls(**{**known, "rope_theta": rope_theta(raw), **cls._derived(raw)})

    @classmethod
    def _derived(cls, raw: Mapping[str, Any]) -> dict[str, Any]:
        """Fields transformers computes rather than stores: Mimi's latent stride from its frame rates."""
        ratios = raw.get("upsampling_ratios") or cls.upsampling_ratios
        rate = raw.get("sampling_rate", cls.sampling_rate)
        frame_rate = raw.get("frame_rate")
        if frame_rate is None or "latent_stride" in raw:
            return {}
        return {"latent_stride": int(math.ceil(rate / math.prod(ratios)) / frame_rate)}


def rope_theta(raw: Mapping[str, Any]) -> float:
    rope = raw.get("rope_parameters") or {}
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"only default rotary embeddings are supported, got {rope}")
    return float(rope.get("rope_theta", raw.get("rope_theta", 10000.0)))
