"""The tiny Qwen3-Omni config: real structure, toy sizes.

Every constraint of ``shared/qwen3_omni_facts.md`` holds here: encoder outputs
and the talker's thinker size equal the thinker hidden size, the code
predictor's hidden size equals the talker's, all three stages agree on the
number of code groups, the talker vocabulary is 1024 + codebook size with the
codec specials and speakers in its top 1024 ids, and the real upsampling rates
keep the output at 24 kHz.
"""

from __future__ import annotations

from omnistage.tools.tiny_tokenizer import TokenizerLayout

THINKER_HIDDEN = 32
TALKER_HIDDEN = 32
CODEBOOK_SIZE = 64
NUM_CODE_GROUPS = 4
# Real codec ids are 2048 + offset; the tiny ones keep the offsets above the codebook.
CODEC_OFFSETS = {"pad": 100, "bos": 101, "eos": 102, "nothink": 107, "think_bos": 108, "think_eos": 109}
SPEAKER_OFFSETS = {"chelsie": 253, "ethan": 254, "aiden": 255}
MROPE_SECTION = [4, 2, 2]  # sums to head_dim / 2 = 8


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _text_config(layout: TokenizerLayout) -> dict[str, object]:
    return {
        "vocab_size": _round_up(layout.vocab_size, 64), "hidden_size": THINKER_HIDDEN, "intermediate_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "moe_intermediate_size": 16, "num_experts": 4, "num_experts_per_tok": 2, "norm_topk_prob": True,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0,
                            "mrope_section": MROPE_SECTION, "interleaved": True, "mrope_interleaved": True},
        "pad_token_id": layout.special_id("<|endoftext|>"),
    }


def _thinker_config(layout: TokenizerLayout, user_token_id: int) -> dict[str, object]:
    audio = {
        "num_mel_bins": 128, "encoder_layers": 2, "encoder_attention_heads": 2, "encoder_ffn_dim": 64,
        "d_model": 32, "output_dim": THINKER_HIDDEN, "downsample_hidden_size": 16, "n_window": 50,
        "n_window_infer": 800, "conv_chunksize": 500, "max_source_positions": 1500,
    }
    vision = {
        "depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "in_channels": 3,
        "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
        "out_hidden_size": THINKER_HIDDEN, "num_position_embeddings": 2304, "deepstack_visual_indexes": [0, 1],
    }
    return {
        "audio_config": audio, "vision_config": vision, "text_config": _text_config(layout),
        "audio_token_id": layout.special_id("<|audio_pad|>"),
        "image_token_id": layout.special_id("<|image_pad|>"),
        "video_token_id": layout.special_id("<|video_pad|>"),
        "audio_start_token_id": layout.special_id("<|audio_start|>"),
        "vision_start_token_id": layout.special_id("<|vision_start|>"),
        "user_token_id": user_token_id, "position_id_per_seconds": 13,
    }


def _talker_config(layout: TokenizerLayout) -> dict[str, object]:
    codec = {name: CODEBOOK_SIZE + off for name, off in CODEC_OFFSETS.items()}
    text = {
        "vocab_size": 1024 + CODEBOOK_SIZE, "hidden_size": TALKER_HIDDEN, "intermediate_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "moe_intermediate_size": 16, "num_experts": 4, "num_experts_per_tok": 2, "norm_topk_prob": False,
        "shared_expert_intermediate_size": 32, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0,
                            "mrope_section": MROPE_SECTION, "interleaved": True, "mrope_interleaved": True},
    }
    predictor = {
        "vocab_size": CODEBOOK_SIZE, "hidden_size": TALKER_HIDDEN, "intermediate_size": 64,
        "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
        "num_code_groups": NUM_CODE_GROUPS, "max_position_embeddings": 64,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
    }
    return {
        "text_config": text, "code_predictor_config": predictor, "num_code_groups": NUM_CODE_GROUPS,
        "thinker_hidden_size": THINKER_HIDDEN, "accept_hidden_layer": 1,
        "codec_eos_token_id": codec["eos"], "codec_nothink_id": codec["nothink"],
        "codec_think_bos_id": codec["think_bos"], "codec_think_eos_id": codec["think_eos"],
        "codec_pad_id": codec["pad"], "codec_bos_id": codec["bos"],
        "audio_token_id": layout.special_id("<|audio_pad|>"),
        "image_token_id": layout.special_id("<|image_pad|>"),
        "video_token_id": layout.special_id("<|video_pad|>"),
        "vision_start_token_id": layout.special_id("<|vision_start|>"),
        "audio_start_token_id": layout.special_id("<|audio_start|>"),
        "position_id_per_seconds": 13, "spatial_merge_size": 2,
        "speaker_id": {name: CODEBOOK_SIZE + off for name, off in SPEAKER_OFFSETS.items()},
    }


def _code2wav_config() -> dict[str, object]:
    return {
        "codebook_size": CODEBOOK_SIZE, "hidden_size": 32, "max_position_embeddings": 8000,
        "num_attention_heads": 4, "num_key_value_heads": 4, "sliding_window": 72, "intermediate_size": 64,
        "layer_scale_initial_scale": 0.01, "num_hidden_layers": 2, "num_quantizers": NUM_CODE_GROUPS,
        "upsample_rates": [8, 5, 4, 3], "upsampling_ratios": [2, 2], "decoder_dim": 32,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    }


def tiny_config_dict(layout: TokenizerLayout, role_ids: dict[str, int]) -> dict[str, object]:
    """The whole ``config.json`` of the tiny checkpoint."""
    return {
        "model_type": "qwen3_omni_moe",
        "architectures": ["Qwen3OmniMoeForConditionalGeneration"],
        "thinker_config": _thinker_config(layout, role_ids["user"]),
        "talker_config": _talker_config(layout),
        "code2wav_config": _code2wav_config(),
        "enable_audio_output": True,
        "im_start_token_id": layout.special_id("<|im_start|>"),
        "im_end_token_id": layout.special_id("<|im_end|>"),
        "tts_pad_token_id": layout.special_id("<tts_pad>"),
        "tts_bos_token_id": layout.special_id("<tts_text_bos>"),
        "tts_eos_token_id": layout.special_id("<tts_text_eod>"),
        "system_token_id": role_ids["system"],
        "user_token_id": role_ids["user"],
        "assistant_token_id": role_ids["assistant"],
        "torch_dtype": "float32",
    }
