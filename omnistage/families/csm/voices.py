"""CSM's voices: a speaker id alone (``"0"``, ``"1"``...), or a speaker with earlier turns of context.

A voice cloned from reference audio is a context segment: its transcript and its Mimi frames, said by speaker
0, whom the request's text then continues. The voices endpoint stores it as ``context.safetensors`` (every
segment's frames, in order) and ``context.json`` (each segment's speaker, text and frame count).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from omnistage.families.csm.prompt import Segment

CODES_FILE, SEGMENTS_FILE, KEY = "context.safetensors", "context.json", "codes"


@dataclass(frozen=True)
class CsmVoice:
    """The context a voice speaks after; the request's text is said by the last segment's speaker."""

    segments: tuple[Segment, ...]

    @property
    def speaker(self) -> int:
        return self.segments[-1].speaker if self.segments else 0


def write_voice(voice: CsmVoice, folder: Path) -> None:
    codes = torch.cat([s.codes for s in voice.segments]).to(torch.int32).contiguous()
    save_file({KEY: codes}, str(folder / CODES_FILE))
    meta = [{"speaker": s.speaker, "text": s.text, "frames": int(s.codes.shape[0])} for s in voice.segments]
    (folder / SEGMENTS_FILE).write_text(json.dumps(meta))


def read_voice(folder: Path, num_codebooks: int) -> CsmVoice:
    codes = load_file(str(folder / CODES_FILE))[KEY].long()
    meta = json.loads((folder / SEGMENTS_FILE).read_text())
    if codes.dim() != 2 or codes.shape[1] != num_codebooks or sum(m["frames"] for m in meta) != codes.shape[0]:
        raise ValueError(f"{folder}: the stored context does not match its segments")
    segments, start = [], 0
    for m in meta:
        segments.append(Segment(int(m["speaker"]), str(m["text"]), codes[start:start + m["frames"]]))
        start += m["frames"]
    return CsmVoice(tuple(segments))
