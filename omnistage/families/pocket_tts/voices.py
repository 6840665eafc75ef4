"""Pocket TTS's voices: the built-in ones the checkpoint ships, and those cloned from reference audio.

Built-in voices are ``voices/<name>.safetensors`` beside config.json, each one tensor ``[n, 32]`` of voice
latents (what transformers takes as ``audio_prompt_latents``). A cloned voice is the same tensor from the
codec's encoder, stored by the voices endpoint as ``voice.safetensors`` in its folder.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

VOICES_FOLDER, CLONE_FILE, KEY = "voices", "voice.safetensors", "audio_prompt_latents"


@dataclass(frozen=True)
class PocketVoice:
    latents: torch.Tensor  # [n, latent]


def builtin_voice_names(folder: Path) -> tuple[str, ...]:
    return tuple(sorted(p.stem for p in (folder / VOICES_FOLDER).glob("*.safetensors")))


def read_latents(path: Path, latent_dim: int) -> torch.Tensor:
    tensors = load_file(str(path))
    if len(tensors) != 1:
        raise ValueError(f"{path}: a voice holds one tensor of latents, found {sorted(tensors)}")
    latents = next(iter(tensors.values())).float()
    if latents.dim() == 3 and latents.shape[0] == 1:
        latents = latents[0]
    if latents.dim() != 2 or latents.shape[1] != latent_dim or latents.shape[0] < 1:
        raise ValueError(f"{path}: voice latents must be [frames, {latent_dim}], got {tuple(latents.shape)}")
    return latents


def write_latents(latents: torch.Tensor, path: Path) -> None:
    save_file({KEY: latents.detach().float().cpu().contiguous()}, str(path))
