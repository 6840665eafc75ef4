"""Moshi's codec stage in the duplex loop: the shared Mimi (``omnistage.models.mimi``), one stream per session.

Each live session has an encoder stream (its user's audio → the codes Moshi hears) and a decoder stream (the
agent's codes → its audio), each carrying Mimi's conv tails and transformer window from frame to frame, so a
session's audio is the whole-stream codec's. Streams sit in the session's row (``close`` moves the last row in,
as the model does). A Mimi stream's state is a position and per-conv tails of one stream, so rows are coded one
by one.
"""

from __future__ import annotations

from pathlib import Path

import torch

from omnistage.models.mimi import MimiCodec, load_mimi
from omnistage.models.mimi_config import MimiConfig
from omnistage.models.mimi_convs import ConvStream
from omnistage.models.weights import Checkpoint


class MimiFrameCodec:
    def __init__(self, codec: MimiCodec, codebooks: int) -> None:
        self.codec, self.codebooks = codec, codebooks
        self.encoders: list[ConvStream] = []
        self.decoders: list[ConvStream] = []

    @property
    def samples_per_frame(self) -> int:
        return self.codec.samples_per_frame

    def open(self) -> int:
        assert self.codec.encoder is not None and self.codec.decoder is not None
        self.encoders.append(self.codec.encoder.new_stream())
        self.decoders.append(self.codec.decoder.new_stream())
        return len(self.encoders) - 1

    def close(self, row: int) -> int | None:
        last = len(self.encoders) - 1
        enc, dec = self.encoders.pop(), self.decoders.pop()
        if row == last:
            return None
        self.encoders[row], self.decoders[row] = enc, dec
        return last

    def encode(self, audio: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.codec.encode(audio[r:r + 1], s, final=False, num_quantizers=self.codebooks)[:, :, 0]
                          for r, s in enumerate(self.encoders)])

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.codec.decode(codes[r:r + 1, :, None], s) for r, s in enumerate(self.decoders)])


def load_frame_codec(folder: str | Path, codebooks: int) -> MimiFrameCodec:
    """The checkpoint's Mimi: ``mimi/`` (Kyutai's layout as make-tiny writes it) or transformers' layout's
    ``audio_encoder.*`` tensors with ``audio_encoder_config``."""
    import json

    folder = Path(folder)
    if (folder / "mimi" / "config.json").is_file():
        cfg = MimiConfig.from_dict(json.loads((folder / "mimi" / "config.json").read_text()))
        codec, _ = load_mimi(Checkpoint(folder / "mimi"), cfg)
    else:
        raw = json.loads((folder / "config.json").read_text())
        codec, _ = load_mimi(Checkpoint(folder), MimiConfig.from_dict(raw["audio_encoder_config"]), "audio_encoder.")
    return MimiFrameCodec(codec, codebooks)
