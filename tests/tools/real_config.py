"""The config.json of Qwen3-Omni-30B-A3B-Instruct (widths from shared/qwen3_omni_facts.md) on top of a made
checkpoint's config (token ids and the rest as there): for config-only tools such as ``omnistage plan``."""

from __future__ import annotations

import json
from pathlib import Path


def _rope(section: list[int]) -> dict[str, object]:
    return {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": section, "interleaved": True,
            "mrope_interleaved": True}


def write_real_config(base: Path, out: Path) -> Path:
    config = json.loads((base / "config.json").read_text())
    thinker, talker = config["thinker_config"], config["talker_config"]
    thinker["text_config"].update(vocab_size=152064, hidden_size=2048, num_hidden_layers=48, num_attention_heads=32,
                                  num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
                                  moe_intermediate_size=768, intermediate_size=768,
                                  rope_parameters=_rope([24, 20, 20]))
    thinker["audio_config"].update(d_model=1280, encoder_layers=32, encoder_attention_heads=20, encoder_ffn_dim=5120,
                                   num_mel_bins=128, output_dim=2048, downsample_hidden_size=480)
    thinker["vision_config"].update(depth=27, hidden_size=1152, num_heads=16, intermediate_size=4304, patch_size=16,
                                    spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=2048,
                                    deepstack_visual_indexes=[8, 16, 24])
    talker["text_config"].update(vocab_size=3072, hidden_size=1024, num_hidden_layers=20, num_attention_heads=16,
                                 num_key_value_heads=2, head_dim=128, num_experts=128, num_experts_per_tok=6,
                                 moe_intermediate_size=384, shared_expert_intermediate_size=768,
                                 intermediate_size=2048, rope_parameters=_rope([24, 20, 20]))
    talker["code_predictor_config"].update(vocab_size=2048, hidden_size=1024, num_hidden_layers=5,
                                           num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                                           intermediate_size=3072, num_code_groups=16)
    talker.update(thinker_hidden_size=2048, num_code_groups=16)
    config["code2wav_config"].update(codebook_size=2048, num_quantizers=16, hidden_size=1024, num_hidden_layers=8,
                                     num_attention_heads=16, num_key_value_heads=16, intermediate_size=3072,
                                     decoder_dim=1536)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out
