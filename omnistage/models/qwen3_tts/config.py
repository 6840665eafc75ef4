"""Qwen3-TTS's typed configuration, parsed once from a checkpoint folder.

``config.json`` (the talker, its code predictor, the speaker encoder of Base models, the special token ids) and
``speech_tokenizer/config.json`` (the 12 Hz codec: a Mimi encoder and Qwen's decoder) become frozen dataclasses;
nothing else in omnistage reads these files. Absent keys take the reference classes' defaults
(``qwen_tts``'s ``Qwen3TTSConfig``, ``Qwen3TTSTokenizerV2Config``), except where the reference has none.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omnistage.models.decoder import DecoderConfig
from omnistage.models.qwen3_tts.codec_config import SpeechTokenizerConfig

MODEL_TYPE = "qwen3_tts"
TOKENIZER_FOLDER = "speech_tokenizer"
TTS_MODEL_TYPES = ("custom_voice", "voice_design", "base")


def _pairs(mapping: Mapping[str, Any] | None, value=int) -> tuple[tuple[str, Any], ...]:
    """A config dict as sorted pairs with lower-case keys: immutable, hashable and picklable."""
    return tuple(sorted((str(k).lower(), v if value is None else value(v)) for k, v in (mapping or {}).items()))


def _decoder(raw: Mapping[str, Any], defaults: Mapping[str, Any]) -> DecoderConfig:
    """A Qwen3 decoder stack (talker, code predictor) from its config dict; rope keys as 4.x or 5.x write them."""
    cfg = {**defaults, **raw}
    rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise ValueError(f"only default rotary embeddings are supported, got {rope}")
    heads = int(cfg["num_attention_heads"])
    return DecoderConfig(
        hidden_size=int(cfg["hidden_size"]), num_layers=int(cfg["num_hidden_layers"]), num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads),
        intermediate_size=int(cfg["intermediate_size"]), rms_norm_eps=float(cfg["rms_norm_eps"]),
        rope_theta=float(rope.get("rope_theta", cfg["rope_theta"])),
        # The talker's M-RoPE gets equal positions on all three axes (text only), which is plain RoPE.
        mrope_section=None, attention_bias=bool(cfg.get("attention_bias", False)),
        hidden_act=str(cfg.get("hidden_act", "silu")),
    )


_TALKER_DEFAULTS = {"hidden_size": 1024, "intermediate_size": 2048, "num_hidden_layers": 20,
                    "num_attention_heads": 16, "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "rope_theta": 10000}
_PREDICTOR_DEFAULTS = {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 5,
                       "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-6,
                       "rope_theta": 10000}


@dataclass(frozen=True)
class CodecIds:
    """Codec-track special ids (in the talker vocabulary's top 1024)."""

    pad: int
    bos: int
    eos: int
    think: int
    nothink: int
    think_bos: int
    think_eos: int

    @classmethod
    def from_talker(cls, raw: Mapping[str, Any]) -> CodecIds:
        get = {"pad": 4196, "bos": 4197, "eos": 4198, "think": 4202, "nothink": 4203, "think_bos": 4204,
               "think_eos": 4205}
        keys = {"eos": "codec_eos_token_id"}
        return cls(**{name: int(raw.get(keys.get(name, f"codec_{name}_id"), d)) for name, d in get.items()})


@dataclass(frozen=True)
class CodePredictorConfig:
    stack: DecoderConfig
    vocab_size: int  # ids per residual codebook
    num_code_groups: int


@dataclass(frozen=True)
class TalkerConfig:
    """The talker (codebook 0 per step) and what its prompts are built from."""

    stack: DecoderConfig
    vocab_size: int  # codebook 0 below vocab - 1024, codec specials, languages and speakers above
    text_vocab_size: int
    text_hidden_size: int
    num_code_groups: int
    codec: CodecIds
    speaker_ids: tuple[tuple[str, int], ...]  # lower-case name -> codec id (CustomVoice)
    dialect_pairs: tuple[tuple[str, str | bool], ...]  # name -> the dialect's language name, or False
    language_ids: tuple[tuple[str, int], ...]  # lower-case language -> codec id
    code_predictor: CodePredictorConfig
    max_positions: int = 32768  # the talker's rotary positions (prompt + frames)

    @property
    def speakers(self) -> dict[str, int]:
        return dict(self.speaker_ids)

    @property
    def speaker_dialects(self) -> dict[str, str | bool]:
        return dict(self.dialect_pairs)

    @property
    def languages(self) -> dict[str, int]:
        return dict(self.language_ids)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> TalkerConfig:
        predictor_raw = raw.get("code_predictor_config") or {}
        predictor = CodePredictorConfig(
            stack=_decoder(predictor_raw, _PREDICTOR_DEFAULTS), vocab_size=int(predictor_raw.get("vocab_size", 2048)),
            num_code_groups=int(predictor_raw.get("num_code_groups", 32)))
        return cls(
            stack=_decoder(raw, _TALKER_DEFAULTS), vocab_size=int(raw.get("vocab_size", 3072)),
            text_vocab_size=int(raw["text_vocab_size"]), text_hidden_size=int(raw.get("text_hidden_size", 2048)),
            num_code_groups=int(raw.get("num_code_groups", 32)), codec=CodecIds.from_talker(raw),
            speaker_ids=_pairs(raw.get("spk_id")), dialect_pairs=_pairs(raw.get("spk_is_dialect"), value=None),
            language_ids=_pairs(raw.get("codec_language_id")),
            code_predictor=predictor, max_positions=int(raw.get("max_position_embeddings", 32768)),
        )


@dataclass(frozen=True)
class SpeakerEncoderConfig:
    """The ECAPA-TDNN x-vector extractor of Base models (128 log-mel bins of 24 kHz audio in)."""

    mel_dim: int = 128
    enc_dim: int = 1024
    enc_channels: tuple[int, ...] = (512, 512, 512, 512, 1536)
    enc_kernel_sizes: tuple[int, ...] = (5, 3, 3, 3, 1)
    enc_dilations: tuple[int, ...] = (1, 2, 3, 4, 1)
    enc_attention_channels: int = 128
    enc_res2net_scale: int = 8
    enc_se_channels: int = 128
    sample_rate: int = 24000

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> SpeakerEncoderConfig:
        known = cls.__dataclass_fields__
        values = {k: (tuple(v) if isinstance(v, list) else v) for k, v in raw.items() if k in known}
        out = cls(**values)
        if not len(out.enc_channels) == len(out.enc_kernel_sizes) == len(out.enc_dilations) >= 2:
            raise ValueError("speaker encoder: enc_channels, enc_kernel_sizes and enc_dilations need one length >= 2")
        return out


@dataclass(frozen=True)
class TokenIds:
    """Text-vocabulary ids the prompts are built from."""

    im_start: int = 151644
    im_end: int = 151645
    tts_pad: int = 151671
    tts_bos: int = 151672
    tts_eos: int = 151673


@dataclass(frozen=True)
class Qwen3TTSConfig:
    """One Qwen3-TTS checkpoint: ``tts_model_type`` says which voices it takes (named speakers and instructions,
    a voice description, or a reference recording)."""

    tts_model_type: str  # custom_voice | voice_design | base
    tts_model_size: str  # e.g. 0b6, 1b7: the reference drops instructions for 0b6 CustomVoice models
    talker: TalkerConfig
    speech_tokenizer: SpeechTokenizerConfig
    token_ids: TokenIds
    speaker_encoder: SpeakerEncoderConfig | None  # Base models only

    def __post_init__(self) -> None:
        if self.tts_model_type not in TTS_MODEL_TYPES:
            raise ValueError(f"tts_model_type {self.tts_model_type!r} is not one of {TTS_MODEL_TYPES}")
        decoder = self.speech_tokenizer.decoder
        if decoder.num_quantizers != self.talker.num_code_groups:
            raise ValueError(f"the talker makes {self.talker.num_code_groups} codebooks, the codec decodes "
                             f"{decoder.num_quantizers}")
        if decoder.codebook_size != self.talker.code_predictor.vocab_size:
            raise ValueError("the code predictor's vocabulary must be the codec's codebook size")
        if self.talker.vocab_size < decoder.codebook_size + 1024:
            raise ValueError("the talker vocabulary must hold the codebook below its top 1024 special ids")
        if self.speaker_encoder is not None and self.speaker_encoder.enc_dim != self.talker.stack.hidden_size:
            raise ValueError("the speaker encoder's enc_dim must equal the talker's hidden size")

    @property
    def is_base(self) -> bool:
        return self.tts_model_type == "base"

    @property
    def takes_instructions(self) -> bool:
        """VoiceDesign always; CustomVoice except the 0.6B model (the reference ignores them there)."""
        return self.tts_model_type == "voice_design" or (
            self.tts_model_type == "custom_voice" and self.tts_model_size not in "0b6")

    @classmethod
    def from_dicts(cls, raw: Mapping[str, Any], tokenizer_raw: Mapping[str, Any]) -> Qwen3TTSConfig:
        if raw.get("model_type") != MODEL_TYPE:
            raise ValueError(f"config.json model_type is {raw.get('model_type')!r}, not {MODEL_TYPE!r}")
        kind = str(raw.get("tts_model_type"))
        names = {f: raw[f"{f}_token_id"] for f in TokenIds.__dataclass_fields__ if f"{f}_token_id" in raw}
        speaker = raw.get("speaker_encoder_config") or {}
        return cls(
            tts_model_type=kind, tts_model_size=str(raw.get("tts_model_size") or ""),
            talker=TalkerConfig.from_dict(raw.get("talker_config") or {}),
            speech_tokenizer=SpeechTokenizerConfig.from_dict(tokenizer_raw), token_ids=TokenIds(**names),
            speaker_encoder=SpeakerEncoderConfig.from_dict(speaker) if kind == "base" else None,
        )

    @classmethod
    def from_folder(cls, folder: str | Path) -> Qwen3TTSConfig:
        folder = Path(folder)
        tokenizer = folder / TOKENIZER_FOLDER / "config.json"
        if not tokenizer.is_file():
            raise FileNotFoundError(f"{folder} has no {TOKENIZER_FOLDER}/config.json (the 12 Hz speech tokenizer)")
        return cls.from_dicts(json.loads((folder / "config.json").read_text()), json.loads(tokenizer.read_text()))


def is_qwen3_tts(folder: str | Path) -> bool:
    """Whether a checkpoint folder's config.json names this family (what ``verify``/``make-tiny`` dispatch on)."""
    path = Path(folder) / "config.json"
    return path.is_file() and json.loads(path.read_text()).get("model_type") == MODEL_TYPE
