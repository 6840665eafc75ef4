"""Higgs Audio v2's checkpoint, parsed once: the generator (``higgs_audio_v2``) and its audio tokenizer
(``higgs_audio_v2_tokenizer``, in ``audio_tokenizer/``).

The layout is transformers': ``config.json`` + ``model.safetensors`` (+ ``tokenizer.json``) in the folder, the
codec's ``config.json`` + ``model.safetensors`` in ``audio_tokenizer/`` (the processor points at it by path).
Defaults are transformers' config classes'. The generator's ``codebook_size`` counts the two stream markers
(``audio_stream_bos_id``, ``audio_stream_eos_id``) after the codec's own codes. Light: no torch.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

MODEL_TYPE = "higgs_audio_v2"
CODEC_MODEL_TYPE = "higgs_audio_v2_tokenizer"
CODEC_FOLDER = "audio_tokenizer"


def _known(cls: type, raw: Mapping[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in raw.items() if k in names and v is not None and not isinstance(v, (list, dict))}


@dataclass(frozen=True)
class Llama3Rope:
    """Llama 3's rotary scaling (``rope_type: llama3``); ``factor`` 1 with ``default``."""

    theta: float = 500000.0
    factor: float = 32.0
    low_freq_factor: float = 0.125
    high_freq_factor: float = 0.5
    original_max_position_embeddings: int = 1024
    scaled: bool = True

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any] | None) -> Llama3Rope:
        if not raw:
            return cls()
        kind = raw.get("rope_type", raw.get("type", "default"))
        if kind not in ("llama3", "default"):
            raise ValueError(f"Higgs Audio v2 supports llama3 or default rotary embeddings, got {kind!r}")
        theta = float(raw.get("rope_theta", 500000.0))
        if kind == "default":
            return cls(theta=theta, scaled=False)
        return cls(theta, float(raw["factor"]), float(raw["low_freq_factor"]), float(raw["high_freq_factor"]),
                   int(raw["original_max_position_embeddings"]))


@dataclass(frozen=True)
class HiggsConfig:
    """The generator: a Llama decoder whose every layer has a text MLP and an audio MLP (DualFFN)."""

    vocab_size: int = 128256
    hidden_size: int = 3072
    intermediate_size: int = 8192
    num_hidden_layers: int = 28
    num_attention_heads: int = 24
    num_key_value_heads: int = 8
    head_dim: int = 128
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 2048
    attention_bias: bool = False
    mlp_bias: bool = False
    num_codebooks: int = 8
    codebook_size: int = 1024
    audio_token_id: int = 128016
    audio_bos_token_id: int = 128013
    audio_delay_token_id: int = 128014
    audio_stream_bos_id: int = 1024
    audio_stream_eos_id: int = 1025
    eos_token_id: int = 128009
    rope: Llama3Rope = Llama3Rope()

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any]) -> HiggsConfig:
        known = _known(cls, raw)
        eos = raw.get("eos_token_id", cls.eos_token_id)
        known["eos_token_id"] = int(eos[0] if isinstance(eos, list) else eos)
        if raw.get("head_dim") is None:
            known["head_dim"] = int(raw.get("hidden_size", cls.hidden_size)) // int(
                raw.get("num_attention_heads", cls.num_attention_heads))
        cfg = cls(**known, rope=Llama3Rope.from_raw(raw.get("rope_parameters") or raw.get("rope_scaling")))
        cfg.check()
        return cfg

    def check(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"{self.num_attention_heads} heads do not share {self.num_key_value_heads} KV heads")
        if not self.audio_stream_bos_id < self.codebook_size or not self.audio_stream_eos_id < self.codebook_size:
            raise ValueError("the stream markers must be entries of the generator's codebooks")

    @property
    def delays(self) -> tuple[int, ...]:
        """The staircase: codebook k lags k + 1 steps (the first frame after the audio BOS is all markers)."""
        return tuple(k + 1 for k in range(self.num_codebooks))


@dataclass(frozen=True)
class CodecConfig:
    """What the serving layers need of the audio tokenizer (its modules are built from transformers' config)."""

    sample_rate: int = 24000
    hop_length: int = 960
    codebook_size: int = 1024
    num_quantizers: int = 8
    semantic_sample_rate: int = 16000

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any]) -> CodecConfig:
        acoustic = raw.get("acoustic_model_config") or {}
        ratios = acoustic.get("downsampling_ratios", [8, 5, 4, 2, 3])
        hop = math.prod(int(r) for r in ratios)
        rate = int(raw.get("sample_rate", 24000))
        size = int(raw.get("codebook_size", 1024))
        bandwidth = float((raw.get("target_bandwidths") or [0.5, 1, 1.5, 2])[-1])
        frame_rate = math.ceil(rate / hop)  # transformers' own rounding
        quantizers = int(1000 * bandwidth // (frame_rate * math.ceil(math.log2(size))))
        return cls(rate, hop, size, quantizers, int(raw.get("semantic_sample_rate", 16000)))


@dataclass(frozen=True)
class HiggsCheckpoint:
    model: HiggsConfig
    codec: CodecConfig

    @classmethod
    def from_folder(cls, folder: str | Path) -> HiggsCheckpoint:
        folder = Path(folder)
        raw = json.loads((folder / "config.json").read_text())
        if raw.get("model_type") != MODEL_TYPE:
            raise ValueError(f"{folder}/config.json: model_type {raw.get('model_type')!r} is not {MODEL_TYPE!r}")
        codec_path = folder / CODEC_FOLDER / "config.json"
        if not codec_path.is_file():
            raise FileNotFoundError(f"{folder}: no {CODEC_FOLDER}/config.json (the audio tokenizer)")
        ckpt = cls(HiggsConfig.from_raw(raw), CodecConfig.from_raw(json.loads(codec_path.read_text())))
        if ckpt.codec.num_quantizers != ckpt.model.num_codebooks:
            raise ValueError(f"{folder}: the generator has {ckpt.model.num_codebooks} codebooks, the audio "
                             f"tokenizer {ckpt.codec.num_quantizers} quantizers")
        if ckpt.model.audio_stream_bos_id < ckpt.codec.codebook_size:
            raise ValueError(f"{folder}: the stream markers collide with the codec's codes")
        return ckpt
