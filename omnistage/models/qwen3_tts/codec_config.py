"""The 12 Hz speech tokenizer's typed configuration (``speech_tokenizer/config.json``).

The decoder is Qwen's (``Qwen3TTSTokenizerV2DecoderConfig``); the encoder is a Mimi codec
(transformers' ``MimiConfig``, as transformers 4.57 lays it out) of which only the encoding half is used.
Defaults are those classes' own.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, TypeVar

from omnistage.models.mimi_config import MimiConfig

T = TypeVar("T")


def _build(cls: type[T], raw: Mapping[str, Any], **extra: Any) -> T:
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    values = {k: (tuple(v) if isinstance(v, list) else v) for k, v in raw.items() if k in names and v is not None}
    return cls(**{**values, **extra})


def _rope_theta(raw: Mapping[str, Any], default: float) -> float:
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise ValueError(f"the speech tokenizer supports only default rotary embeddings, got {rope}")
    return float(rope.get("rope_theta", raw.get("rope_theta", default)))


@dataclass(frozen=True)
class CodecDecoderConfig:
    """Codes ``[G, T]`` -> 24 kHz: split RVQ dequantiser, causal conv, sliding-window transformer, conv upsampler."""

    codebook_size: int = 2048
    codebook_dim: int = 512
    hidden_size: int = 1024
    latent_dim: int = 1024
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    head_dim: int = 0  # 0: hidden_size // num_attention_heads
    attention_bias: bool = False
    sliding_window: int = 72
    intermediate_size: int = 3072
    hidden_act: str = "silu"
    layer_scale_initial_scale: float = 0.01
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    num_hidden_layers: int = 8
    num_quantizers: int = 16
    upsample_rates: tuple[int, ...] = (8, 5, 4, 3)
    upsampling_ratios: tuple[int, ...] = (2, 2)
    decoder_dim: int = 1536

    def __post_init__(self) -> None:
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if self.codebook_dim % 2 or self.num_quantizers < 2:
            raise ValueError(f"codec decoder: codebook_dim must be even and num_quantizers >= 2: {self}")
        if self.decoder_dim % 2 ** len(self.upsample_rates):
            raise ValueError(f"codec decoder: decoder_dim must divide by 2**{len(self.upsample_rates)}")

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> CodecDecoderConfig:
        return _build(cls, raw, rope_theta=_rope_theta(raw, cls.rope_theta))

    @property
    def samples_per_frame(self) -> int:
        return math.prod(self.upsample_rates) * math.prod(self.upsampling_ratios)


@dataclass(frozen=True)
class CodecEncoderConfig:
    """The Mimi encoder: SEANet convs, a causal transformer, a stride-2 downsample, a split RVQ."""

    sampling_rate: int = 24000
    audio_channels: int = 1
    hidden_size: int = 512
    num_filters: int = 64
    num_residual_layers: int = 1
    upsampling_ratios: tuple[int, ...] = (8, 6, 5, 4)
    kernel_size: int = 7
    last_kernel_size: int = 3
    residual_kernel_size: int = 3
    dilation_growth_rate: int = 2
    use_causal_conv: bool = True
    pad_mode: str = "constant"
    compress: int = 2
    codebook_size: int = 2048
    codebook_dim: int = 256
    num_quantizers: int = 32
    use_conv_shortcut: bool = False
    vector_quantization_hidden_dimension: int = 256
    num_semantic_quantizers: int = 1
    num_hidden_layers: int = 8
    intermediate_size: int = 2048
    num_attention_heads: int = 8
    num_key_value_heads: int = 8
    head_dim: int = 0  # 0: hidden_size // num_attention_heads
    hidden_act: str = "gelu"
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    layer_scale_initial_scale: float = 0.01
    attention_bias: bool = False
    frame_rate: float = 0.0  # 0: sampling_rate / (prod(upsampling_ratios) * 2), Mimi's frame size
    sliding_window: int = 250  # Mimi's attention window (25 Hz frames)

    def __post_init__(self) -> None:
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if not self.frame_rate:
            object.__setattr__(self, "frame_rate", self.sampling_rate / (math.prod(self.upsampling_ratios) * 2))
        if not self.use_causal_conv or self.audio_channels != 1:
            raise ValueError("codec encoder: only causal convolutions over mono audio are supported")
        if self.frame_rate == self.encodec_frame_rate:
            raise ValueError("codec encoder: a Mimi without its downsampling layer is not supported")

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> CodecEncoderConfig:
        return _build(cls, raw, rope_theta=_rope_theta(raw, cls.rope_theta))

    @property
    def encodec_frame_rate(self) -> int:
        """The SEANet's output rate, before the downsampling layer."""
        return math.ceil(self.sampling_rate / math.prod(self.upsampling_ratios))

    @property
    def downsample_kernel(self) -> int:
        return 2 * int(self.encodec_frame_rate / self.frame_rate)

    def mimi(self) -> MimiConfig:
        """The shared Mimi modules' config of this encoder."""
        names = {f.name for f in fields(MimiConfig)}
        same = {f.name: getattr(self, f.name) for f in fields(self) if f.name in names}
        return MimiConfig(**same, latent_stride=self.downsample_kernel // 2)


@dataclass(frozen=True)
class SpeechTokenizerConfig:
    decoder: CodecDecoderConfig
    encoder: CodecEncoderConfig
    encoder_valid_num_quantizers: int = 16
    input_sample_rate: int = 24000
    output_sample_rate: int = 24000
    decode_upsample_rate: int = 1920
    encode_downsample_rate: int = 1920

    def __post_init__(self) -> None:
        if self.decoder.samples_per_frame != self.decode_upsample_rate:
            raise ValueError(f"speech tokenizer: the decoder makes {self.decoder.samples_per_frame} samples per "
                             f"frame, decode_upsample_rate says {self.decode_upsample_rate}")
        if self.encoder_valid_num_quantizers != self.decoder.num_quantizers:
            raise ValueError("speech tokenizer: the encoder's valid quantizers must be the decoder's quantizers")

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> SpeechTokenizerConfig:
        if raw.get("model_type", "qwen3_tts_tokenizer_12hz") != "qwen3_tts_tokenizer_12hz":
            raise ValueError(f"only the 12 Hz speech tokenizer is supported, got {raw.get('model_type')!r}")
        return _build(cls, raw, decoder=CodecDecoderConfig.from_dict(raw.get("decoder_config") or {}),
                      encoder=CodecEncoderConfig.from_dict(raw.get("encoder_config") or {}))
