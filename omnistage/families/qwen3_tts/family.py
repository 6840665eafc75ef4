"""Qwen3-TTS as a registered family: talker → codec decoder, a speech front end, its presets and tool hooks."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

import torch

from omnistage.audio_spec import AudioSpec, Codebooks
from omnistage.core import Modality, OmniRequest
from omnistage.families.base import EdgeContext, EdgeModel, Family, FrontEnd, Hooks, StageModel
from omnistage.families.qwen3_tts.payloads import PAYLOADS, TalkerSpeech, TextAppend
from omnistage.families.qwen3_tts.openai_voices import OPENAI_VOICES
from omnistage.models.qwen3_tts.config import MODEL_TYPE, Qwen3TTSConfig
from omnistage.models.qwen3_tts.prompt import PromptSpec

PRESET = Path(__file__).with_name("qwen3_tts.yaml")  # talker → codec decoder
MIN_NEW_TOKENS = 2  # the reference's generate fixes it: n talker steps give n - 1 frames
_WORKERS = "omnistage.families.qwen3_tts.workers"


class Qwen3TTSFamily(Family):
    name = "qwen3_tts"
    model_types = (MODEL_TYPE,)
    stage_models = MappingProxyType({
        "talker": StageModel("ar", f"{_WORKERS}:TalkerWorker", entry=True),
        "codec": StageModel("generation", f"{_WORKERS}:CodecDecoderWorker", output=Modality.AUDIO),
    })
    edges = MappingProxyType({
        "qwen3_tts.talker_to_codec": EdgeModel("talker", "codec"),  # the generic codec edge
    })
    payloads = PAYLOADS
    hooks = Hooks(make_tiny="omnistage.families.qwen3_tts.make_tiny:make_tiny_command",
                  verify="omnistage.tools.verify.tts_cli:run_tts_verify_command",
                  cached="omnistage.families.qwen3_tts.make_tiny:cached_checkpoint",
                  tiny_names=("tts-tiny", "tts-tiny-design", "tts-tiny-base", "tts-medium", "tts-medium-design",
                              "tts-medium-base"))

    def load_config(self, folder: Path) -> Qwen3TTSConfig:
        return Qwen3TTSConfig.from_folder(folder)

    def preset(self, config: object) -> Path:
        return PRESET

    def front_end(self, folder: Path, config: object) -> FrontEnd:
        from omnistage.families.qwen3_tts.speech import Qwen3TTSSpeech

        cfg = _config(config)
        speech = Qwen3TTSSpeech(folder, cfg)
        return FrontEnd(None, None, speech.speakers, cfg.talker.max_positions, _audio(cfg), speech,
                        openai_voices=OPENAI_VOICES)

    def entry_input(self, context: EdgeContext) -> TalkerSpeech:
        """The talker's sampling is the request's (the speech API fills it from the served defaults), at least
        the reference's two steps."""
        floor = max(MIN_NEW_TOKENS, context.min_new_tokens)
        return TalkerSpeech(_prompt(context.request), context.request_sampling().with_floor(floor))

    def entry_feed(self, delta: object) -> TextAppend:
        """An open text's later ids go to the talker as the front end made them."""
        if not isinstance(delta, TextAppend):
            raise TypeError(f"a Qwen3-TTS request takes TextAppend, not {type(delta).__name__}")
        return delta

    def codec_prime(self, request: OmniRequest) -> torch.Tensor | None:
        """A voice cloned in context: its reference frames start the codec stream (their audio dropped), as the
        reference decodes ``[reference codes, generated codes]`` and cuts the former."""
        clone = _prompt(request).voice_clone
        return clone.ref_codes.T if clone is not None and clone.ref_codes is not None else None


def _prompt(request: OmniRequest) -> PromptSpec:
    if not isinstance(request.prompt, PromptSpec):
        raise TypeError(f"a Qwen3-TTS request carries a PromptSpec, not {type(request.prompt).__name__}")
    return request.prompt


def _audio(cfg: Qwen3TTSConfig) -> AudioSpec:
    """The 12 Hz codec's frames (``decode_upsample_rate`` samples each), decoded as streams with their state kept."""
    tokenizer = cfg.speech_tokenizer
    return AudioSpec(tokenizer.output_sample_rate, tokenizer.decode_upsample_rate,
                     Codebooks(cfg.talker.num_code_groups, tokenizer.decoder.codebook_size))


def _config(config: object) -> Qwen3TTSConfig:
    if not isinstance(config, Qwen3TTSConfig):
        raise TypeError(f"expected a Qwen3TTSConfig, got {type(config).__name__}")
    return config


FAMILY = Qwen3TTSFamily()
