"""A Qwen3-ASR checkpoint's config.json parsed once, in either layout, into transformers' ``Qwen3ASRConfig``.

Two layouts name the same model:

* **published** (``Qwen/Qwen3-ASR-1.7B``, what the ``qwen-asr`` package loads): ``model_type: qwen3_asr`` with a
  ``thinker_config`` holding ``audio_config`` (Qwen3-Omni's encoder fields, its ``proj1``/``proj2`` inside the
  encoder) and ``text_config`` (a Qwen3 LM whose M-RoPE sections all see one position: 1-D RoPE); tensors under
  ``thinker.audio_tower.``, ``thinker.model.``, ``thinker.lm_head.``;
* **hf** (``Qwen/Qwen3-ASR-1.7B-hf``, transformers' ``qwen3_asr``): ``audio_config``/``text_config`` at the top;
  tensors under ``model.audio_tower.``, ``model.multi_modal_projector.linear_{1,2}``, ``model.language_model.``,
  ``lm_head.``.

The forced aligner (Qwen3-ForcedAligner, transformers' ``Qwen3ASRForTokenClassification``) is the same body with a
token-classification head (``score``/``classifier``, ``num_labels`` timestamp classes) instead of ``lm_head``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MODEL_TYPE = "qwen3_asr"
ALIGNER_MODEL_TYPE = "qwen3_forced_aligner"  # the published aligner's type (transformers reads it as qwen3_asr)
ALIGNER_ARCHITECTURE = "Qwen3ASRForTokenClassification"
_AUDIO_FIELDS = ("num_mel_bins", "encoder_layers", "encoder_attention_heads", "encoder_ffn_dim", "d_model",
                 "activation_function", "n_window", "output_dim", "n_window_infer", "downsample_hidden_size")
_TEXT_DROPPED = ("rope_scaling", "model_type")  # M-RoPE bookkeeping (one position on every axis) and the type


def is_aligner(raw: Mapping[str, Any]) -> bool:
    """Whether a parsed config.json is a forced aligner (token classification), in either layout."""
    return (raw.get("model_type") == ALIGNER_MODEL_TYPE or ALIGNER_ARCHITECTURE in (raw.get("architectures") or ())
            or "classify_num" in raw.get("thinker_config", {}))


@dataclass(frozen=True)
class Qwen3ASRCheckpoint:
    """hf: transformers' ``Qwen3ASRConfig``; published: the tensors' layout; aligner: a token classifier."""

    hf: Any
    published: bool
    aligner: bool
    eos_token_ids: tuple[int, ...]

    @classmethod
    def from_folder(cls, folder: str | Path) -> Qwen3ASRCheckpoint:
        return cls.from_dict(json.loads((Path(folder) / "config.json").read_text()))

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Qwen3ASRCheckpoint:
        from transformers import Qwen3ASRConfig

        published = "thinker_config" in raw
        fields = _from_published(raw) if published else {k: v for k, v in raw.items() if k != "model_type"}
        hf = Qwen3ASRConfig(**fields)
        eos = hf.eos_token_id
        return cls(hf, published, is_aligner(raw), tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),))

    @property
    def text(self) -> Any:
        return self.hf.text_config

    @property
    def audio(self) -> Any:
        return self.hf.audio_config

    @property
    def max_positions(self) -> int:
        return int(self.text.max_position_embeddings)

    @property
    def num_labels(self) -> int:
        return int(self.hf.num_labels)


def _from_published(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The published config's fields as transformers' ``Qwen3ASRConfig`` takes them."""
    thinker = raw["thinker_config"]
    audio = {k: thinker["audio_config"][k] for k in _AUDIO_FIELDS if k in thinker["audio_config"]}
    text = {k: v for k, v in thinker["text_config"].items() if k not in _TEXT_DROPPED and v is not None}
    rope = thinker["text_config"].get("rope_scaling") or {}
    text.setdefault("rope_theta", rope.get("rope_theta", text.get("rope_theta", 1000000.0)))
    fields: dict[str, Any] = {"audio_config": audio, "text_config": {"model_type": "qwen3", **text},
                              "tie_word_embeddings": bool(raw.get("tie_word_embeddings",
                                                                  text.get("tie_word_embeddings", True)))}
    for key in ("audio_token_id", "timestamp_token_id", "pad_token_id", "eos_token_id"):
        if key in thinker or key in raw:
            fields[key] = thinker.get(key, raw.get(key))
    if "classify_num" in thinker:
        fields["num_labels"] = int(thinker["classify_num"])
    return fields
