"""Pocket TTS's checkpoint, parsed once: the backbone with its flow head, and the audio tokenizer's decoder.

The layout is transformers' (``pocket_tts`` and ``pocket_tts_audio_tokenizer``): ``config.json`` and
``model.safetensors`` in the folder, the codec in ``audio_tokenizer/`` (the processor points at it by path).
Defaults are the released checkpoint's, as transformers' config classes state them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

MODEL_TYPE = "pocket_tts"
CODEC_MODEL_TYPE = "pocket_tts_audio_tokenizer"
CODEC_FOLDER = "audio_tokenizer"


def _known(cls: type, raw: Mapping[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {k: (tuple(v) if isinstance(v, list) else v) for k, v in raw.items() if k in names and v is not None}


def _rope_theta(raw: Mapping[str, Any]) -> float:
    rope = raw.get("rope_parameters") or {}
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"Pocket TTS supports only default rotary embeddings, got {rope}")
    return float(rope.get("rope_theta", raw.get("rope_theta", 10000.0)))


@dataclass(frozen=True)
class FlowHeadConfig:
    hidden_size: int = 512
    num_hidden_layers: int = 6
    latent_dim: int = 32
    condition_dim: int = 1024
    frequency_embedding_size: int = 256
    layer_norm_eps: float = 1e-6
    rms_norm_eps: float = 1e-5
    max_period: float = 10000.0
    flow_type: str = "lsd"  # "lsd": Euler steps conditioned on start/end times; "drifting": one call, no times

    def __post_init__(self) -> None:
        if self.flow_type not in ("lsd", "drifting"):
            raise ValueError(f"flow_type must be 'lsd' or 'drifting', got {self.flow_type!r}")

    @property
    def num_time_conditions(self) -> int:
        return 2 if self.flow_type == "lsd" else 0


@dataclass(frozen=True)
class PocketConfig:
    """The backbone (LayerNorm transformer), its EOS head and flow head, and the prompt's special ids."""

    vocab_size: int = 4004
    hidden_size: int = 1024
    num_hidden_layers: int = 6
    num_attention_heads: int = 16
    intermediate_size: int = 4096
    layer_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 8192
    latent_dim: int = 32
    pad_token_id: int = 3
    audio_prompt_token_id: int = 4000
    audio_latent_token_id: int = 4001
    audio_prompt_bos_token_id: int = 4002
    audio_bos_token_id: int = 4003
    frame_rate: float = 12.5
    hidden_act: str = "gelu_pytorch_tanh"
    flow_head: FlowHeadConfig = field(default_factory=FlowHeadConfig)

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is no multiple of {self.num_attention_heads} heads")
        if self.flow_head.latent_dim != self.latent_dim or self.flow_head.condition_dim != self.hidden_size:
            raise ValueError("the flow head's latent_dim/condition_dim must equal the backbone's latent_dim/hidden")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> PocketConfig:
        if raw.get("model_type") not in (None, MODEL_TYPE):
            raise ValueError(f"not a Pocket TTS config: model_type {raw.get('model_type')!r}")
        if raw.get("num_key_value_heads") not in (None, raw.get("num_attention_heads", 16)):
            raise ValueError("Pocket TTS's backbone has as many KV heads as query heads")
        flow = FlowHeadConfig(**_known(FlowHeadConfig, raw.get("flow_head_config") or {}))
        return cls(**{**_known(cls, raw), "rope_theta": _rope_theta(raw), "flow_head": flow})


@dataclass(frozen=True)
class CodecConfig:
    """The audio tokenizer's shape (a Mimi-style VAE: SEANet convs around a sliding-window transformer)."""

    sampling_rate: int = 24000
    hidden_size: int = 512
    num_filters: int = 64
    num_residual_layers: int = 1
    upsampling_ratios: tuple[int, ...] = (6, 5, 4)
    kernel_size: int = 7
    last_kernel_size: int = 3
    residual_kernel_size: int = 3
    dilation_growth_rate: int = 2
    compress: int = 2
    upsample_groups: int = 512
    num_hidden_layers: int = 2
    intermediate_size: int = 2048
    num_attention_heads: int = 8
    hidden_act: str = "gelu_pytorch_tanh"
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    sliding_window: int = 250
    layer_scale_initial_scale: float = 0.01
    latent_stride: int = 16
    latent_dim: int = 32

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"codec hidden_size {self.hidden_size} is no multiple of {self.num_attention_heads}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def frame_size(self) -> int:
        """Samples one latent frame decodes to (1920: 80 ms at 24 kHz)."""
        return math.prod(self.upsampling_ratios) * self.latent_stride

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> CodecConfig:
        if raw.get("model_type") not in (None, CODEC_MODEL_TYPE):
            raise ValueError(f"not a Pocket TTS audio tokenizer config: model_type {raw.get('model_type')!r}")
        for flag, wanted in (("use_causal_conv", True), ("use_conv_shortcut", False), ("trim_right_ratio", 1.0),
                             ("pad_mode", "constant"), ("audio_channels", 1)):
            if raw.get(flag, wanted) != wanted:
                raise ValueError(f"the Pocket TTS decoder supports {flag}={wanted!r} only, got {raw[flag]!r}")
        if raw.get("num_key_value_heads", 8) != raw.get("num_attention_heads", 8):
            raise ValueError("the Pocket TTS decoder's transformer has as many KV heads as query heads")
        return cls(**{**_known(cls, raw), "rope_theta": _rope_theta(raw)})


@dataclass(frozen=True)
class PocketCheckpoint:
    """A checkpoint folder's two configs."""

    model: PocketConfig
    codec: CodecConfig

    @classmethod
    def from_folder(cls, folder: str | Path) -> PocketCheckpoint:
        folder = Path(folder)
        model = json.loads((folder / "config.json").read_text())
        codec = json.loads((folder / CODEC_FOLDER / "config.json").read_text())
        return cls(PocketConfig.from_dict(model), CodecConfig.from_dict(codec))
