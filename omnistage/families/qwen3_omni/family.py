"""Qwen3-Omni as a registered family: its stage models, edges, payloads, presets and tool hooks."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from omnistage.audio_spec import AudioSpec, Codebooks
from omnistage.config.pipeline import ConfigError, PipelineSpec
from omnistage.core import Modality
from omnistage.families.base import EdgeContext, EdgeModel, Family, FrontEnd, Hooks, StageModel
from omnistage.families.qwen3_omni.edges import ThinkerToTalker
from omnistage.families.qwen3_omni.payloads import PAYLOADS, ThinkerPrompt
from omnistage.families.qwen3_omni.voices import DEFAULT_VOICE, OPENAI_VOICES
from omnistage.models.qwen3_omni.config import MODEL_TYPE, Qwen3OmniConfig, is_qwen3_omni
from omnistage.families.qwen3_omni.prompt import Qwen3OmniPrompt

PRESET = Path(__file__).with_name("qwen3_omni.yaml")  # Instruct: thinker → talker → code2wav
TEXT_ONLY_PRESET = Path(__file__).with_name("qwen3_omni_thinking.yaml")  # Thinking (no talker): the thinker alone
_WORKERS = "omnistage.families.qwen3_omni.workers"
_MAKE_TINY = "omnistage.families.qwen3_omni.make_tiny"  # the family's make-tiny hook, in its package


class Qwen3OmniFamily(Family):
    name = "qwen3_omni"
    model_types = (MODEL_TYPE,)
    stage_models = MappingProxyType({
        "thinker": StageModel("ar", f"{_WORKERS}:ThinkerWorker", output=Modality.TEXT, entry=True,
                              tensor_parallel=True),
        "talker": StageModel("ar", f"{_WORKERS}:TalkerWorker"),
        "code2wav": StageModel("generation", f"{_WORKERS}:Code2WavWorker", output=Modality.AUDIO),
    })
    edges = MappingProxyType({
        "qwen3_omni.thinker_to_talker": EdgeModel("thinker", "talker", ThinkerToTalker),
        "qwen3_omni.talker_to_code2wav": EdgeModel("talker", "code2wav"),  # the generic codec edge
    })
    payloads = PAYLOADS
    hooks = Hooks(make_tiny=f"{_MAKE_TINY}:make_tiny_command", verify="omnistage.tools.verify.cli:run_omni_verify",
                  cached=f"{_MAKE_TINY}:cached_checkpoint", tiny_names=("tiny", "medium", "slice"))

    def recognises(self, raw: Mapping[str, Any]) -> bool:
        """Its model_type, or (an older or hand-made config without one) a thinker config."""
        return is_qwen3_omni(raw)

    def load_config(self, folder: Path) -> Qwen3OmniConfig:
        return Qwen3OmniConfig.from_folder(folder)

    def preset(self, config: object) -> Path:
        """Thinking checkpoints (``enable_audio_output: false`` or no ``talker_config``) serve text only."""
        return PRESET if _config(config).has_talker else TEXT_ONLY_PRESET

    def check_spec(self, spec: PipelineSpec, config: object) -> None:
        if not _config(config).has_talker and any(s.model != "thinker" for s in spec.stages):
            raise ConfigError(f"stages: this checkpoint has no talker (a Thinking/text-only checkpoint) but the "
                              f"stage config has talker/code2wav stages; use the {TEXT_ONLY_PRESET.stem} preset")

    def front_end(self, folder: Path, config: object) -> FrontEnd:
        from omnistage.families.qwen3_omni.prompt import Qwen3OmniPromptProcessor

        cfg = _config(config)
        processor = Qwen3OmniPromptProcessor(folder, cfg.processor)
        default = next((v for v in cfg.voices if v.lower() == DEFAULT_VOICE.lower()), "")
        return FrontEnd(processor.tokenizer, processor, cfg.voices, cfg.max_positions, _audio(cfg),
                        openai_voices=OPENAI_VOICES, default_voice=default)

    def entry_input(self, context: EdgeContext) -> ThinkerPrompt:
        request = context.request
        prompt = request.prompt
        if not isinstance(prompt, Qwen3OmniPrompt):
            raise TypeError(f"a Qwen3-Omni request carries a Qwen3OmniPrompt, not {type(prompt).__name__}")
        return ThinkerPrompt(list(prompt.token_ids), context.request_sampling(), prompt.mm,
                             capture_hidden=request.wants_audio)


def _audio(cfg: Qwen3OmniConfig) -> AudioSpec | None:
    """Code2wav's 12.5 Hz frames of ``num_code_groups`` codebooks, decoded as streams with their state kept."""
    vocoder = cfg.code2wav
    if vocoder is None:
        return None
    return AudioSpec(vocoder.sample_rate, vocoder.samples_per_frame,
                     Codebooks(cfg.num_code_groups, vocoder.codebook_size))


def _config(config: object) -> Qwen3OmniConfig:
    if not isinstance(config, Qwen3OmniConfig):
        raise TypeError(f"expected a Qwen3OmniConfig, got {type(config).__name__}")
    return config


FAMILY = Qwen3OmniFamily()
