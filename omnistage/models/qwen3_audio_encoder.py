"""Qwen3's Whisper-style audio encoder as the thinkers that hear use it: Qwen3-Omni's thinker and Qwen3-ASR.

Both run transformers' own ``Qwen3OmniMoeAudioEncoder`` (three stride-2 convolutions over 100-frame mel chunks,
windowed attention over ``n_window_infer`` frames, then ``proj1 -> act -> proj2`` into the text width) on whole
audios, never on pieces, so it needs no paged attention. Qwen3-ASR's transformers port splits the last two
projections off into a ``multi_modal_projector``; the same module serves it with those tensors renamed on read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from torch import nn
    from transformers import PretrainedConfig


def audio_output_length(num_frames: int, n_window: int) -> int:
    """Audio-encoder output length for ``num_frames`` mel frames (the number of ``<|audio_pad|>`` tokens)."""
    chunk = n_window * 2
    rest = num_frames % chunk
    after_conv1 = (rest - 1) // 2 + 1
    return ((after_conv1 - 1) // 2 + 1 - 1) // 2 + 1 + (num_frames // chunk) * 13


def build_audio_encoder(config: PretrainedConfig) -> nn.Module:
    """transformers' encoder for an audio config (Qwen3-Omni's, or one carrying its fields), in the default dtype."""
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeAudioEncoder

    return Qwen3OmniMoeAudioEncoder._from_config(config, dtype=torch.get_default_dtype())


@torch.no_grad()
def encode_audios(tower: nn.Module, mels: list[torch.Tensor], n_window: int) -> list[torch.Tensor]:
    """Features ``[tokens_i, H]`` of each audio given as its valid mel frames ``[mel, frames_i]``: one encoder call
    over all of them, in the encoder's packed layout (an audio's rows depend on it alone)."""
    first = next(tower.parameters())
    lens = torch.tensor([m.shape[1] for m in mels], dtype=torch.long, device=first.device)
    features = torch.cat([m.to(first.device, first.dtype) for m in mels], dim=1)
    out = tower(features, feature_lens=lens).last_hidden_state
    return list(out.split([audio_output_length(m.shape[1], n_window) for m in mels]))
