"""Moshi's codec stage in the duplex loop: the shared Mimi (``omnistage.models.mimi``), one stream per session.

Each live session has an encoder stream (its user's audio → the codes Moshi hears) and a decoder stream (the
agent's codes → its audio), each carrying Mimi's conv tails and transformer window from frame to frame, so a
session's audio is the whole-stream codec's. A Mimi stream carries one position and window length for its whole
batch, so sessions that opened on the same tick share one batched stream (a group) and are coded in one call;
a closing session's row is cut out of its group's tensors, and rows follow the model's (``close`` moves the last
row in).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from omnistage.models.mimi import MimiCodec, load_mimi
from omnistage.models.mimi_config import MimiConfig
from omnistage.models.mimi_convs import ConvStream
from omnistage.models.weights import Checkpoint


@dataclass
class _Group:
    """Sessions whose codec streams opened on the same tick: one batched encoder and decoder stream (a Mimi
    stream's position and window length are its batch's, so only streams that started together share one)."""

    rows: list[int]  # the model rows of the group's batch rows, in order
    encoder: ConvStream
    decoder: ConvStream
    fresh: bool = True  # nothing coded yet: a new session may still join


class MimiFrameCodec:
    def __init__(self, codec: MimiCodec, codebooks: int) -> None:
        self.codec, self.codebooks = codec, codebooks
        self.groups: list[_Group] = []
        self.rows = 0

    @property
    def samples_per_frame(self) -> int:
        return self.codec.samples_per_frame

    def open(self) -> int:
        assert self.codec.encoder is not None and self.codec.decoder is not None
        row, self.rows = self.rows, self.rows + 1
        if self.groups and self.groups[-1].fresh:
            self.groups[-1].rows.append(row)
        else:
            self.groups.append(_Group([row], self.codec.encoder.new_stream(), self.codec.decoder.new_stream()))
        return row

    def close(self, row: int) -> int | None:
        group = next(g for g in self.groups if row in g.rows)
        index = group.rows.index(row)
        del group.rows[index]
        if not group.rows:
            self.groups.remove(group)
        elif not group.fresh:
            _drop_row(group.encoder, index)
            _drop_row(group.decoder, index)
        last, self.rows = self.rows - 1, self.rows - 1
        if row == last:
            return None
        moved = next(g for g in self.groups if last in g.rows)
        moved.rows[moved.rows.index(last)] = row
        return last

    def encode(self, audio: torch.Tensor) -> torch.Tensor:
        out = torch.empty(audio.shape[0], self.codebooks, dtype=torch.long)
        for g in self.groups:
            out[g.rows] = self.codec.encode(audio[g.rows], g.encoder, final=False, num_quantizers=self.codebooks)[:, :, 0]
            g.fresh = False
        return out

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        out = torch.empty(codes.shape[0], self.samples_per_frame)
        for g in self.groups:
            out[g.rows] = self.codec.decode(codes[g.rows, :, None], g.decoder)
            g.fresh = False
        return out


def _drop_row(stream: ConvStream, index: int) -> None:
    """Batch row ``index`` removed from every tensor a stream carries (conv tails, transformer windows)."""
    keep = lambda t: torch.cat([t[:index], t[index + 1:]])  # noqa: E731
    stream.tails = [keep(t) for t in stream.tails]
    for window in stream.windows:
        if window.keys is not None and window.values is not None:
            window.keys, window.values = keep(window.keys), keep(window.values)


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
