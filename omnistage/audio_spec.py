"""What a model family's audio is: its frames' timing, what a frame holds, and how its decoder streams.

A family states it once (``FrontEnd.audio``, from its checkpoint's config); every generic layer reads it from
the served family: the codec edge cuts chunks in its frames, the player model and the chunk planner count its
frame duration, the audio gate its real time, and the API encoders its sample rate. Nothing generic assumes a
12.5 Hz codec or 24 kHz output. Light on purpose (no torch): the server process and config parsing import it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from fractions import Fraction


@dataclass(frozen=True)
class Codebooks:
    """Frames of ``count`` discrete codes, ``size`` entries each.

    delays: frames each codebook lags behind the time it describes, as the talker emits it (a delay pattern:
        Higgs Audio's staircase delays codebook k by k + 1 steps); () when every codebook is aligned. The codec
        edge de-delays before chunking, so a codec stage always sees aligned frames.
    """

    count: int
    size: int
    delays: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.count < 1 or self.size < 1:
            raise ValueError(f"a codec needs at least one codebook of one entry: {self}")
        if self.delays and (len(self.delays) != self.count or min(self.delays) < 0):
            raise ValueError(f"one non-negative delay per codebook: {self}")

    @property
    def width(self) -> int:
        return self.count

    @property
    def max_delay(self) -> int:
        return max(self.delays, default=0)


@dataclass(frozen=True)
class Latent:
    """Frames of ``dim`` continuous values (a flow or diffusion head's latent), no codebooks."""

    dim: int

    def __post_init__(self) -> None:
        if self.dim < 1:
            raise ValueError(f"a latent frame needs at least one value: {self}")

    @property
    def width(self) -> int:
        return self.dim

    @property
    def delays(self) -> tuple[int, ...]:
        return ()  # a latent frame comes whole

    @property
    def max_delay(self) -> int:
        return 0


class Streaming(str, enum.Enum):
    """How the codec decoder turns a stream of chunks into audio."""

    # Each stream's state (conv inputs, attention window) is kept between chunks: a chunk holds only new frames,
    # and the joined chunks equal the whole decode.
    CARRIED_STATE = "carried_state"
    # Each chunk is decoded alone: it repeats ``past_frames`` before its new frames and reads ``lookahead_frames``
    # after them (a decoder that is not causal), whose samples are dropped.
    OVERLAP = "overlap"


@dataclass(frozen=True)
class AudioSpec:
    """A family's audio as the generic layers need it.

    sample_rate: samples per second of the decoder's output (mono float32).
    samples_per_frame: output samples one frame decodes to; the frame rate is their quotient.
    frame: what one frame holds: :class:`Codebooks` or a continuous :class:`Latent`.
    streaming: how the decoder streams; with ``OVERLAP``, ``past_frames`` and ``lookahead_frames`` are the
        context each chunk's window needs on either side.
    """

    sample_rate: int
    samples_per_frame: int
    frame: Codebooks | Latent
    streaming: Streaming = Streaming.CARRIED_STATE
    past_frames: int = 0
    lookahead_frames: int = 0

    def __post_init__(self) -> None:
        if self.sample_rate < 1 or self.samples_per_frame < 1:
            raise ValueError(f"sample rate and samples per frame must be positive: {self}")
        if self.past_frames < 0 or self.lookahead_frames < 0:
            raise ValueError(f"context frames must be >= 0: {self}")
        if self.streaming is Streaming.CARRIED_STATE and (self.past_frames or self.lookahead_frames):
            raise ValueError("a decoder that carries its state needs no context frames")

    @property
    def frame_rate(self) -> Fraction:
        """Frames per second, exact (12.5 Hz is 25/2)."""
        return Fraction(self.sample_rate, self.samples_per_frame)

    @property
    def frame_s(self) -> float:
        """Seconds of audio one frame decodes to."""
        return self.samples_per_frame / self.sample_rate

    @property
    def frame_width(self) -> int:
        """Values per frame: codebooks, or the latent's size."""
        return self.frame.width

    def seconds(self, samples: int) -> float:
        return samples / self.sample_rate

    def frames_in(self, seconds: float) -> int:
        """Whole frames that fit in ``seconds`` of audio."""
        return int(seconds * self.sample_rate) // self.samples_per_frame
