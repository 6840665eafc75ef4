"""A Moshi checkpoint folder into :class:`MoshiLM`, in either layout.

transformers' layout is read by name through the shared streaming loader (Mimi's ``audio_encoder.*`` tensors are
the codec stage's); Kyutai's (``text_emb.weight`` present: Moshiko, PersonaPlex) is renamed and reshaped by
:mod:`kyutai_layout` first.
"""

from __future__ import annotations

from pathlib import Path

import torch

from omnistage.families.moshi.config import KYUTAI, MoshiConfig
from omnistage.families.moshi.kyutai_layout import from_kyutai
from omnistage.families.moshi.model import MoshiLM
from omnistage.models.build import build_on
from omnistage.models.weights import Checkpoint, WeightLoadError, load_module

CODEC_PREFIX = "audio_encoder."


def load_moshi(folder: str | Path, cfg: MoshiConfig | None = None, device: str = "cpu",
               dtype: torch.dtype = torch.float32) -> MoshiLM:
    cfg = cfg or MoshiConfig.from_folder(folder)
    ckpt = Checkpoint(folder)
    with build_on(device, dtype, empty=True):
        model = MoshiLM(cfg)
    if cfg.layout == KYUTAI or ckpt.has("text_emb.weight"):
        _load_kyutai(model, ckpt, cfg, dtype, device)
    else:
        result = load_module(model, ckpt, "", dtype=dtype, device=device)
        unknown = [n for n in result.unused if not n.startswith(CODEC_PREFIX)]
        if unknown:
            raise WeightLoadError(f"{folder}: tensors no Moshi module reads: {unknown[:5]}")
    return model.eval()


def _load_kyutai(model: MoshiLM, ckpt: Checkpoint, cfg: MoshiConfig, dtype: torch.dtype, device: str) -> None:
    tensors = from_kyutai(ckpt.get, ckpt.names(), cfg)
    params = dict(model.named_parameters())
    missing = sorted(set(params) - set(tensors))
    if missing:
        raise WeightLoadError(f"Kyutai checkpoint lacks {missing[:5]}")
    for name, param in params.items():
        if tuple(tensors[name].shape) != tuple(param.shape):
            raise WeightLoadError(f"{name}: checkpoint shape {tuple(tensors[name].shape)}, model {tuple(param.shape)}")
    model.load_state_dict({n: tensors[n].to(device=device, dtype=dtype).contiguous() for n in params},
                          strict=True, assign=True)
