"""The model as the API presents it: the names requests may use, its voices, its default output."""

from __future__ import annotations

from dataclasses import dataclass

from omnistage.entrypoints.openai.common.errors import model_not_found
from omnistage.entrypoints.openai.common.voice_names import VoiceBook
from omnistage.entrypoints.openai.engine_protocol import OmniEngine
from omnistage.entrypoints.openai.server_config import ServingOptions


@dataclass(frozen=True)
class ServedModel:
    names: tuple[str, ...]
    voices: VoiceBook
    default_modalities: tuple[str, ...] = ("text",)

    @classmethod
    def of(cls, engine: OmniEngine, options: ServingOptions | None = None) -> ServedModel:
        options = options or ServingOptions()
        return cls(options.served_model_names or (engine.model_name,),
                   VoiceBook(engine.voices, engine.openai_voices, dict(options.voice_aliases), engine.default_voice),
                   options.default_modalities)

    def check(self, name: str) -> None:
        if name not in self.names:
            raise model_not_found(name)
