"""Moshi's typed config: a checkpoint's config.json parsed once, in either layout.

Two layouts hold the same model:

* transformers' ``MoshiForConditionalGeneration`` (``model_type: moshi``): the temporal transformer's sizes at the
  top level, the depth decoder's under ``depth_decoder_config``, Mimi's under ``audio_encoder_config``;
* Kyutai's (the ``moshi`` package, PersonaPlex): the ``LMModel`` keyword arguments under ``lm_config`` (``dim``,
  ``n_q``, ``dep_q``, ``delays``, ``depformer_*``...). PersonaPlex is this layout with ``dep_q`` 16: its depth
  decoder also predicts the user's 8 codes.

Both become one :class:`MoshiConfig`; the loader reads the layout to pick its key table.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MODEL_TYPE = "moshi"
TRANSFORMERS = "transformers"
KYUTAI = "kyutai"
FRAME_RATE = 12.5  # Mimi's frames per second in every published checkpoint


@dataclass(frozen=True)
class DepthConfig:
    """The depth transformer: one step per code of a frame, each step with its own weights."""

    hidden_size: int
    num_layers: int
    num_heads: int
    ffn_dim: int  # the gated MLP's first projection (twice the gated width)
    steps: int  # codes it predicts per frame: 8 (Moshi) or 16 (PersonaPlex: the user's 8 too)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


@dataclass(frozen=True)
class CodecConfig:
    """What the duplex loop needs of Mimi without loading it: its timing and codebooks."""

    sampling_rate: int = 24000
    frame_size: int = 1920  # samples per frame (12.5 Hz at 24 kHz)
    num_quantizers: int = 32  # codebooks Mimi has; Moshi reads the first ``MoshiConfig.num_codebooks``
    codebook_size: int = 2048


@dataclass(frozen=True)
class MoshiConfig:
    """Moshi's language model: a temporal transformer over frames and a depth transformer within a frame.

    Each step's input is the text embedding plus ``num_codebooks`` agent-code and ``num_codebooks`` user-code
    embeddings; the temporal transformer's text head gives the "inner monologue" token, the depth transformer the
    frame's agent codes, the acoustic ones (codebooks 1..) one step behind the semantic one (``delays``).
    """

    layout: str
    vocab_size: int  # text tokens the head scores; the embedding has one more (the initial token)
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    ffn_dim: int
    rms_norm_eps: float
    rope_theta: float
    context: int  # the temporal attention's window (Moshi's 3000 frames, 4 minutes): the KV a session keeps
    num_codebooks: int  # agent codes per frame (the user's are as many)
    audio_vocab_size: int  # entries per codebook; embeddings have one more (the initial token)
    depth: DepthConfig
    codec: CodecConfig
    text_pad_id: int = 3  # Kyutai's existing text padding id (PersonaPlex's prompts are padded with it)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def delays(self) -> tuple[int, ...]:
        """Each agent codebook's lag in steps: the semantic code none, the acoustic ones one."""
        return (0,) + (1,) * (self.num_codebooks - 1)

    @property
    def text_initial_id(self) -> int:
        return self.vocab_size

    @property
    def audio_initial_id(self) -> int:
        return self.audio_vocab_size

    @classmethod
    def from_folder(cls, folder: str | Path) -> MoshiConfig:
        return cls.from_dict(json.loads((Path(folder) / "config.json").read_text()))

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> MoshiConfig:
        if "lm_config" in raw:
            return _from_kyutai(raw["lm_config"], raw.get("mimi_config", {}))
        return _from_transformers(raw)


def is_moshi(raw: Mapping[str, Any]) -> bool:
    return raw.get("model_type") == MODEL_TYPE or "lm_config" in raw


def _from_transformers(raw: Mapping[str, Any]) -> MoshiConfig:
    heads = int(raw.get("num_attention_heads", 32))
    depth = raw.get("depth_decoder_config") or {}
    codec = raw.get("audio_encoder_config") or {}
    rope = raw.get("rope_parameters") or {}
    return MoshiConfig(
        layout=TRANSFORMERS, vocab_size=int(raw.get("vocab_size", 32000)), hidden_size=int(raw.get("hidden_size", 4096)),
        num_layers=int(raw.get("num_hidden_layers", 32)), num_heads=heads,
        num_kv_heads=int(raw.get("num_key_value_heads") or heads), ffn_dim=int(raw.get("ffn_dim", 22528)),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-8)), rope_theta=float(rope.get("rope_theta", 10000.0)),
        context=int(raw.get("sliding_window", 3000)), num_codebooks=int(raw.get("num_codebooks", 8)),
        audio_vocab_size=int(raw.get("audio_vocab_size") or codec.get("codebook_size", 2048)),
        depth=DepthConfig(int(depth.get("hidden_size", 1024)), int(depth.get("num_hidden_layers", 6)),
                          int(depth.get("num_attention_heads", 16)), int(depth.get("ffn_dim", 5632)),
                          int(raw.get("num_codebooks", 8))),
        codec=_codec(codec))


def _from_kyutai(lm: Mapping[str, Any], mimi: Mapping[str, Any]) -> MoshiConfig:
    dim, ddim = int(lm["dim"]), int(lm["depformer_dim"])
    dep_ff = int(lm.get("depformer_dim_feedforward") or lm.get("hidden_scale", 4.125) * ddim)
    n_q = int(lm["n_q"])
    return MoshiConfig(
        layout=KYUTAI, vocab_size=int(lm["text_card"]), hidden_size=dim, num_layers=int(lm["num_layers"]),
        num_heads=int(lm["num_heads"]), num_kv_heads=int(lm["num_heads"]),
        ffn_dim=2 * _gated_width(dim, int(lm.get("hidden_scale", 4.125) * dim)),
        rms_norm_eps=1e-8, rope_theta=float(lm.get("max_period", 10000)), context=int(lm.get("context", 3000)),
        num_codebooks=n_q // 2, audio_vocab_size=int(lm["card"]),
        depth=DepthConfig(ddim, int(lm["depformer_num_layers"]), int(lm["depformer_num_heads"]),
                          2 * _gated_width(ddim, dep_ff), int(lm["dep_q"])),
        codec=_codec(mimi), text_pad_id=int(lm.get("existing_text_padding_id", 3)))


def _gated_width(dim: int, dim_feedforward: int) -> int:
    """Kyutai's ``ActivationGating`` hidden width for a ``dim_feedforward`` (the rule its module applies)."""
    return (21 * dim) // 8 if dim_feedforward == 4 * dim else (2 * dim_feedforward) // 3


def _codec(raw: Mapping[str, Any]) -> CodecConfig:
    rate = int(raw.get("sampling_rate", 24000))
    return CodecConfig(sampling_rate=rate, frame_size=int(round(rate / float(raw.get("frame_rate", FRAME_RATE)))),
                       num_quantizers=int(raw.get("num_quantizers", 32)),
                       codebook_size=int(raw.get("codebook_size", 2048)))
