"""Higgs Audio v2 as a registered family: generator (DualFFN Llama, 8 codebooks under a staircase delay) →
windowed xcodec decoder, through the generic codec edge."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

from omnistage.audio_spec import AudioSpec, Codebooks, Streaming
from omnistage.core import Modality
from omnistage.families.base import EdgeContext, EdgeModel, Family, FrontEnd, Hooks, StageModel
from omnistage.families.higgs_audio_v2.config import MODEL_TYPE, HiggsCheckpoint
from omnistage.families.higgs_audio_v2.payloads import PAYLOADS, HiggsSpeech
from omnistage.families.higgs_audio_v2.prompt import HiggsPrompt

PRESET = Path(__file__).with_name("higgs_audio_v2.yaml")
# The decoder's receptive field is ~10 frames each side (DAC's centred convs), its weights fading: measured on the
# tiny tokenizer (chunks of 1-13 frames), cutting the past to 4/6/10 frames leaves 6e-4/3e-4/2e-7 of the whole
# decode's peak at a chunk's start, and the look-ahead to 4 leaves 6e-4 at its end (160 ms of latency). 6 and 4
# keep both within the 1e-3 bound even where one tiny chunk holds both seams (tests/families/higgs_audio_v2/
# test_codec.py pins it), and decode 10 frames of context a chunk instead of 14.
PAST_FRAMES, LOOKAHEAD_FRAMES = 6, 4
# OpenAI's names, for clients that allow only those: all on the model's own voice.
OPENAI_VOICES = MappingProxyType({name: "default" for name in (
    "alloy", "ash", "ballad", "coral", "echo", "fable", "onyx", "nova", "sage", "shimmer", "verse", "marin", "cedar")})
_WORKERS = "omnistage.families.higgs_audio_v2.workers"
_HOOKS = "omnistage.families.higgs_audio_v2"


class HiggsAudioV2Family(Family):
    name = "higgs_audio_v2"
    model_types = (MODEL_TYPE,)
    stage_models = MappingProxyType({
        "generator": StageModel("ar", f"{_WORKERS}:GeneratorWorker", entry=True),
        "decoder": StageModel("generation", f"{_WORKERS}:CodecDecoderWorker", output=Modality.AUDIO),
    })
    edges = MappingProxyType({
        "higgs_audio_v2.generator_to_decoder": EdgeModel("generator", "decoder"),  # the generic codec edge
    })
    payloads = PAYLOADS
    hooks = Hooks(make_tiny=f"{_HOOKS}.make_tiny:make_tiny_command",
                  verify=f"{_HOOKS}.verify:run_higgs_verify_command",
                  cached=f"{_HOOKS}.make_tiny:cached_checkpoint",
                  tiny_names=("higgs-tiny",),
                  speech_baseline=f"{_HOOKS}.bench_baseline:run_transformers")

    def load_config(self, folder: Path) -> HiggsCheckpoint:
        return HiggsCheckpoint.from_folder(folder)

    def preset(self, config: object) -> Path:
        return PRESET

    def front_end(self, folder: Path, config: object) -> FrontEnd:
        from omnistage.families.higgs_audio_v2.speech import DEFAULT_VOICE, HiggsSpeechFrontEnd

        ckpt = _checkpoint(config)
        speech = HiggsSpeechFrontEnd(folder, ckpt)
        return FrontEnd(None, None, speech.speakers, ckpt.model.max_position_embeddings, audio_spec(ckpt), speech,
                        openai_voices=OPENAI_VOICES, default_voice=DEFAULT_VOICE)

    def entry_input(self, context: EdgeContext) -> HiggsSpeech:
        prompt = context.request.prompt
        if not isinstance(prompt, HiggsPrompt):
            raise TypeError(f"a Higgs Audio request carries a HiggsPrompt, not {type(prompt).__name__}")
        return HiggsSpeech(prompt, context.request_sampling())


def audio_spec(ckpt: HiggsCheckpoint) -> AudioSpec:
    """8 codebooks of 1024 codes a 960-sample frame at 24 kHz (25 Hz), codebook k emitted k + 1 frames late;
    decoded in overlapping windows (the decoder is not causal)."""
    codec = ckpt.codec
    return AudioSpec(codec.sample_rate, codec.hop_length, Codebooks(ckpt.model.num_codebooks, codec.codebook_size,
                                                                    ckpt.model.delays),
                     Streaming.OVERLAP, past_frames=PAST_FRAMES, lookahead_frames=LOOKAHEAD_FRAMES)


def _checkpoint(config: object) -> HiggsCheckpoint:
    if not isinstance(config, HiggsCheckpoint):
        raise TypeError(f"expected a HiggsCheckpoint, got {type(config).__name__}")
    return config


FAMILY = HiggsAudioV2Family()
