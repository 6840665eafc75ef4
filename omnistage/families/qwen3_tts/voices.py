"""A Base checkpoint's cloned voice on disk: its x-vector (and, cloned in context, its reference codes and
transcript ids), one folder per voice.

``voice.safetensors`` holds ``speaker_embedding`` ``[H]`` and ``ref_codes`` ``[R, G]`` when in context;
``voice.json`` the transcript ids. Written by the voices endpoint, read for each speech request naming the voice.
"""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import load_file, save_file

from omnistage.models.qwen3_tts.prompt import VoiceClone

TENSORS, META = "voice.safetensors", "voice.json"


def save_clone(clone: VoiceClone, folder: Path) -> None:
    tensors = {"speaker_embedding": clone.speaker_embedding.detach().float().cpu().contiguous()}
    if clone.ref_codes is not None:
        tensors["ref_codes"] = clone.ref_codes.detach().long().cpu().contiguous()
    save_file(tensors, str(folder / TENSORS))
    (folder / META).write_text(json.dumps({"ref_text_ids": clone.ref_text_ids}))


def load_clone(folder: Path) -> VoiceClone:
    tensors = load_file(str(folder / TENSORS))
    meta = json.loads((folder / META).read_text())
    return VoiceClone(tensors["speaker_embedding"], tensors.get("ref_codes"), meta.get("ref_text_ids"))
