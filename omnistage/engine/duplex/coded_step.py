"""One duplex tick's work, the model step with its codec around it (the engine's and the calibration's)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from omnistage.engine.duplex.base import DuplexModel, FrameCodec


@dataclass(frozen=True)
class CodedStep:
    """A model step with its codec around it: the agent's ``frames`` (silence codes where a row has no generated
    frame yet) and, with a codec, their ``audio`` [n, S]."""

    text: torch.Tensor
    frames: torch.Tensor
    complete: torch.Tensor
    audio: torch.Tensor | None


def step(model: DuplexModel, codec: FrameCodec | None, heard: torch.Tensor) -> CodedStep:
    """Every live row one frame on: the user's frames encoded (with a codec), the model stepped, the agent's frames
    decoded (every row's, silence where it has none yet, so each decoder stream advances one frame a tick)."""
    user = heard if codec is None else codec.encode(heard)
    out = model.step(user)
    frames = torch.where(out.complete[:, None], out.frames, model.silence())
    audio = None if codec is None else codec.decode(frames)
    return CodedStep(out.text, frames, out.complete, audio)
