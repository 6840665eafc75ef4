"""Loading a Higgs Audio v2 checkpoint in transformers' layout into omnistage's modules."""

from __future__ import annotations

from pathlib import Path

import torch

from omnistage.families.higgs_audio_v2.backbone import HiggsAudioV2, llama3_inv_freq
from omnistage.families.higgs_audio_v2.codec import HiggsCodec, transformers_config
from omnistage.families.higgs_audio_v2.config import CODEC_FOLDER, HiggsCheckpoint
from omnistage.models.build import build_on
from omnistage.models.weights import Checkpoint, WeightLoadError, load_module

# The training-only text head transformers ignores on load.
_UNUSED = ("text_lm_head.",)
# The tokenizer's training-only halves (semantic reconstruction), and HuBERT's unused mask embedding.
_CODEC_UNUSED = ("decoder_semantic.", "fc1.", "semantic_model.masked_spec_embed")


def load_model(folder: str | Path, ckpt: HiggsCheckpoint, device: str = "cpu",
               dtype: torch.dtype = torch.float32, quantization: str = "none") -> HiggsAudioV2:
    with build_on(device, dtype, empty=True):
        model = HiggsAudioV2(ckpt.model)
    result = load_module(model, Checkpoint(folder), "", dtype=dtype, device=device, quantization=quantization)
    unknown = [n for n in result.unused if not n.startswith(_UNUSED)]
    if unknown:
        raise WeightLoadError(f"{folder}: tensors no Higgs Audio v2 module reads: {unknown[:5]}")
    cfg = ckpt.model  # the non-persistent buffers, made here (the build left no storage)
    model.model.inv_freq = llama3_inv_freq(cfg.head_dim, cfg.rope).to(device)
    model.model.embed_audio_tokens.offsets = (torch.arange(cfg.num_codebooks) * cfg.codebook_size).to(device)
    model = model.to(device).eval()
    model.fuse_()  # last: the stacks are plain tensors, which a later .to() would not move
    return model


def load_codec(folder: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32,
               encoder: bool = False) -> HiggsCodec:
    """The audio tokenizer: its decoding half (``encoder``: and its encoding half, for cloning)."""
    codec = HiggsCodec(transformers_config(folder), encoder=encoder)
    result = load_module(codec, Checkpoint(Path(folder) / CODEC_FOLDER), "", dtype=dtype, device=device)
    unknown = [n for n in result.unused if not n.startswith(_CODEC_UNUSED) and (encoder or not n.startswith(
        ("acoustic_encoder.", "encoder_semantic.", "semantic_model.", "fc.")))]
    if unknown:
        raise WeightLoadError(f"{folder}/{CODEC_FOLDER}: tensors no Higgs codec module reads: {unknown[:5]}")
    return codec.to(device).eval()
