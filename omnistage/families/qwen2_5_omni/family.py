"""Qwen2.5-Omni as a registered family: its stage models, edges, payloads, presets and tool hooks.

Thinker (text out) → talker (one codebook per step) → token2wav (DiT flow matching + BigVGAN on the generic codec
edge: chunks of overlapping windows, batched across streams, audio out). A checkpoint without a talker is served
by the thinker alone.
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import MappingProxyType

from omnistage.audio_spec import AudioSpec, Codebooks, Streaming
from omnistage.config.pipeline import ConfigError, PipelineSpec

from omnistage.core import Modality
from omnistage.families.base import EdgeContext, EdgeModel, Family, FrontEnd, Hooks, StageModel
from omnistage.families.qwen2_5_omni.edges import ThinkerToTalker
from omnistage.families.qwen2_5_omni.payloads import PAYLOADS, ThinkerPrompt
from omnistage.families.qwen2_5_omni.prompt import Qwen25OmniPrompt
from omnistage.families.qwen2_5_omni.voices import DEFAULT_VOICE, SYSTEM_PROMPT
from omnistage.models.qwen2_5_omni.config import MODEL_TYPE, Qwen25OmniConfig

PRESET = Path(__file__).with_name("qwen2_5_omni.yaml")  # thinker → talker → token2wav
TEXT_ONLY_PRESET = Path(__file__).with_name("qwen2_5_omni_text.yaml")  # the thinker alone
_HERE = "omnistage.families.qwen2_5_omni"
logger = logging.getLogger(__name__)
_warned_system_prompt = False


class Qwen25OmniFamily(Family):
    name = "qwen2_5_omni"
    model_types = (MODEL_TYPE,)
    stage_models = MappingProxyType({
        "thinker": StageModel("ar", f"{_HERE}.workers:ThinkerWorker", output=Modality.TEXT, entry=True),
        "talker": StageModel("ar", f"{_HERE}.workers:TalkerWorker"),
        "token2wav": StageModel("generation", f"{_HERE}.workers:Token2WavWorker", output=Modality.AUDIO),
    })
    edges = MappingProxyType({
        "qwen2_5_omni.thinker_to_talker": EdgeModel("thinker", "talker", ThinkerToTalker),
        "qwen2_5_omni.talker_to_token2wav": EdgeModel("talker", "token2wav"),  # the generic codec edge
    })
    payloads = PAYLOADS
    hooks = Hooks(make_tiny=f"{_HERE}.make_command:make_tiny_command", verify=f"{_HERE}.verify:run_verify",
                  cached=f"{_HERE}.make_tiny:cached_checkpoint", tiny_names=("omni25-tiny",))

    def load_config(self, folder: Path) -> Qwen25OmniConfig:
        return Qwen25OmniConfig.from_folder(folder)

    def preset(self, config: object) -> Path:
        return PRESET if _config(config).has_talker else TEXT_ONLY_PRESET

    def check_spec(self, spec: PipelineSpec, config: object) -> None:
        if not _config(config).has_talker and any(s.model != "thinker" for s in spec.stages):
            raise ConfigError("stages: this checkpoint has no talker (enable_audio_output false or no spk_dict.pt) "
                              f"but the stage config has talker/token2wav stages; use {TEXT_ONLY_PRESET.name}")

    def front_end(self, folder: Path, config: object) -> FrontEnd:
        from omnistage.families.qwen2_5_omni.prompt import Qwen25OmniPromptProcessor

        cfg = _config(config)
        processor = Qwen25OmniPromptProcessor(folder, cfg.hf.thinker_config)
        if not cfg.has_talker:
            return FrontEnd(processor.tokenizer, processor, (), cfg.max_positions)
        from omnistage.families.qwen2_5_omni.voices import OPENAI_VOICES, load_speakers

        voices = tuple(load_speakers(folder))
        default = DEFAULT_VOICE if DEFAULT_VOICE in voices else ""
        return FrontEnd(processor.tokenizer, processor, voices, cfg.max_positions, _audio(cfg),
                        openai_voices=OPENAI_VOICES, default_voice=default, spoken_system_prompt=SYSTEM_PROMPT)

    def entry_input(self, context: EdgeContext) -> ThinkerPrompt:
        request = context.request
        prompt = request.prompt
        if not isinstance(prompt, Qwen25OmniPrompt):
            raise TypeError(f"a Qwen2.5-Omni request carries a Qwen25OmniPrompt, not {type(prompt).__name__}")
        if request.wants_audio and not prompt.speech_system_prompt:
            _warn_system_prompt()
        # A prefill-only request (streaming input) warms the thinker's cache alone: its one token starts no talker.
        return ThinkerPrompt(list(prompt.token_ids), context.request_sampling(), prompt.mm,
                             capture_hidden=request.streams_audio)


def _warn_system_prompt() -> None:
    """Once per process: transformers speaks under any system prompt, but the talker was trained under one."""
    global _warned_system_prompt
    if not _warned_system_prompt:
        _warned_system_prompt = True
        logger.warning("Qwen2.5-Omni was asked for audio under a system prompt other than its own; the speech may "
                       "be poor. Set the system message to: %r", SYSTEM_PROMPT)


def _audio(cfg: Qwen25OmniConfig) -> AudioSpec:
    """One codebook of 50 Hz codes (2 mel frames each, 240 samples a mel frame at 24 kHz); token2wav decodes
    overlapping windows (its DiT is not causal): codes of context before each chunk and look-ahead after it."""
    from omnistage.models.qwen2_5_omni.token2wav import SAMPLES_PER_CODE
    from omnistage.models.qwen2_5_omni.token2wav_stream import context_codes

    dit = cfg.hf.token2wav_config.dit_config
    past, ahead = context_codes(int(dit.block_size), int(dit.repeats))
    return AudioSpec(24000, SAMPLES_PER_CODE, Codebooks(1, int(cfg.hf.talker_config.vocab_size)), Streaming.OVERLAP,
                     past_frames=past, lookahead_frames=ahead)


def _config(config: object) -> Qwen25OmniConfig:
    if not isinstance(config, Qwen25OmniConfig):
        raise TypeError(f"expected a Qwen25OmniConfig, got {type(config).__name__}")
    return config


FAMILY = Qwen25OmniFamily()
