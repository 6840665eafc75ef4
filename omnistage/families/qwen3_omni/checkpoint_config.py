"""The ``config.json`` of a random checkpoint of one :class:`CheckpointSize`: real structure, chosen widths.

Every constraint of ``shared/qwen3_omni_facts.md`` holds at every size: encoder outputs and the talker's
thinker size equal the thinker hidden size, the code predictor's hidden size equals the talker's, all three
stages agree on the number of code groups, the talker vocabulary is 1024 + codebook size with the codec specials
and speakers in its top 1024 ids (with a 2048 codebook these are the real ids: pad 2148, eos 2150, ethan 2302),
and the real upsampling rates keep the output at 24 kHz.
"""

from __future__ import annotations

from omnistage.families.qwen3_omni.checkpoint_sizes import TINY, CheckpointSize, DecoderWidths
from omnistage.tiny.tokenizer import TokenizerLayout

# Codec ids sit at codebook size + these offsets (the real ones are 2048 + offset).
CODEC_OFFSETS = {"pad": 100, "bos": 101, "eos": 102, "nothink": 107, "think_bos": 108, "think_eos": 109}
SPEAKER_OFFSETS = {"chelsie": 253, "ethan": 254, "aiden": 255}


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _rope(size: CheckpointSize) -> dict[str, object]:
    return {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": list(size.mrope_section),
            "interleaved": True, "mrope_interleaved": True}


def _decoder(w: DecoderWidths) -> dict[str, object]:
    out: dict[str, object] = {
        "hidden_size": w.hidden, "intermediate_size": w.intermediate, "num_hidden_layers": w.layers,
        "num_attention_heads": w.heads, "num_key_value_heads": w.kv_heads, "head_dim": w.head_dim,
    }
    if w.experts:
        out.update({"moe_intermediate_size": w.moe_intermediate, "num_experts": w.experts,
                    "num_experts_per_tok": w.top_k, "norm_topk_prob": w.norm_topk_prob})
    return out


def _text_config(layout: TokenizerLayout, size: CheckpointSize) -> dict[str, object]:
    return {
        **_decoder(size.thinker), "vocab_size": _round_up(layout.vocab_size, 64),
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_parameters": _rope(size),
        "pad_token_id": layout.special_id("<|endoftext|>"),
    }


def _thinker_config(layout: TokenizerLayout, user_token_id: int, size: CheckpointSize) -> dict[str, object]:
    a, v, hidden = size.audio, size.vision, size.thinker.hidden
    audio = {
        "num_mel_bins": 128, "encoder_layers": a.layers, "encoder_attention_heads": a.heads,
        "encoder_ffn_dim": a.ffn, "d_model": a.hidden, "output_dim": hidden,
        "downsample_hidden_size": a.downsample_hidden, "n_window": 50, "n_window_infer": 800,
        "conv_chunksize": 500, "max_source_positions": 1500,
    }
    vision = {
        "depth": v.layers, "hidden_size": v.hidden, "intermediate_size": v.ffn, "num_heads": v.heads,
        "in_channels": 3, "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
        "out_hidden_size": hidden, "num_position_embeddings": 2304,
        "deepstack_visual_indexes": list(range(min(v.layers, 3))),
    }
    return {
        "audio_config": audio, "vision_config": vision, "text_config": _text_config(layout, size),
        "audio_token_id": layout.special_id("<|audio_pad|>"),
        "image_token_id": layout.special_id("<|image_pad|>"),
        "video_token_id": layout.special_id("<|video_pad|>"),
        "audio_start_token_id": layout.special_id("<|audio_start|>"),
        "vision_start_token_id": layout.special_id("<|vision_start|>"),
        "user_token_id": user_token_id, "position_id_per_seconds": 13,
    }


def _talker_config(layout: TokenizerLayout, size: CheckpointSize) -> dict[str, object]:
    codec = {name: size.codebook_size + off for name, off in CODEC_OFFSETS.items()}
    text = {
        **_decoder(size.talker), "vocab_size": size.talker_vocab,
        "shared_expert_intermediate_size": size.talker.shared_expert, "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6, "rope_parameters": _rope(size),
    }
    predictor = {
        **_decoder(size.code_predictor), "vocab_size": size.codebook_size, "num_code_groups": size.num_code_groups,
        "max_position_embeddings": 64, "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
    }
    return {
        "text_config": text, "code_predictor_config": predictor, "num_code_groups": size.num_code_groups,
        "thinker_hidden_size": size.thinker.hidden, "accept_hidden_layer": size.accept_hidden_layer,
        "codec_eos_token_id": codec["eos"], "codec_nothink_id": codec["nothink"],
        "codec_think_bos_id": codec["think_bos"], "codec_think_eos_id": codec["think_eos"],
        "codec_pad_id": codec["pad"], "codec_bos_id": codec["bos"],
        "audio_token_id": layout.special_id("<|audio_pad|>"),
        "image_token_id": layout.special_id("<|image_pad|>"),
        "video_token_id": layout.special_id("<|video_pad|>"),
        "vision_start_token_id": layout.special_id("<|vision_start|>"),
        "audio_start_token_id": layout.special_id("<|audio_start|>"),
        "position_id_per_seconds": 13, "spatial_merge_size": 2,
        "speaker_id": {name: size.codebook_size + off for name, off in SPEAKER_OFFSETS.items()},
    }


def _code2wav_config(size: CheckpointSize) -> dict[str, object]:
    w = size.code2wav
    return {
        "codebook_size": size.codebook_size, "hidden_size": w.hidden, "max_position_embeddings": 8000,
        "num_attention_heads": w.heads, "num_key_value_heads": w.heads, "sliding_window": 72,
        "intermediate_size": w.intermediate, "layer_scale_initial_scale": 0.01, "num_hidden_layers": w.layers,
        "num_quantizers": size.num_code_groups, "upsample_rates": [8, 5, 4, 3], "upsampling_ratios": [2, 2],
        "decoder_dim": w.decoder_dim, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    }


def checkpoint_config_dict(layout: TokenizerLayout, role_ids: dict[str, int],
                           size: CheckpointSize = TINY) -> dict[str, object]:
    """The whole ``config.json`` of a random checkpoint of ``size``."""
    return {
        "model_type": "qwen3_omni_moe",
        "architectures": ["Qwen3OmniMoeForConditionalGeneration"],
        "thinker_config": _thinker_config(layout, role_ids["user"], size),
        "talker_config": _talker_config(layout, size),
        "code2wav_config": _code2wav_config(size),
        "enable_audio_output": True,
        "im_start_token_id": layout.special_id("<|im_start|>"),
        "im_end_token_id": layout.special_id("<|im_end|>"),
        "tts_pad_token_id": layout.special_id("<tts_pad>"),
        "tts_bos_token_id": layout.special_id("<tts_text_bos>"),
        "tts_eos_token_id": layout.special_id("<tts_text_eod>"),
        "system_token_id": role_ids["system"],
        "user_token_id": role_ids["user"],
        "assistant_token_id": role_ids["assistant"],
        "torch_dtype": size.dtype,
    }
