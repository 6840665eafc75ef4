"""A made ``-hf`` checkpoint rewritten as Qwen's own release lays it out (``qwen-asr``'s layout), so the loader's
second layout is tested on tensors whose values are known: config under ``thinker_config`` (encoder fields as
Qwen3-Omni's, text with its M-RoPE bookkeeping), tensors under ``thinker.`` with the projector inside the encoder."""

from __future__ import annotations

import torch

# transformers' names -> the release's (the inverse of what the loader reads through).
_RENAMES = (("model.multi_modal_projector.linear_1.", "thinker.audio_tower.proj1."),
            ("model.multi_modal_projector.linear_2.", "thinker.audio_tower.proj2."),
            ("model.audio_tower.", "thinker.audio_tower."), ("model.language_model.", "thinker.model."),
            ("lm_head.", "thinker.lm_head."), ("score.", "thinker.lm_head."))


def write_published(raw: dict[str, object], state: dict[str, torch.Tensor]
                    ) -> tuple[dict[str, object], dict[str, torch.Tensor]]:
    """(config.json, tensors) of the release's layout for a ``-hf`` config and its tensors."""
    renamed = {}
    for name, tensor in state.items():
        for ours, theirs in _RENAMES:
            if name.startswith(ours):
                name = theirs + name[len(ours):]
                break
        renamed[name] = tensor
    text = dict(raw["text_config"])  # type: ignore[arg-type]
    rope = text.pop("rope_parameters")
    text["rope_scaling"] = {"rope_type": "default", "mrope_section": [24, 20, 20], "interleaved": True}
    text["rope_theta"] = rope["rope_theta"]
    audio = {**raw["audio_config"], "model_type": "qwen3_asr_audio_encoder",  # type: ignore[dict-item]
             "max_source_positions": 1500, "conv_chunksize": 500}
    thinker: dict[str, object] = {"audio_config": audio, "text_config": text}
    for key in ("audio_token_id", "timestamp_token_id", "pad_token_id", "eos_token_id"):
        thinker[key] = raw[key]
    if "num_labels" in raw:
        thinker["classify_num"] = raw["num_labels"]
    model_type = "qwen3_forced_aligner" if "num_labels" in raw else "qwen3_asr"
    config = {"model_type": model_type, "architectures": raw["architectures"], "thinker_config": thinker,
              "tie_word_embeddings": raw["tie_word_embeddings"]}
    return config, renamed
