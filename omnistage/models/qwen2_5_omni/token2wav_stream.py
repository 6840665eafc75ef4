"""Qwen2.5-Omni's token2wav in chunks, as the reference's streaming design decodes it: the DiT's ODE runs on a
window of mel frames (the chunk plus ``past`` frames before it and ``future`` look-ahead frames after it), from
the utterance's own noise rows, and only the chunk's frames are kept; BigVGAN then vocodes the chunk with
``vocoder`` mel frames of that window on each side and keeps the chunk's samples.

Why not exact: each DiT forward attends one block ahead and two back at some layers, and the ODE makes 36
forwards, so the exact receptive field spans the utterance; a window of bounded context changes the frames near
its cut (the chunked audio equals the whole decode within a tolerance, tested). The noise is the whole decode's
noise: rows ``a .. b`` of one draw per utterance, so a chunk never depends on how the utterance was cut.

Every size is in mel frames and a multiple of the DiT's block size, so a window starts on a block boundary and
its blocks are the whole decode's blocks (2 mel frames per code).
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
import torch

from omnistage.models.qwen2_5_omni.token2wav import Token2Wav


@dataclass(frozen=True)
class ChunkPlan:
    chunk: int = 96  # frames each chunk emits (0.96 s of audio)
    past: int = 48  # context frames before a chunk
    future: int = 48  # look-ahead frames after a chunk: a chunk waits for them
    vocoder: int = 24  # mel frames of context BigVGAN sees on each side of a chunk (at most past and future)
    repeats: int = 2  # mel frames per code

    def __post_init__(self) -> None:
        if min(self.chunk, self.past, self.future) < 0 or self.chunk == 0:
            raise ValueError(f"a chunk plan needs a positive chunk and no negative context: {self}")
        if self.vocoder > min(self.past, self.future):
            raise ValueError(f"vocoder context {self.vocoder} exceeds the DiT window's ({self.past}, {self.future})")

    def check_blocks(self, block_size: int) -> None:
        for name in ("chunk", "past", "future"):
            if getattr(self, name) % block_size:
                raise ValueError(f"token2wav chunk plan: {name} {getattr(self, name)} is not a multiple of the "
                                 f"DiT's block size {block_size}")

    def num_chunks(self, num_codes: int) -> int:
        return -(-num_codes * self.repeats // self.chunk)

    def ready(self, index: int, num_codes: int) -> bool:
        """Chunk ``index`` can be decoded before the utterance ends: its look-ahead exists, and a later chunk
        will follow it (so the last chunk is always sent once the talker is done)."""
        frames = num_codes * self.repeats
        return frames >= (index + 1) * self.chunk + self.future and frames > (index + 1) * self.chunk

    def span(self, index: int, num_codes: int) -> ChunkSpan:
        """Chunk ``index``'s window when ``num_codes`` codes are known (all of them for the last chunks)."""
        frames = num_codes * self.repeats
        start = max(0, index * self.chunk - self.past) // self.repeats
        end = -(-min(frames, (index + 1) * self.chunk + self.future) // self.repeats)
        return ChunkSpan(start, end, index * self.chunk, min(frames, (index + 1) * self.chunk), self.vocoder)


class ChunkSpan(msgspec.Struct, frozen=True):
    """A chunk's DiT window reads codes ``[start, end)``; it emits mel frames ``[emit_start, emit_end)``
    (absolute), vocoded with ``vocoder`` frames of the window's mel on each side."""

    start: int
    end: int
    emit_start: int
    emit_end: int
    vocoder: int


class NoiseRows:
    """One utterance's ODE noise, the rows of one seeded draw (``Token2Wav.noise``), drawn again larger when a
    window reaches past them: a larger draw's first rows are the smaller draw's (torch fills normals 16 values
    at a time from one uniform stream, and a row of ``mel_dim`` = 80 is five such groups), which a test pins."""

    def __init__(self, model: Token2Wav, seed: int) -> None:
        self.model, self.seed = model, seed
        self.rows = model.noise(0, seed)

    def get(self, start: int, end: int) -> torch.Tensor:
        if end > self.rows.shape[1]:
            codes = max(-(-end // self.model.dit.repeats), self.rows.shape[1])  # at least doubling
            self.rows = self.model.noise(codes, self.seed)
        return self.rows[:, start:end]


@torch.no_grad()
def decode_chunk(model: Token2Wav, codes: torch.Tensor, span: ChunkSpan, noise: NoiseRows,
                 conditioning: torch.Tensor, reference_mel: torch.Tensor) -> torch.Tensor:
    """codes: the window's ``[end - start]`` → the chunk's waveform ``[(emit_end - emit_start) * 240]``."""
    repeats = model.dit.repeats
    first, last = span.start * repeats, span.end * repeats
    if codes.numel() != span.end - span.start:
        raise ValueError(f"a token2wav chunk's window holds {span.end - span.start} codes, got {codes.numel()}")
    mel = model.mel(codes, conditioning, reference_mel, noise.get(first, last))
    voc_start = max(first, span.emit_start - span.vocoder)
    voc_end = min(last, span.emit_end + span.vocoder)
    wav = model.vocode(mel[:, :, voc_start - first:voc_end - first])
    hop = wav.numel() // (voc_end - voc_start)
    skip = (span.emit_start - voc_start) * hop
    return wav[skip:skip + (span.emit_end - span.emit_start) * hop]


def decode_chunked(model: Token2Wav, codes: torch.Tensor, plan: ChunkPlan, seed: int, conditioning: torch.Tensor,
                   reference_mel: torch.Tensor) -> list[torch.Tensor]:
    """A whole utterance's codes decoded chunk by chunk (each from the codes its window reads)."""
    noise, n = NoiseRows(model, seed), codes.numel()
    chunks = []
    for i in range(plan.num_chunks(n)):
        span = plan.span(i, n)
        chunks.append(decode_chunk(model, codes[span.start:span.end], span, noise, conditioning, reference_mel))
    return chunks
