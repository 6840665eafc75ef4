"""The config files of a random Qwen3-TTS checkpoint: the real structure at widths of one :class:`TTSSize`.

``tiny`` keeps tests to seconds: 4 code groups of 64 codes, hidden 32, a code predictor narrower than the talker
(so ``small_to_mtp_projection`` is exercised, as in the 1.7B model). ``medium`` has the real codec layout
(16 groups of 2048 codes, talker vocabulary 3072, the real codec, language and speaker ids) at widths where
compute dominates on a CPU, for TTS benchmarks. ``full`` is Qwen3-TTS-12Hz-0.6B as published (talker 28 x 1024, 16/8
heads of 128, intermediate 3072, text embedding 151936 x 2048 projected to 1024, code predictor 5 x 1024, the real
speech-tokenizer decoder and Mimi encoder, the ECAPA speaker encoder), stored in bf16 as the real model.safetensors
is; ``full-1.7b`` the 1.7B's widths (talker 28 x 2048, intermediate 6144, its code predictor still 1024 wide behind
``small_to_mtp_projection``), for measurement. Codec special ids sit at ``codebook_size + offset`` (the real ids
are ``2048 + offset``), speakers and languages likewise, all inside the vocabulary's top 1024.
"""

from __future__ import annotations

from dataclasses import dataclass

from omnistage.tiny.tokenizer import TokenizerLayout

TTS_MODEL_TYPES = ("custom_voice", "voice_design", "base")
CODEC_OFFSETS = {"pad": 100, "bos": 101, "eos": 102, "think": 106, "nothink": 107, "think_bos": 108,
                 "think_eos": 109}
LANGUAGE_OFFSETS = {"english": 2, "chinese": 7, "japanese": 9, "beijing_dialect": 26}
SPEAKER_OFFSETS = {"ryan": 1013, "aiden": 1014, "vivian": 1017, "dylan": 1020}
DIALECTS = {"dylan": "beijing_dialect"}


@dataclass(frozen=True)
class Stack:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int


@dataclass(frozen=True)
class TTSSize:
    name: str
    talker: Stack
    code_predictor: Stack
    text_hidden: int
    codec: Stack  # the decoder's transformer
    codec_latent: int
    codec_codebook_dim: int
    decoder_dim: int
    encoder: Stack  # the Mimi encoder's transformer
    encoder_filters: int
    encoder_quantizers: int
    speaker_channels: tuple[int, ...]
    codebook_size: int
    num_code_groups: int
    mrope_section: tuple[int, int, int]  # sums to the talker's head_dim / 2
    text_vocab: int = 0  # the text embedding's rows; 0: the made tokenizer's vocabulary rounded up to 64
    encoder_codebook_dim: int = 0  # the Mimi encoder's codebooks; 0: codec_codebook_dim
    speaker_widths: tuple[int, int, int] = (8, 4, 8)  # ECAPA attention channels, res2net scale, SE channels
    weight_dtype: str = "float32"  # model.safetensors' dtype (the codec's is always float32, as in the real one)

    def __post_init__(self) -> None:
        if sum(self.mrope_section) * 2 != self.talker.head_dim:
            raise ValueError(f"{self.name}: mrope_section must sum to the talker's head_dim / 2")


TINY = TTSSize(
    name="tiny", talker=Stack(32, 2, 4, 2, 16, 64), code_predictor=Stack(16, 1, 2, 1, 8, 32), text_hidden=48,
    codec=Stack(32, 2, 4, 4, 8, 64), codec_latent=32, codec_codebook_dim=16, decoder_dim=32,
    encoder=Stack(32, 1, 4, 4, 8, 64), encoder_filters=4, encoder_quantizers=8, speaker_channels=(16, 16, 16, 16, 48),
    codebook_size=64, num_code_groups=4, mrope_section=(4, 2, 2),
)
MEDIUM = TTSSize(
    name="medium", talker=Stack(256, 4, 4, 2, 64, 512), code_predictor=Stack(256, 5, 4, 2, 64, 512),
    text_hidden=256, codec=Stack(256, 2, 4, 4, 64, 512), codec_latent=256, codec_codebook_dim=256, decoder_dim=256,
    encoder=Stack(128, 2, 4, 4, 32, 256), encoder_filters=8, encoder_quantizers=32,
    speaker_channels=(64, 64, 64, 64, 192), codebook_size=2048, num_code_groups=16, mrope_section=(16, 8, 8),
)
_REAL_CODEC = dict(
    codec=Stack(512, 8, 16, 16, 64, 1024), codec_latent=1024, codec_codebook_dim=512, decoder_dim=1536,
    encoder=Stack(512, 8, 8, 8, 64, 2048), encoder_filters=64, encoder_quantizers=32, encoder_codebook_dim=256,
    speaker_channels=(512, 512, 512, 512, 1536), speaker_widths=(128, 8, 128), codebook_size=2048,
    num_code_groups=16, mrope_section=(24, 20, 20), text_hidden=2048, text_vocab=151936, weight_dtype="bfloat16",
)
FULL = TTSSize(name="full", talker=Stack(1024, 28, 16, 8, 128, 3072), code_predictor=Stack(1024, 5, 16, 8, 128, 3072),
               **_REAL_CODEC)
FULL_1_7B = TTSSize(name="full-1.7b", talker=Stack(2048, 28, 16, 8, 128, 6144),
                    code_predictor=Stack(1024, 5, 16, 8, 128, 3072), **_REAL_CODEC)
TTS_SIZES = {size.name: size for size in (TINY, MEDIUM, FULL, FULL_1_7B)}


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _stack(s: Stack) -> dict[str, object]:
    return {"hidden_size": s.hidden, "num_hidden_layers": s.layers, "num_attention_heads": s.heads,
            "num_key_value_heads": s.kv_heads, "head_dim": s.head_dim, "intermediate_size": s.intermediate}


def _talker(size: TTSSize, layout: TokenizerLayout) -> dict[str, object]:
    at = size.codebook_size
    predictor = {**_stack(size.code_predictor), "vocab_size": at, "num_code_groups": size.num_code_groups,
                 "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 1000000, "max_position_embeddings": 65536,
                 "model_type": "qwen3_tts_talker_code_predictor"}
    return {
        **_stack(size.talker), "model_type": "qwen3_tts_talker", "hidden_act": "silu", "rms_norm_eps": 1e-6,
        "rope_theta": 1000000, "max_position_embeddings": 32768, "vocab_size": at + 1024,
        "rope_scaling": {"interleaved": True, "mrope_section": list(size.mrope_section), "rope_type": "default",
                         "type": "default"},
        "text_vocab_size": size.text_vocab or _round_up(layout.vocab_size, 64), "text_hidden_size": size.text_hidden,
        "num_code_groups": size.num_code_groups, "code_predictor_config": predictor,
        "codec_eos_token_id": at + CODEC_OFFSETS["eos"],
        **{f"codec_{name}_id": at + off for name, off in CODEC_OFFSETS.items() if name != "eos"},
        "codec_language_id": {name: at + off for name, off in LANGUAGE_OFFSETS.items()},
        "spk_id": {name: at + off for name, off in SPEAKER_OFFSETS.items()},
        "spk_is_dialect": {name: DIALECTS.get(name, False) for name in SPEAKER_OFFSETS},
    }


def model_config(size: TTSSize, layout: TokenizerLayout, tts_model_type: str) -> dict[str, object]:
    """The whole ``config.json``."""
    if tts_model_type not in TTS_MODEL_TYPES:
        raise ValueError(f"tts_model_type must be one of {TTS_MODEL_TYPES}, got {tts_model_type!r}")
    channels, (attention, res2net, se) = size.speaker_channels, size.speaker_widths
    speaker = {"mel_dim": 128, "enc_dim": size.talker.hidden, "enc_channels": list(channels),
               "enc_kernel_sizes": [5] + [3] * (len(channels) - 2) + [1],
               "enc_dilations": [1] + list(range(2, len(channels))) + [1], "enc_attention_channels": attention,
               "enc_res2net_scale": res2net, "enc_se_channels": se, "sample_rate": 24000}
    return {
        "architectures": ["Qwen3TTSForConditionalGeneration"], "model_type": "qwen3_tts",
        "tokenizer_type": "qwen3_tts_tokenizer_12hz", "tts_model_size": size.name, "tts_model_type": tts_model_type,
        "im_start_token_id": layout.special_id("<|im_start|>"), "im_end_token_id": layout.special_id("<|im_end|>"),
        "tts_pad_token_id": layout.special_id("<tts_pad>"), "tts_bos_token_id": layout.special_id("<tts_text_bos>"),
        "tts_eos_token_id": layout.special_id("<tts_text_eod>"), "talker_config": _talker(size, layout),
        "speaker_encoder_config": speaker, "torch_dtype": size.weight_dtype,
    }


def speech_tokenizer_config(size: TTSSize) -> dict[str, object]:
    """``speech_tokenizer/config.json``: the real 1920-sample frames (24 kHz at 12.5 Hz) at ``size``'s widths."""
    decoder = {**_stack(size.codec), "codebook_size": size.codebook_size, "codebook_dim": size.codec_codebook_dim,
               "latent_dim": size.codec_latent, "num_quantizers": size.num_code_groups, "sliding_window": 72,
               "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 10000, "layer_scale_initial_scale": 0.01,
               "max_position_embeddings": 8000, "upsample_rates": [8, 5, 4, 3], "upsampling_ratios": [2, 2],
               "decoder_dim": size.decoder_dim, "attention_bias": False}
    encoder_codebook_dim = size.encoder_codebook_dim or size.codec_codebook_dim
    encoder = {**_stack(size.encoder), "model_type": "mimi", "sampling_rate": 24000, "frame_rate": 12.5,
               "num_filters": size.encoder_filters, "upsampling_ratios": [8, 6, 5, 4],
               "codebook_size": size.codebook_size, "codebook_dim": encoder_codebook_dim,
               "vector_quantization_hidden_dimension": encoder_codebook_dim,
               "num_quantizers": size.encoder_quantizers, "num_semantic_quantizers": 1,
               "upsample_groups": size.encoder.hidden, "sliding_window": 250, "use_causal_conv": True}
    return {"architectures": ["Qwen3TTSTokenizerV2Model"], "model_type": "qwen3_tts_tokenizer_12hz",
            "encoder_config": encoder, "decoder_config": decoder,
            "encoder_valid_num_quantizers": size.num_code_groups, "input_sample_rate": 24000,
            "output_sample_rate": 24000, "decode_upsample_rate": 1920, "encode_downsample_rate": 1920}


GENERATION_CONFIG = {"do_sample": True, "top_k": 50, "top_p": 1.0, "temperature": 0.9, "repetition_penalty": 1.05,
                     "subtalker_dosample": True, "subtalker_top_k": 50, "subtalker_top_p": 1.0,
                     "subtalker_temperature": 0.9, "max_new_tokens": 8192}
FEATURE_EXTRACTOR = {"feature_extractor_type": "EncodecFeatureExtractor", "feature_size": 1,
                     "padding_side": "right", "padding_value": 0.0, "return_attention_mask": True,
                     "sampling_rate": 24000}
