"""Qwen3-TTS as a registered family: recognised from config.json, its typed config, its tool hooks."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from omnistage.families.base import EdgeContext, Family, FrontEnd, Hooks
from omnistage.ipc.messages import PayloadTypes
from omnistage.models.qwen3_tts.config import MODEL_TYPE, Qwen3TTSConfig

PRESET = "qwen3_tts"


class Qwen3TTSFamily(Family):
    name = "qwen3_tts"
    stage_models = MappingProxyType({})
    edges = MappingProxyType({})
    payloads = PayloadTypes(())
    hooks = Hooks(make_tiny="omnistage.tools.make_tiny_tts:make_tiny_command",
                  verify="omnistage.tools.verify.tts_cli:run_tts_verify_command",
                  cached="omnistage.tools.make_tiny_tts:cached_checkpoint",
                  tiny_names=("tts-tiny", "tts-tiny-design", "tts-tiny-base", "tts-medium", "tts-medium-design",
                              "tts-medium-base"))

    def recognises(self, raw: Mapping[str, Any]) -> bool:
        return raw.get("model_type") == MODEL_TYPE

    def load_config(self, folder: Path) -> Qwen3TTSConfig:
        return Qwen3TTSConfig.from_folder(folder)

    def preset(self, config: object) -> str:
        return PRESET

    def front_end(self, folder: Path, config: object) -> FrontEnd:
        raise NotImplementedError("serving Qwen3-TTS is not wired yet")

    def entry_input(self, context: EdgeContext) -> object:
        raise NotImplementedError("serving Qwen3-TTS is not wired yet")


FAMILY = Qwen3TTSFamily()
