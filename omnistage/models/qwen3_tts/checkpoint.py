"""Every Qwen3-TTS module of one checkpoint folder, built from the typed config and filled from the safetensors.

The Hugging Face layout of ``Qwen/Qwen3-TTS-12Hz-*``: ``model.safetensors`` holds ``talker.*`` (and, in Base
models, ``speaker_encoder.*``); ``speech_tokenizer/model.safetensors`` holds the codec's ``decoder.*`` and
``encoder.*``. Parameter names are the reference's, so loading is :func:`load_module` with a prefix.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from omnistage.layers.quant.apply import apply_quantization, quantizable
from omnistage.layers.quant.w8a8 import mark_dynamic_inputs_
from omnistage.models.build import build_on
from omnistage.models.weights import Checkpoint, load_module
from omnistage.models.qwen3_tts.codec_decoder import CodecDecoder
from omnistage.models.qwen3_tts.codec_encoder import CodecEncoder
from omnistage.models.qwen3_tts.config import TOKENIZER_FOLDER, Qwen3TTSConfig
from omnistage.models.qwen3_tts.speaker_encoder import SpeakerEncoder
from omnistage.models.qwen3_tts.talker import CHECKPOINT_PREFIX, Qwen3TTSTalker


@dataclass
class Qwen3TTSModels:
    """The talker (with its code predictor), the codec's decoder and encoder, and (Base) the speaker encoder."""

    config: Qwen3TTSConfig
    talker: Qwen3TTSTalker
    codec_decoder: CodecDecoder
    codec_encoder: CodecEncoder
    speaker_encoder: SpeakerEncoder | None
    folder: Path
    device: torch.device
    dtype: torch.dtype

    @classmethod
    def build(cls, config: Qwen3TTSConfig, folder: str | Path = "", device: torch.device | str = "cpu",
              dtype: torch.dtype = torch.float32) -> Qwen3TTSModels:
        """Modules with the initial weights of their constructors (``load`` fills them; ``make-tiny`` draws them)."""
        codec = config.speech_tokenizer
        with build_on(device, dtype):
            talker = Qwen3TTSTalker(config.talker)
            decoder = CodecDecoder(codec.decoder)
            encoder = CodecEncoder(codec.encoder, codec.encoder_valid_num_quantizers, codec.encode_downsample_rate)
            speaker = SpeakerEncoder(config.speaker_encoder) if config.speaker_encoder is not None else None
        return cls(config, talker, decoder, encoder, speaker, Path(folder), torch.device(device), dtype)

    @classmethod
    def load(cls, folder: str | Path, device: torch.device | str = "cpu",
             dtype: torch.dtype = torch.float32) -> Qwen3TTSModels:
        models = cls.build(Qwen3TTSConfig.from_folder(folder), folder, device, dtype)
        with Checkpoint(folder) as ckpt:
            load_module(models.talker, ckpt, CHECKPOINT_PREFIX, dtype=dtype)
            if models.speaker_encoder is not None:
                load_module(models.speaker_encoder, ckpt, "speaker_encoder.", dtype=dtype)
        with Checkpoint(Path(folder) / TOKENIZER_FOLDER) as ckpt:
            load_module(models.codec_decoder, ckpt, "decoder.", dtype=dtype)
            load_module(models.codec_encoder, ckpt, "encoder.", dtype=dtype)
        for module in models.modules():
            module.eval().requires_grad_(False)
        return models

    def modules(self) -> list[nn.Module]:
        parts: list[nn.Module | None] = [self.talker, self.codec_decoder, self.codec_encoder, self.speaker_encoder]
        return [m for m in parts if m is not None]

    def state_dicts(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """(``model.safetensors``, ``speech_tokenizer/model.safetensors``) tensors under the checkpoint's names."""
        main = {CHECKPOINT_PREFIX + k: v for k, v in self.talker.state_dict().items()}
        if self.speaker_encoder is not None:
            main.update({"speaker_encoder." + k: v for k, v in self.speaker_encoder.state_dict().items()})
        codec = {"decoder." + k: v for k, v in self.codec_decoder.state_dict().items()}
        codec.update({"encoder." + k: v for k, v in self.codec_encoder.state_dict().items()})
        return main, codec


@dataclass
class VoiceEncoders:
    """What cloning a voice needs (a Base checkpoint's speaker encoder and the codec's encoder), without the talker
    or the decoder: the server process registers voices with these."""

    config: Qwen3TTSConfig
    speaker_encoder: SpeakerEncoder
    codec_encoder: CodecEncoder

    @classmethod
    def load(cls, folder: str | Path, config: Qwen3TTSConfig) -> VoiceEncoders:
        if config.speaker_encoder is None:
            raise ValueError(f"a {config.tts_model_type} model cannot clone a voice (only Base models can)")
        codec = config.speech_tokenizer
        with build_on("cpu", torch.float32):
            speaker = SpeakerEncoder(config.speaker_encoder)
            encoder = CodecEncoder(codec.encoder, codec.encoder_valid_num_quantizers, codec.encode_downsample_rate)
        with Checkpoint(folder) as ckpt:
            load_module(speaker, ckpt, "speaker_encoder.", dtype=torch.float32)
        with Checkpoint(Path(folder) / TOKENIZER_FOLDER) as ckpt:
            load_module(encoder, ckpt, "encoder.", dtype=torch.float32)
        return cls(config, speaker.eval().requires_grad_(False), encoder.eval().requires_grad_(False))


def load_talker(folder: str | Path, config: Qwen3TTSConfig, device: torch.device | str = "cpu",
                dtype: torch.dtype = torch.float32, quantization: str = "none") -> Qwen3TTSTalker:
    """The talker (with its code predictor) alone: what a talker stage loads. ``quantization``: the stage's
    (``int8``: weight-only, per row; ``w8a8``: see :func:`quantize_talker_`; for the decoder linears of the talker and of the code predictor, which run
    once and 15 times a frame; embeddings, heads, the text projection and norms keep ``dtype``)."""
    with build_on(device, dtype):
        talker = Qwen3TTSTalker(config.talker)
    with Checkpoint(folder) as ckpt:
        load_module(talker, ckpt, CHECKPOINT_PREFIX, dtype=dtype)
    quantize_talker_(talker, quantization)
    return talker.eval().requires_grad_(False)


TALKER_QUANTIZATIONS = ("none", "int8", "w8a8")


def quantize_talker_(talker: Qwen3TTSTalker, quantization: str) -> None:
    """``none``; ``int8`` (weight-only, per row); ``w8a8``: the same int8 weights, multiplied with per-token int8
    activations from a few rows up on CPU (:mod:`omnistage.layers.quant.w8a8`). Before the first forward."""
    if quantization not in TALKER_QUANTIZATIONS:
        raise ValueError(f"unknown quantization {quantization!r} for the Qwen3-TTS talker; known: "
                         f"{', '.join(TALKER_QUANTIZATIONS)}")
    apply_quantization(talker, "int8" if quantization == "w8a8" else quantization)
    if quantization == "w8a8":
        mark_dynamic_inputs_(quantizable(talker)[0])


def load_codec_decoder(folder: str | Path, config: Qwen3TTSConfig, device: torch.device | str = "cpu",
                       dtype: torch.dtype = torch.float32) -> CodecDecoder:
    """The 12 Hz codec's decoder alone: what a codec stage loads."""
    with build_on(device, dtype):
        decoder = CodecDecoder(config.speech_tokenizer.decoder)
    with Checkpoint(Path(folder) / TOKENIZER_FOLDER) as ckpt:
        load_module(decoder, ckpt, "decoder.", dtype=dtype)
    return decoder.eval().requires_grad_(False)
