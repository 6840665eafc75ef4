"""The model as the API presents it: the names requests may use, its voices, its default output."""

from __future__ import annotations

from dataclasses import dataclass

from omnistage.audio.formats import PCM_RATE
from omnistage.entrypoints.openai.common.errors import model_not_found
from omnistage.entrypoints.openai.common.voice_names import VoiceBook
from omnistage.entrypoints.openai.engine_protocol import OmniEngine
from omnistage.entrypoints.openai.server_config import ServingOptions


def audio_rate(engine: OmniEngine) -> int:
    """The rate the served family's audio comes at (its ``AudioSpec``; the API encoders resample from it to
    what each wire format takes). A model that makes no audio encodes none: PCM's rate then."""
    audio = engine.front_end.audio
    return audio.sample_rate if audio is not None else PCM_RATE


@dataclass(frozen=True)
class ServedModel:
    names: tuple[str, ...]
    voices: VoiceBook
    default_modalities: tuple[str, ...] = ("text",)

    @classmethod
    def of(cls, engine: OmniEngine, options: ServingOptions | None = None) -> ServedModel:
        options = options or ServingOptions()
        return cls(options.served_model_names or (engine.model_name,),
                   VoiceBook(engine.front_end.voices, engine.front_end.openai_voices, dict(options.voice_aliases),
                             engine.front_end.default_voice),
                   options.default_modalities)

    def check(self, name: str) -> None:
        if name not in self.names:
            raise model_not_found(name)
