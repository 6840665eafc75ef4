"""Pocket TTS's checkpoint, parsed once: the backbone with its flow head, and the audio tokenizer's decoder.

The layout is transformers' (``pocket_tts`` and ``pocket_tts_audio_tokenizer``): ``config.json`` and
``model.safetensors`` in the folder, the codec in ``audio_tokenizer/`` (the processor points at it by path).
Defaults are the released checkpoint's, as transformers' config classes state them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from omnistage.models.mimi_config import MimiConfig, rope_theta

MODEL_TYPE = "pocket_tts"
CODEC_MODEL_TYPE = "pocket_tts_audio_tokenizer"
CODEC_FOLDER = "audio_tokenizer"


def _known(cls: type, raw: Mapping[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {k: (tuple(v) if isinstance(v, list) else v) for k, v in raw.items() if k in names and v is not None}


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
        return cls(**{**_known(cls, raw), "rope_theta": rope_theta(raw), "flow_head": flow})


@dataclass(frozen=True)
class CodecConfig(MimiConfig):
    """The audio tokenizer's shape: a Mimi without its quantizer (a VAE: SEANet convs around the windowed
    transformers, 32-d latents), so the shared Mimi modules build it; the released checkpoint's defaults."""

    upsampling_ratios: tuple[int, ...] = (6, 5, 4)
    num_hidden_layers: int = 2
    hidden_act: str = "gelu_pytorch_tanh"
    latent_stride: int = 16
    latent_dim: int | None = 32

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], model_types: tuple[str, ...] = (CODEC_MODEL_TYPE,)) -> CodecConfig:
        if raw.get("pad_mode", "constant") != "constant":
            raise ValueError(f"the Pocket TTS decoder supports pad_mode='constant' only, got {raw['pad_mode']!r}")
        config = super().from_dict(raw, model_types)
        assert isinstance(config, CodecConfig)
        return config

    @classmethod
    def _derived(cls, raw: Mapping[str, Any]) -> dict[str, Any]:
        return {}  # its latent stride is stored


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
