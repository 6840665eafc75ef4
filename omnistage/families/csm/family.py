"""CSM as a registered family: backbone (with its depth decoder) → Mimi decoder."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

from omnistage.audio_spec import AudioSpec, Codebooks
from omnistage.core import Modality
from omnistage.families.base import EdgeContext, EdgeModel, Family, FrontEnd, Hooks, StageModel
from omnistage.families.csm.config import MODEL_TYPE, CsmConfig
from omnistage.families.csm.payloads import PAYLOADS, CsmSpeech
from omnistage.families.csm.prompt import CsmPrompt
from omnistage.families.speech import OPENAI_VOICE_NAMES

PRESET = Path(__file__).with_name("csm.yaml")
# OpenAI's names, for clients that allow only those: all speaker 0.
OPENAI_VOICES = MappingProxyType({name: "0" for name in OPENAI_VOICE_NAMES})
_WORKERS = "omnistage.families.csm.workers"
_HOOKS = "omnistage.families.csm"


class CsmFamily(Family):
    name = "csm"
    model_types = (MODEL_TYPE,)
    stage_models = MappingProxyType({
        "backbone": StageModel("ar", f"{_WORKERS}:BackboneWorker", entry=True),
        "decoder": StageModel("generation", f"{_WORKERS}:MimiDecoderWorker", output=Modality.AUDIO),
    })
    edges = MappingProxyType({
        "csm.backbone_to_decoder": EdgeModel("backbone", "decoder"),  # the generic codec edge
    })
    payloads = PAYLOADS
    hooks = Hooks(make_tiny=f"{_HOOKS}.make_tiny:make_tiny_command",
                  verify=f"{_HOOKS}.verify:run_csm_verify_command",
                  cached=f"{_HOOKS}.make_tiny:cached_checkpoint",
                  tiny_names=("csm-tiny",), speech_baseline=f"{_HOOKS}.hf_speech:hf_speech")

    def load_config(self, folder: Path) -> CsmConfig:
        return CsmConfig.from_folder(folder)

    def preset(self, config: object) -> Path:
        return PRESET

    def front_end(self, folder: Path, config: object) -> FrontEnd:
        from omnistage.families.csm.speech import CsmSpeechFrontEnd

        cfg = _config(config)
        speech = CsmSpeechFrontEnd(folder, cfg)
        return FrontEnd(None, None, speech.speakers, cfg.max_position_embeddings, audio_spec(cfg), speech,
                        openai_voices=OPENAI_VOICES, default_voice="0")

    def entry_input(self, context: EdgeContext) -> CsmSpeech:
        prompt = context.request.prompt
        if not isinstance(prompt, CsmPrompt):
            raise TypeError(f"a CSM request carries a CsmPrompt, not {type(prompt).__name__}")
        return CsmSpeech(prompt, context.request_sampling())


def audio_spec(cfg: CsmConfig) -> AudioSpec:
    """32 aligned codebooks a frame, 1920 samples each at 24 kHz (12.5 Hz), decoded with the stream's state kept."""
    return AudioSpec(cfg.codec.sampling_rate, cfg.codec.frame_size, Codebooks(cfg.num_codebooks, cfg.vocab_size))


def _config(config: object) -> CsmConfig:
    if not isinstance(config, CsmConfig):
        raise TypeError(f"expected a CsmConfig, got {type(config).__name__}")
    return config


FAMILY = CsmFamily()
