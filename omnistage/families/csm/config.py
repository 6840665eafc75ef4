"""CSM's checkpoint, parsed once: the backbone, the depth decoder, the prompt's special ids and the Mimi codec.

The layout is transformers' ``CsmForConditionalGeneration`` (``sesame/csm-1b``): one ``config.json`` with a
``depth_decoder_config`` and a ``codec_config`` (``mimi``), one ``model.safetensors`` whose ``codec_model.``
tensors are the codec's, and the Llama 3 ``tokenizer.json``. Defaults are transformers' (the published shapes).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch

from omnistage.models.mimi_config import MimiConfig

MODEL_TYPE = "csm"
DEPTH_MODEL_TYPE = "csm_depth_decoder_model"
CODEC_PREFIX = "codec_model."


@dataclass(frozen=True)
class Rope:
    """Rotary frequencies: default, or Llama 3's (``rope_type: llama3``, long wavelengths divided by ``factor``)."""

    theta: float = 500000.0
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Rope:
        rope = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
        theta = rope.get("rope_theta", raw.get("rope_theta", cls.theta))
        kind = rope.get("rope_type", rope.get("type", "default"))
        if kind not in ("default", "llama3"):
            raise ValueError(f"CSM supports default or llama3 rotary embeddings, got {kind!r}")
        names = {f.name for f in fields(cls)} - {"theta", "rope_type"}
        return cls(float(theta), kind, **{k: v for k, v in rope.items() if k in names and v is not None})

    def inv_freq(self, head_dim: int) -> torch.Tensor:
        inv = 1.0 / (self.theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        if self.rope_type == "default":
            return inv
        # transformers' _compute_llama3_parameters, step for step
        low_wavelen = self.original_max_position_embeddings / self.low_freq_factor
        high_wavelen = self.original_max_position_embeddings / self.high_freq_factor
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / self.factor, inv)
        smooth = (self.original_max_position_embeddings / wavelen - self.low_freq_factor) / (
            self.high_freq_factor - self.low_freq_factor)
        smoothed = (1 - smooth) * scaled / self.factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, scaled)


@dataclass(frozen=True)
class LlamaShape:
    """One Llama stack (the backbone's or the depth decoder's)."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: Rope
    hidden_act: str = "silu"

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], defaults: Mapping[str, Any]) -> LlamaShape:
        get = {**defaults, **{k: v for k, v in raw.items() if v is not None}}.__getitem__
        heads = int(get("num_attention_heads"))
        for flag in ("attention_bias", "mlp_bias"):
            if raw.get(flag):
                raise ValueError(f"CSM's Llama layers have no biases ({flag} is set)")
        return cls(int(get("hidden_size")), int(get("intermediate_size")), int(get("num_hidden_layers")), heads,
                   int(raw.get("num_key_value_heads") or heads), int(raw.get("head_dim") or get("hidden_size") // heads),
                   float(get("rms_norm_eps")), Rope.from_dict(raw), str(get("hidden_act")))


_BACKBONE = {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
             "rms_norm_eps": 1e-5, "hidden_act": "silu"}
_DEPTH = {"hidden_size": 1024, "intermediate_size": 8192, "num_hidden_layers": 4, "num_attention_heads": 8,
          "rms_norm_eps": 1e-5, "hidden_act": "silu"}


@dataclass(frozen=True)
class CsmConfig:
    backbone: LlamaShape
    depth: LlamaShape
    codec: MimiConfig
    num_codebooks: int = 32
    vocab_size: int = 2051  # each codebook's entries, the codec's and CSM's own (EOS 0, pad)
    text_vocab_size: int = 128256
    max_position_embeddings: int = 2048
    bos_token_id: int = 128000
    eos_token_id: int = 128001  # the text's end marker in a segment (the tokenizer's <|end_of_text|>)
    audio_token_id: int = 128002
    audio_eos_token_id: int = 128003
    codebook_eos_token_id: int = 0
    codebook_pad_token_id: int = 2050
    tie_codebooks_embeddings: bool = True

    def __post_init__(self) -> None:
        if self.codec.num_quantizers < self.num_codebooks:
            raise ValueError(f"CSM's {self.num_codebooks} codebooks need as many codec quantizers, "
                             f"the codec has {self.codec.num_quantizers}")

    @property
    def frame_rate(self) -> float:
        return self.codec.frame_rate

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], eos_token_id: int | None = None) -> CsmConfig:
        if raw.get("model_type") not in (None, MODEL_TYPE):
            raise ValueError(f"not a CSM config: model_type {raw.get('model_type')!r}")
        depth_raw = dict(raw.get("depth_decoder_config") or {})
        if depth_raw.get("model_type") not in (None, DEPTH_MODEL_TYPE):
            raise ValueError(f"not a CSM depth decoder config: {depth_raw.get('model_type')!r}")
        depth_raw.setdefault("rope_parameters", raw.get("rope_parameters") or raw.get("rope_scaling"))
        names = {f.name for f in fields(cls)} - {"backbone", "depth", "codec", "eos_token_id"}
        known = {k: raw[k] for k in names if raw.get(k) is not None}
        ids = {"eos_token_id": eos_token_id} if eos_token_id is not None else {}
        return cls(LlamaShape.from_dict(raw, _BACKBONE), LlamaShape.from_dict(depth_raw, _DEPTH),
                   MimiConfig.from_dict(raw.get("codec_config") or {}), **known, **ids)

    @classmethod
    def from_folder(cls, folder: str | Path) -> CsmConfig:
        folder = Path(folder)
        return cls.from_dict(json.loads((folder / "config.json").read_text()), _text_eos_id(folder))


def _text_eos_id(folder: Path) -> int | None:
    """The tokenizer's ``<|end_of_text|>`` id (config.json does not name it: its ``eos_token_id`` is unset)."""
    path = folder / "tokenizer.json"
    if not path.exists():
        return None
    added = json.loads(path.read_text()).get("added_tokens", [])
    return next((t["id"] for t in added if t["content"] == "<|end_of_text|>"), None)
