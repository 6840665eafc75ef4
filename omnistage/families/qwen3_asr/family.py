"""Qwen3-ASR as registered families: the recogniser (one stage, audio in, text out, a transcription front end, its
preset and tool hooks) and the forced aligner (``qwen3_forced_aligner``: the same body with a token-classification
head, which times a transcript's words; served beside a recogniser, ``serve ASR_DIR --aligner ALIGNER_DIR``, never
as a pipeline of its own). transformers gives both ``model_type: qwen3_asr``; the architecture tells them apart."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from omnistage.config.pipeline import ConfigError, PipelineSpec
from omnistage.core import Modality
from omnistage.families.base import EdgeContext, Family, FrontEnd, Hooks, StageModel
from omnistage.families.qwen3_asr.config import ALIGNER_MODEL_TYPE, MODEL_TYPE, Qwen3ASRCheckpoint, is_aligner
from omnistage.families.qwen3_asr.payloads import PAYLOADS, RecogniserPrompt
from omnistage.families.qwen3_asr.prompt import ASRPromptIds

PRESET = Path(__file__).with_name("qwen3_asr.yaml")
_HERE = "omnistage.families.qwen3_asr"


class Qwen3ASRFamily(Family):
    name = "qwen3_asr"
    model_types = (MODEL_TYPE,)
    stage_models = MappingProxyType({
        "recogniser": StageModel("ar", f"{_HERE}.workers:RecogniserWorker", output=Modality.TEXT, entry=True),
    })
    edges = MappingProxyType({})
    payloads = PAYLOADS
    hooks = Hooks(make_tiny=f"{_HERE}.make_command:make_tiny_command", verify=f"{_HERE}.verify:run_verify",
                  cached=f"{_HERE}.make_tiny:cached_checkpoint", tiny_names=("asr-tiny",))

    def recognises(self, raw: Mapping[str, Any]) -> bool:
        return super().recognises(raw) and not is_aligner(raw)

    def load_config(self, folder: Path) -> Qwen3ASRCheckpoint:
        return Qwen3ASRCheckpoint.from_folder(folder)

    def preset(self, config: object) -> Path:
        return PRESET

    def front_end(self, folder: Path, config: object) -> FrontEnd:
        from omnistage.families.qwen3_asr.prompt import Qwen3ASRPromptProcessor
        from omnistage.families.qwen3_asr.transcriber import ASRTranscriber

        cfg = _config(config)
        processor = Qwen3ASRPromptProcessor(folder, int(cfg.audio.n_window))
        return FrontEnd(processor.tokenizer, None, (), cfg.max_positions, transcriber=ASRTranscriber(processor))

    def entry_input(self, context: EdgeContext) -> RecogniserPrompt:
        prompt = context.request.prompt
        if not isinstance(prompt, ASRPromptIds):
            raise TypeError(f"a Qwen3-ASR request carries an ASRPromptIds, not {type(prompt).__name__}")
        return RecogniserPrompt(list(prompt.token_ids), list(prompt.mels), context.request_sampling())


class Qwen3ForcedAlignerFamily(Qwen3ASRFamily):
    """The aligner's checkpoints: made and verified like the recogniser's, refused as a served pipeline."""

    name = "qwen3_forced_aligner"
    model_types = (MODEL_TYPE, ALIGNER_MODEL_TYPE)
    hooks = Hooks(make_tiny=f"{_HERE}.make_command:make_tiny_command", verify=f"{_HERE}.verify:run_verify",
                  cached=f"{_HERE}.make_tiny:cached_checkpoint", tiny_names=("aligner-tiny",),
                  word_timer=f"{_HERE}.aligner:load_word_timer")

    def recognises(self, raw: Mapping[str, Any]) -> bool:
        return raw.get("model_type") in self.model_types and is_aligner(raw)

    def check_spec(self, spec: PipelineSpec, config: object) -> None:
        raise ConfigError("this checkpoint is a Qwen3 forced aligner: it times a transcript's words and writes "
                          "none; serve a Qwen3-ASR recogniser and give the aligner with --aligner ALIGNER_DIR")


def _config(config: object) -> Qwen3ASRCheckpoint:
    if not isinstance(config, Qwen3ASRCheckpoint):
        raise TypeError(f"expected a Qwen3ASRCheckpoint, got {type(config).__name__}")
    return config


FAMILY = Qwen3ASRFamily()
ALIGNER_FAMILY = Qwen3ForcedAlignerFamily()
