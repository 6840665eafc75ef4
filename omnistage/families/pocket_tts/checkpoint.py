"""Loading a Pocket TTS checkpoint in transformers' layout into omnistage's modules."""

from __future__ import annotations

from pathlib import Path

import torch

from omnistage.families.pocket_tts.backbone import PocketTTS
from omnistage.families.pocket_tts.codec import LatentDecoder
from omnistage.families.pocket_tts.codec_encoder import VoiceEncoder
from omnistage.families.pocket_tts.config import CODEC_FOLDER, PocketCheckpoint
from omnistage.models.weights import Checkpoint, WeightLoadError, load_module

# Training-only tensors transformers saves beside the model (the released checkpoints have none).
_TRAINING_ONLY = ("loss_weighting.", "latent_stats_num_updates")


def load_model(folder: str | Path, ckpt: PocketCheckpoint, device: str = "cpu",
               dtype: torch.dtype = torch.float32) -> PocketTTS:
    model = PocketTTS(ckpt.model)
    result = load_module(model, Checkpoint(folder), "", dtype=dtype, device=device)
    unknown = [n for n in result.unused if not n.startswith(_TRAINING_ONLY)]
    if unknown:
        raise WeightLoadError(f"{folder}: tensors no Pocket TTS module reads: {unknown[:5]}")
    # The latents' statistics stay fp32 whatever the model's dtype (transformers keeps them so).
    model.latent_mean.data, model.latent_std.data = model.latent_mean.float(), model.latent_std.float()
    return model.to(device).eval()


def load_decoder(folder: str | Path, ckpt: PocketCheckpoint, device: str = "cpu",
                 dtype: torch.dtype = torch.float32) -> LatentDecoder:
    """The codec's decoding half (its encoder's tensors are left for voice cloning)."""
    decoder = LatentDecoder(ckpt.codec)
    load_module(decoder, Checkpoint(Path(folder) / CODEC_FOLDER), "", dtype=dtype, device=device)
    return decoder.to(device).eval()


def load_voice_encoder(folder: str | Path, ckpt: PocketCheckpoint, device: str = "cpu") -> VoiceEncoder:
    """The codec's encoding half, for cloning (fp32: a voice is encoded once)."""
    encoder = VoiceEncoder(ckpt.codec)
    load_module(encoder, Checkpoint(Path(folder) / CODEC_FOLDER), "", dtype=torch.float32, device=device)
    return encoder.to(device).eval()
