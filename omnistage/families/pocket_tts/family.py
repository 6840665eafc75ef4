"""Pocket TTS as a registered family: backbone (with its flow and EOS heads) → latent decoder."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

from omnistage.audio_spec import AudioSpec, Latent
from omnistage.core import Modality
from omnistage.families.base import EdgeContext, EdgeModel, Family, FrontEnd, Hooks, StageModel
from omnistage.families.pocket_tts.config import MODEL_TYPE, PocketCheckpoint
from omnistage.families.pocket_tts.payloads import PAYLOADS, PocketSpeech
from omnistage.families.pocket_tts.prompt import PocketPrompt
from omnistage.families.speech import OPENAI_VOICE_NAMES

PRESET = Path(__file__).with_name("pocket_tts.yaml")
DEFAULT_VOICE = "alba"  # the reference runtime's default voice
# OpenAI's names, for clients that allow only those: all on the default voice (a checkpoint lacking it: its
# first voice).
OPENAI_VOICES = MappingProxyType({name: DEFAULT_VOICE for name in OPENAI_VOICE_NAMES})
_WORKERS = "omnistage.families.pocket_tts.workers"
_HOOKS = "omnistage.families.pocket_tts"


class PocketTTSFamily(Family):
    name = "pocket_tts"
    model_types = (MODEL_TYPE,)
    stage_models = MappingProxyType({
        "backbone": StageModel("ar", f"{_WORKERS}:BackboneWorker", entry=True),
        "decoder": StageModel("generation", f"{_WORKERS}:LatentDecoderWorker", output=Modality.AUDIO),
    })
    edges = MappingProxyType({
        "pocket_tts.backbone_to_decoder": EdgeModel("backbone", "decoder"),  # the generic codec edge
    })
    payloads = PAYLOADS
    hooks = Hooks(make_tiny=f"{_HOOKS}.make_tiny:make_tiny_command",
                  verify=f"{_HOOKS}.verify:run_pocket_verify_command",
                  cached=f"{_HOOKS}.make_tiny:cached_checkpoint",
                  tiny_names=("pocket-tiny", "pocket-tiny-drifting"), footprints=f"{_HOOKS}.plan:footprints")

    def load_config(self, folder: Path) -> PocketCheckpoint:
        return PocketCheckpoint.from_folder(folder)

    def preset(self, config: object) -> Path:
        return PRESET

    def front_end(self, folder: Path, config: object) -> FrontEnd:
        from omnistage.families.pocket_tts.speech import PocketSpeechFrontEnd

        ckpt = _checkpoint(config)
        speech = PocketSpeechFrontEnd(folder, ckpt)
        return FrontEnd(None, None, speech.speakers, ckpt.model.max_position_embeddings, audio_spec(ckpt), speech,
                        openai_voices=OPENAI_VOICES, default_voice=DEFAULT_VOICE if DEFAULT_VOICE in
                        speech.speakers else "")

    def entry_input(self, context: EdgeContext) -> PocketSpeech:
        prompt = context.request.prompt
        if not isinstance(prompt, PocketPrompt):
            raise TypeError(f"a Pocket TTS request carries a PocketPrompt, not {type(prompt).__name__}")
        return PocketSpeech(prompt, context.request_sampling())


def audio_spec(ckpt: PocketCheckpoint) -> AudioSpec:
    """Continuous 32-d latents, 1920 samples each at 24 kHz (12.5 Hz), decoded with the stream's state kept."""
    return AudioSpec(ckpt.codec.sampling_rate, ckpt.codec.frame_size, Latent(ckpt.model.latent_dim))


def _checkpoint(config: object) -> PocketCheckpoint:
    if not isinstance(config, PocketCheckpoint):
        raise TypeError(f"expected a PocketCheckpoint, got {type(config).__name__}")
    return config


FAMILY = PocketTTSFamily()
