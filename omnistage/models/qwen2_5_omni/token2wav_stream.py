"""Qwen2.5-Omni's token2wav on the generic codec stage: each chunk decoded as a window of overlapping context,
chunks of many streams in one batch.

A chunk job brings its new codes with ``left_context`` codes before them and ``lookahead`` after them (the codec
edge cuts them, from the family's ``AudioSpec``). The DiT's ODE runs on that window from the utterance's own noise
rows (rows ``a .. b`` of one seeded draw per stream, so a chunk never depends on how the utterance was cut) in the
stream's voice; BigVGAN then vocodes the new frames with :data:`VOCODER_MEL` mel frames of the window on each side.
The samples of the window's look-ahead are dropped by the engine, so only the vocoder's context of it is vocoded.

Why not exact: each DiT forward attends one block ahead and two back at some layers, and the ODE makes 36
forwards, so the exact receptive field spans the utterance; a window of bounded context changes the frames near its
cut (the chunked audio equals the whole decode within a tolerance, tested). A window starts on a DiT block boundary
(the first one in its context), so its blocks are the whole decode's blocks.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from omnistage.models.qwen2_5_omni.dit_windows import DiTVoice, DiTWindows
from omnistage.models.qwen2_5_omni.token2wav import SAMPLES_PER_CODE, Token2Wav

# As the reference's streaming decode (Qwen's 50 Hz token2wav): two DiT blocks of context before a chunk, one after,
# and 20 mel frames of BigVGAN context on each side.
PAST_MEL = 48  # DiT context before a chunk's new frames, at least (0.48 s)
FUTURE_MEL = 24  # DiT look-ahead after them (0.24 s): a chunk waits for it
VOCODER_MEL = 20  # mel frames of the window BigVGAN sees on each side of the new frames (at most FUTURE_MEL)

VoiceLookup = Callable[[str], tuple[torch.Tensor, torch.Tensor]]  # a voice name → (conditioning, reference mel)


def context_codes(block_size: int, repeats: int) -> tuple[int, int]:
    """(past, look-ahead) codes a chunk's window needs: the past with room to start on a block boundary."""
    if block_size % repeats:
        raise ValueError(f"the DiT's block of {block_size} mel frames is not whole codes of {repeats} frames")
    return (PAST_MEL + block_size) // repeats - 1, FUTURE_MEL // repeats


def fast_bigvgan(model: Token2Wav) -> Callable[[torch.Tensor], torch.Tensor]:
    """BigVGAN ``[B, mel, F]`` → ``[B, F * 240]`` (squeezed). On a CPU a frozen TorchScript trace of it: its
    convolutions' weights are packed once instead of at every call (a quarter of its time; the same samples, any
    batch and length, tested); elsewhere the module itself."""
    module: nn.Module = model.model.code2wav_bigvgan_model
    weight = module.conv_pre.weight
    if weight.device.type != "cpu":
        return module
    with warnings.catch_warnings(), torch.inference_mode():
        warnings.simplefilter("ignore")  # the trace's notes on its constants (the dB floor) and transformers' own
        return torch.jit.freeze(torch.jit.trace(module, weight.new_zeros(2, weight.shape[1], 8)).eval())


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
        return self.rows[0, start:end]


@dataclass
class _Stream:
    voice: DiTVoice
    noise: NoiseRows
    position: int = 0  # codes whose audio was returned: the next chunk's first new code
    next_chunk: int = 0


@dataclass(frozen=True)
class _Window:
    """A chunk's window over the stream's codes ``[start, end)``; its new codes are ``[new_start, new_end)``."""

    codes: torch.Tensor
    start: int
    new_start: int
    new_end: int
    end: int


class Token2WavStreams:
    """The vocoder :class:`omnistage.runner.GenerationRunner` drives (``open_stream``/``decode_windows``/``drop``)."""

    samples_per_frame = SAMPLES_PER_CODE

    def __init__(self, model: Token2Wav, voices: VoiceLookup) -> None:
        self.model, self.lookup = model, voices
        self.dit = DiTWindows(model.dit)
        self.bigvgan = fast_bigvgan(model)
        self.repeats, self.block = model.dit.repeats, model.dit.block_size // model.dit.repeats
        self.voices: dict[str, DiTVoice] = {}
        self.streams: dict[str, _Stream] = {}

    def open_stream(self, stream_id: str, voice: str, seed: int) -> None:
        if voice not in self.voices:
            self.voices[voice] = self.dit.voice(*self.lookup(voice))
        self.streams[stream_id] = _Stream(self.voices[voice], NoiseRows(self.model, seed))

    def drop(self, stream_id: str) -> None:
        self.streams.pop(stream_id, None)

    @torch.inference_mode()
    def decode_windows(self, stream_ids: Sequence[str], chunk_indices: Sequence[int], codes: Sequence[torch.Tensor],
                       left_contexts: Sequence[int], lookaheads: Sequence[int],
                       lasts: Sequence[bool]) -> list[torch.Tensor]:
        """One chunk per stream, codes ``[1, T_i]`` → samples of its new and look-ahead codes (the look-ahead's
        zeros: the engine drops them)."""
        states = [self._state(sid, index) for sid, index in zip(stream_ids, chunk_indices)]
        windows = [self._window(s, c.reshape(-1), ctx, ahead)
                   for s, c, ctx, ahead in zip(states, codes, left_contexts, lookaheads)]
        r = self.repeats
        noise = [s.noise.get(w.start * r, w.end * r) for s, w in zip(states, windows)]
        mels = self.dit.solve([w.codes for w in windows], noise, [s.voice for s in states])
        wavs = self._vocode(windows, mels, lasts)
        for sid, state, window, last in zip(stream_ids, states, windows, lasts):
            state.position, state.next_chunk = window.new_end, state.next_chunk + 1
            if last:
                self.drop(sid)
        return wavs

    def _state(self, stream_id: str, chunk_index: int) -> _Stream:
        state = self.streams.get(stream_id)
        if state is None:
            raise ValueError(f"{stream_id}: chunk {chunk_index} of a stream never opened")
        if chunk_index != state.next_chunk:
            raise ValueError(f"{stream_id}: chunk {chunk_index} arrived, chunk {state.next_chunk} was due")
        return state

    def _window(self, state: _Stream, codes: torch.Tensor, left_context: int, lookahead: int) -> _Window:
        """The chunk's codes from the first DiT block boundary in its context (or all of it, when none is)."""
        start = state.position - left_context
        aligned = -(-start // self.block) * self.block
        skip = aligned - start if aligned <= state.position else 0
        end = start + codes.numel()
        return _Window(codes[skip:], start + skip, state.position, end - lookahead, end)

    def _vocode(self, windows: Sequence[_Window], mels: Sequence[torch.Tensor],
                lasts: Sequence[bool]) -> list[torch.Tensor]:
        """BigVGAN on each chunk's new frames with :data:`VOCODER_MEL` frames of context, in one batch: padding
        lies past a row's context, beyond what reaches its samples (a chunk that is not last is padded on the right,
        a last one on the left: its right end is the utterance's, where the whole decode's conv padding is). A
        last chunk with less context on its left (near the utterance's start) goes alone."""
        r, hop = self.repeats, SAMPLES_PER_CODE // self.repeats
        spans = [(max(0, (w.new_start - w.start) * r - VOCODER_MEL), min(m.shape[1], (w.new_end - w.start) * r
                                                                        + VOCODER_MEL)) for w, m in zip(windows, mels)]
        pieces = [m[:, a:b] for m, (a, b) in zip(mels, spans)]
        alone = [last and (w.new_start - w.start) * r - a < VOCODER_MEL
                 for w, (a, _), last in zip(windows, spans, lasts)]
        batched = [i for i, a in enumerate(alone) if not a]
        vocoded = dict(zip(batched, self._bigvgan([pieces[i] for i in batched], [lasts[i] for i in batched])))
        for i in (i for i, a in enumerate(alone) if a):
            vocoded[i] = self._bigvgan([pieces[i]], [True])[0]
        out = []
        for i, (w, (a, _)) in enumerate(zip(windows, spans)):
            skip = ((w.new_start - w.start) * r - a) * hop
            wav = vocoded[i][skip:skip + (w.new_end - w.new_start) * SAMPLES_PER_CODE]
            out.append(torch.cat([wav, wav.new_zeros((w.end - w.new_end) * SAMPLES_PER_CODE)]))
        return out

    def _bigvgan(self, mels: Sequence[torch.Tensor], right_aligned: Sequence[bool]) -> list[torch.Tensor]:
        """Mels ``[mel, F_i]`` → waveforms, one call: each row padded on the right, or on the left where
        ``right_aligned``."""
        if not mels:
            return []
        lengths = [m.shape[1] for m in mels]
        frames = max(lengths)
        at = [frames - n if right else 0 for n, right in zip(lengths, right_aligned)]
        batch = mels[0].new_zeros(len(mels), mels[0].shape[0], frames)
        for i, m in enumerate(mels):
            batch[i, :, at[i]:at[i] + lengths[i]] = m
        wav = self.bigvgan(batch).reshape(len(mels), -1)
        hop = wav.shape[1] // frames
        return [wav[i, a * hop:(a + n) * hop] for i, (a, n) in enumerate(zip(at, lengths))]
