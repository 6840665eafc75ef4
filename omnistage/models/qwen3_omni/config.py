"""Qwen3-Omni's typed config: ``config.json`` parsed once into one frozen object every part reads.

transformers' ``Qwen3OmniMoeConfig`` (built from the same dict) gives the model shapes with their class
defaults; the facts the serving side needs (token ids that link thinker and talker, speakers, processor
settings, whether the checkpoint speaks) are read here, once, with the defaults the code relied on.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omnistage.models.codec_transformer import Code2WavConfig

if TYPE_CHECKING:
    from transformers import Qwen3OmniMoeConfig

MODEL_TYPE = "qwen3_omni_moe"
# M-RoPE's keys in the checkpoint's rope parameters: transformers' generic rope validation does not know them and
# warns on every config it builds, although its own Qwen3-Omni model reads them.
MROPE_KEYS = frozenset({"mrope_section", "interleaved", "mrope_interleaved"})


class _KnownRopeKeys(logging.Filter):
    """Drops transformers' "Unrecognized keys in `rope_parameters`" notice when the keys are M-RoPE's only."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not message.startswith("Unrecognized keys in `rope_parameters`"):
            return True
        return not all(key.strip(" '{}") in MROPE_KEYS for key in message.rpartition(":")[2].split(","))


@contextmanager
def quiet_known_rope_keys() -> Iterator[None]:
    """Only while a config is built, and only on the logger that warns (nothing else is filtered)."""
    rope_logger, known = logging.getLogger("transformers.modeling_rope_utils"), _KnownRopeKeys()
    rope_logger.addFilter(known)
    try:
        yield
    finally:
        rope_logger.removeFilter(known)


@dataclass(frozen=True)
class TalkerTokenIds:
    """The ids that link thinker and talker."""

    im_start: int
    assistant: int
    user: int
    tts_bos: int
    tts_eos: int
    tts_pad: int
    multimodal: frozenset[int]
    codec_prefix: tuple[int, int, int]  # nothink, think_bos, think_eos
    codec_pad: int
    codec_bos: int
    speakers: dict[str, int] = field(hash=False)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> TalkerTokenIds:
        thinker, talker = raw["thinker_config"], raw["talker_config"]
        return cls(
            im_start=raw["im_start_token_id"], assistant=raw["assistant_token_id"],
            user=raw["user_token_id"], tts_bos=raw["tts_bos_token_id"], tts_eos=raw["tts_eos_token_id"],
            tts_pad=raw["tts_pad_token_id"],
            multimodal=frozenset(thinker[k] for k in ("audio_token_id", "image_token_id", "video_token_id")),
            codec_prefix=(talker["codec_nothink_id"], talker["codec_think_bos_id"], talker["codec_think_eos_id"]),
            codec_pad=talker["codec_pad_id"], codec_bos=talker["codec_bos_id"],
            speakers={k.lower(): v for k, v in (talker.get("speaker_id") or {}).items()},
        )

    def speaker_id(self, name: str) -> int:
        try:
            return self.speakers[name.lower()]
        except KeyError:
            known = ", ".join(sorted(self.speakers)) or "none"
            raise ValueError(f"unknown voice {name!r} (this checkpoint has: {known})") from None


@dataclass(frozen=True)
class ProcessorSettings:
    """What the prompt processor needs when the folder lacks processor configs (a bare checkpoint)."""

    audio_token_id: int
    image_token_id: int
    video_token_id: int
    n_window: int
    num_mel_bins: int
    patch_size: int
    temporal_patch_size: int
    merge_size: int
    # The model's own rate: M-RoPE places video steps with it, so an interleaved audio-in-video layout uses it too.
    position_id_per_seconds: float = 25.0
    audio_start_token_id: int | None = None  # an interleaved video's markers (None: from the tokenizer, or none)
    audio_end_token_id: int | None = None
    n_window_infer: int = 0  # mel frames per attention window of the audio encoder (0: the whole audio)

    @classmethod
    def from_dict(cls, thinker: Mapping[str, Any]) -> ProcessorSettings:
        audio, vision = thinker["audio_config"], thinker["vision_config"]
        start, end = thinker.get("audio_start_token_id"), thinker.get("audio_end_token_id")
        return cls(int(thinker["audio_token_id"]), int(thinker["image_token_id"]), int(thinker["video_token_id"]),
                   int(audio.get("n_window", 50)), int(audio.get("num_mel_bins", 128)),
                   int(vision.get("patch_size", 16)), int(vision.get("temporal_patch_size", 2)),
                   int(vision.get("spatial_merge_size", 2)), float(thinker.get("position_id_per_seconds", 25)),
                   None if start is None else int(start), None if end is None else int(end),
                   int(audio.get("n_window_infer", 0) or 0))


@dataclass(frozen=True)
class Qwen3OmniConfig:
    hf: Qwen3OmniMoeConfig = field(repr=False)  # transformers' config (model shapes, class defaults filled)
    im_end_token_id: int
    max_positions: int  # the thinker's context
    processor: ProcessorSettings
    # None for a checkpoint that does not speak (Thinking: no talker/code2wav, or enable_audio_output false).
    talker_ids: TalkerTokenIds | None = None
    num_code_groups: int = 16
    code2wav: Code2WavConfig | None = None
    speakers: tuple[str, ...] = ()  # talker_config.speaker_id's names, as the checkpoint spells them

    @property
    def voices(self) -> tuple[str, ...]:
        """The speakers as the API lists them, capitalised (lookups ignore case)."""
        return tuple(name[:1].upper() + name[1:] for name in self.speakers)

    @property
    def has_talker(self) -> bool:
        return self.talker_ids is not None

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Qwen3OmniConfig:
        from transformers import Qwen3OmniMoeConfig

        thinker = raw["thinker_config"]
        speaks = bool(raw.get("enable_audio_output", True)) and "talker_config" in raw
        talker = raw.get("talker_config") or {}
        with quiet_known_rope_keys():
            hf = Qwen3OmniMoeConfig.from_dict(dict(raw))
        return cls(
            hf=hf,
            im_end_token_id=int(raw["im_end_token_id"]),
            max_positions=int(thinker["text_config"].get("max_position_embeddings", 32768)),
            processor=ProcessorSettings.from_dict(thinker),
            talker_ids=TalkerTokenIds.from_dict(raw) if speaks else None,
            num_code_groups=int(talker.get("num_code_groups", 16)),
            code2wav=Code2WavConfig.from_hf(raw["code2wav_config"]) if speaks and "code2wav_config" in raw else None,
            speakers=tuple(talker.get("speaker_id") or {}),
        )

    @classmethod
    def from_folder(cls, folder: str | Path) -> Qwen3OmniConfig:
        return cls.from_dict(json.loads((Path(folder) / "config.json").read_text()))


def is_qwen3_omni(raw: Mapping[str, Any]) -> bool:
    """Whether a parsed config.json is a Qwen3-Omni checkpoint's (the family's recogniser)."""
    return raw.get("model_type") == MODEL_TYPE or "thinker_config" in raw
