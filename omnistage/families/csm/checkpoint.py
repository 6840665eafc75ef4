"""Loading a CSM checkpoint in transformers' layout: the generating model, and its Mimi codec (``codec_model.``)."""

from __future__ import annotations

from pathlib import Path

import torch

from omnistage.families.csm.config import CODEC_PREFIX, CsmConfig
from omnistage.families.csm.model import CsmModel
from omnistage.models.build import build_on
from omnistage.models.mimi import MimiCodec, load_mimi
from omnistage.models.weights import Checkpoint, WeightLoadError, load_module

_AUDIO_TABLE = "backbone_model.embed_tokens.embed_audio_tokens."
_DEPTH_TABLE = "depth_decoder.model.embed_tokens."


def load_model(folder: str | Path, cfg: CsmConfig, device: str = "cpu",
               dtype: torch.dtype = torch.float32, quantization: str = "none") -> CsmModel:
    """``quantization``: ``int8`` makes both Llama stacks' linears weight-only int8 (one scale per row) as they are
    read, so the full-precision model is never held whole; the embeddings and code heads stay in ``dtype``."""
    with build_on(device, dtype, empty=True):
        model = CsmModel(cfg)
    ckpt = Checkpoint(folder)
    # The codebook table is one tensor both stacks read; transformers saves it under the depth decoder's name.
    rename = {_AUDIO_TABLE: _DEPTH_TABLE} if cfg.tie_codebooks_embeddings and not ckpt.has(
        _AUDIO_TABLE + "weight") else {}
    result = load_module(model, ckpt, "", rename, dtype=dtype, device=device, quantization=quantization)
    unknown = [n for n in result.unused if not n.startswith(CODEC_PREFIX) and not n.startswith(_DEPTH_TABLE)]
    if unknown:
        raise WeightLoadError(f"{folder}: tensors no CSM module reads: {unknown[:5]}")
    model.backbone_model.inv_freq = cfg.backbone.rope.inv_freq(cfg.backbone.head_dim).to(device)
    model.depth_decoder.model.inv_freq = cfg.depth.rope.inv_freq(cfg.depth.head_dim).to(device)
    embeddings = model.backbone_model.embed_tokens  # its non-persistent offsets, which the build left empty
    embeddings.offsets = (torch.arange(cfg.num_codebooks) * cfg.vocab_size).to(device)
    return model.to(device).eval()


def load_codec(folder: str | Path, cfg: CsmConfig, *, encoder: bool = True, decoder: bool = True,
               device: str = "cpu", dtype: torch.dtype = torch.float32) -> MimiCodec:
    """The Mimi codec (or one half: the codec stage decodes, voice cloning encodes)."""
    codec, _ = load_mimi(Checkpoint(folder), cfg.codec, CODEC_PREFIX, encoder=encoder, decoder=decoder,
                         dtype=dtype, device=device)
    return codec
