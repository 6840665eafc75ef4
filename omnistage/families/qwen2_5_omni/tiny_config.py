"""The ``config.json`` of a random tiny Qwen2.5-Omni checkpoint: the real wiring at toy widths.

Constraints every tiny config must keep (transformers does not check them):

* the audio encoder's ``output_dim``, the vision encoder's ``out_hidden_size`` and the talker's ``embedding_size``
  equal the thinker's hidden size (the talker is fed the thinker's embeddings and hidden states);
* each decoder's ``mrope_section`` sums to ``head_dim / 2`` (Qwen2.5 lays its sections out consecutively, not
  interleaved as Qwen3-Omni does);
* the talker keeps the real vocabulary (8448) and codec ids (pad 8292, bos 8293, eos 8294, mask 8296), because
  transformers' ``generate`` hard-codes ``talker_eos_token_id=[8292, 8294]``; the DiT's codec table covers the
  whole talker vocabulary (``num_embeds`` 8448 where the real one has 8193), so no sampled code falls outside it;
* the ECAPA speaker encoder's last channel count is the sum of the three before it (its MFA concatenates them);
* BigVGAN keeps the real upsampling (5·3·2·2·2·2 = 240 samples per mel frame, 2 mel frames per code) so the
  output stays 24 kHz at 50 codes a second.

Special tokens come from the shared offline tokenizer (:mod:`omnistage.tiny.tokenizer`): the placeholders
are Qwen3-Omni's strings (``<|audio_pad|>``...), named to the processor through ``extra_special_tokens``, so the
ids in this config are that tokenizer's.
"""

from __future__ import annotations

from omnistage.tiny.tokenizer import TokenizerLayout

HIDDEN = 32
MROPE_SECTION = [4, 2, 2]  # head_dim 16
CODEC = {"pad": 8292, "bos": 8293, "eos": 8294, "mask": 8296}
TALKER_VOCAB = 8448
# Speakers and the thinker-vocabulary id that opens their talker text (past the tokenizer, in the padded rows).
SPEAKERS = ("Chelsie", "Ethan")


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def thinker_vocab(layout: TokenizerLayout) -> int:
    """The thinker's vocabulary: the tokenizer's, padded so the speakers' text-bos ids fit after it."""
    return _round_up(layout.vocab_size + len(SPEAKERS), 64)


def speaker_bos_ids(layout: TokenizerLayout) -> dict[str, int]:
    return {name: layout.vocab_size + i for i, name in enumerate(SPEAKERS)}


def _rope() -> dict[str, object]:
    return {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": list(MROPE_SECTION)}


def _ids(layout: TokenizerLayout) -> dict[str, int]:
    s = layout.special_id
    return {"audio_token_index": s("<|audio_pad|>"), "image_token_index": s("<|image_pad|>"),
            "video_token_index": s("<|video_pad|>"), "audio_start_token_id": s("<|audio_start|>"),
            "audio_end_token_id": s("<|audio_end|>")}


def _thinker(layout: TokenizerLayout, user_token_id: int) -> dict[str, object]:
    audio = {"num_mel_bins": 128, "encoder_layers": 2, "encoder_attention_heads": 2, "encoder_ffn_dim": 64,
             "d_model": 32, "output_dim": HIDDEN, "n_window": 100, "max_source_positions": 1500}
    vision = {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "in_channels": 3,
              "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 112,
              "fullatt_block_indexes": [1], "out_hidden_size": HIDDEN}
    text = {"vocab_size": thinker_vocab(layout), "hidden_size": HIDDEN, "intermediate_size": 64,
            "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
            "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_parameters": _rope(),
            "tie_word_embeddings": False}
    return {"audio_config": audio, "vision_config": vision, "text_config": text, **_ids(layout),
            "vision_start_token_id": layout.special_id("<|vision_start|>"),
            "vision_end_token_id": layout.special_id("<|vision_end|>"),
            "user_token_id": user_token_id, "position_id_per_seconds": 25, "seconds_per_chunk": 2}


def _talker(layout: TokenizerLayout) -> dict[str, object]:
    s = layout.special_id
    return {
        "vocab_size": TALKER_VOCAB, "embedding_size": HIDDEN, "hidden_size": HIDDEN, "intermediate_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_parameters": _rope(),
        "tts_text_start_token_id": s("<tts_text_bos>"), "tts_text_end_token_id": s("<tts_text_eod>"),
        "tts_text_pad_token_id": s("<tts_pad>"), "tts_codec_start_token_id": CODEC["bos"],
        "tts_codec_end_token_id": CODEC["eos"], "tts_codec_pad_token_id": CODEC["pad"],
        "tts_codec_mask_token_id": CODEC["mask"], "vision_start_token_id": s("<|vision_start|>"),
        "vision_end_token_id": s("<|vision_end|>"), "spatial_merge_size": 2, "position_id_per_seconds": 25,
        "seconds_per_chunk": 2, **_ids(layout),
    }


def _token2wav() -> dict[str, object]:
    dit = {"hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 2, "head_dim": 16, "ff_mult": 2,
           "emb_dim": 16, "mel_dim": 80, "block_size": 24, "look_ahead_layers": [1], "look_backward_layers": [0, 2],
           "repeats": 2, "num_embeds": TALKER_VOCAB, "enc_emb_dim": 16, "enc_dim": 16,
           "enc_channels": [32, 32, 32, 32, 96], "enc_kernel_sizes": [5, 3, 3, 3, 1], "enc_dilations": [1, 2, 3, 4, 1],
           "enc_attention_channels": 16, "enc_se_channels": 16, "max_position_embeddings": 32768,
           "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}
    bigvgan = {"mel_dim": 80, "upsample_initial_channel": 64, "resblock_kernel_sizes": [3, 7, 11],
               "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5], [1, 3, 5]], "upsample_rates": [5, 3, 2, 2, 2, 2],
               "upsample_kernel_sizes": [11, 7, 4, 4, 4, 4]}
    return {"dit_config": dit, "bigvgan_config": bigvgan}


def tiny_config_dict(layout: TokenizerLayout, role_ids: dict[str, int]) -> dict[str, object]:
    """The whole ``config.json``."""
    return {
        "model_type": "qwen2_5_omni",
        "architectures": ["Qwen2_5OmniForConditionalGeneration"],
        "thinker_config": _thinker(layout, role_ids["user"]),
        "talker_config": _talker(layout),
        "token2wav_config": _token2wav(),
        "enable_audio_output": True,
        "torch_dtype": "float32",
    }
