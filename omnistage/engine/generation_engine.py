"""The Code2Wav stage's engine: batches chunk-decode jobs from many requests per step.

There is no KV cache and no token loop: a job is one chunk of codec frames
(with left context) to turn into audio. A step takes the oldest pending job
of each request (chunks of one request must come out in order) and runs them
as one batch: all of them when the vocoder takes right-padded rows, else
those whose shape matches the oldest one (``decode_chunk`` takes one ``T``
and one left context per call).

With ``policy="deadline"`` the heads are taken in order of their stream's
playback deadline (when the audio already sent to the caller runs out), so a
stream about to underrun is decoded before one with seconds buffered; ties
and ``"fifo"`` keep the round-robin order.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import msgspec
import torch

from omnistage.config.pipeline import EngineSettings
from omnistage.engine.config import auto_device


def vocoder_batch_cap(engine: EngineSettings, device: str) -> int:
    """Chunks per codec step on ``device`` (a stage config's, ``"auto"`` allowed): its ``max_num_seqs``, on a
    CPU at most its ``cpu_max_batch``."""
    on_cpu = torch.device(auto_device(device)).type == "cpu"
    return min(engine.max_num_seqs, engine.cpu_max_batch) if on_cpu else engine.max_num_seqs


class StreamVoice(msgspec.Struct, frozen=True, array_like=True):
    """Who speaks a codec stream and the seed of its noise, for a decoder conditioned per request (a flow-matching
    vocoder's speaker and ODE noise); a codec that is neither ignores it. "" is the family's default voice."""

    voice: str = ""
    seed: int = 0


class ChunkJob(msgspec.Struct, tag="codec.ChunkJob"):
    """codes ``[W, T]`` (W codebooks, or a latent's values): ``left_context`` frames already decoded, then the
    new ones, then ``lookahead`` frames a decoder that is not causal reads after them. The first
    ``discard_frames`` new frames are decoded (they prime the stream, e.g. a cloned voice's reference frames)
    but their samples are dropped, as are the look-ahead's. The struct is also the codec stage's input on the
    wire. ``voice``: on a stream's first chunk, what its decoder is conditioned on for the whole stream."""

    request_id: str
    chunk_index: int
    codes: torch.Tensor
    left_context: int
    is_last: bool = False
    # Seconds until the stream's player runs dry, as its talker saw it when it cut this chunk: the engine orders
    # by ``arrival + slack_s`` on its own clock (the talker's may be another machine's).
    slack_s: float = 0.0
    discard_frames: int = 0
    lookahead: int = 0
    voice: StreamVoice | None = None

    def __post_init__(self) -> None:
        if self.codes.dim() != 2 or not 0 <= self.left_context < self.codes.shape[1]:
            raise ValueError(f"chunk codes must be [W, T] with 0 <= left_context < T, got "
                             f"{tuple(self.codes.shape)} and {self.left_context}")
        if min(self.discard_frames, self.lookahead) < 0 or self.new_frames < 1:
            raise ValueError(f"a chunk must keep a new frame after its discarded and look-ahead frames, got "
                             f"{self.discard_frames} discarded and {self.lookahead} ahead of {self.codes.shape[1]}")

    @property
    def new_frames(self) -> int:
        """Frames whose audio this chunk returns."""
        return self.codes.shape[1] - self.left_context - self.discard_frames - self.lookahead

    @property
    def shape_key(self) -> tuple[int, int, int]:
        return self.codes.shape[0], self.codes.shape[1], self.left_context


@dataclass(frozen=True)
class ChunkRef:
    """Which stream a chunk continues, whether it ends that stream, the look-ahead frames it ends with (a decoder
    of overlapping windows reads them), and on a stream's first chunk its voice."""

    stream_id: str
    index: int
    last: bool
    lookahead: int = 0
    voice: StreamVoice | None = None


class ChunkDecoder(Protocol):
    """What the engine drives (``omnistage.runner.GenerationRunner``)."""

    pads_rows: bool  # chunks of different lengths may share a call
    samples_per_frame: int

    def run(self, chunks: Sequence[torch.Tensor], left_contexts: Sequence[int],
            refs: Sequence[ChunkRef] | None = None) -> list[torch.Tensor]: ...

    def drop(self, stream_id: str) -> None: ...


@dataclass
class ChunkOutput:
    request_id: str
    chunk_index: int
    wav: torch.Tensor  # [(T - left_context) * samples_per_frame], float32 on the host
    is_last: bool


class GenerationEngineCore:
    def __init__(self, runner: ChunkDecoder, max_batch: int = 32, policy: str = "fifo") -> None:
        if policy not in ("fifo", "deadline"):
            raise ValueError(f"scheduling policy must be 'fifo' or 'deadline', got {policy!r}")
        self.runner = runner
        self.max_batch = max_batch
        self.policy = policy
        # Request order = arrival order of its first pending job (fairness across requests).
        self._pending: OrderedDict[str, deque[ChunkJob]] = OrderedDict()
        self._deadlines: dict[tuple[str, int], float] = {}  # (request, chunk) → when its player runs dry

    def add_job(self, job: ChunkJob, now: float = 0.0) -> None:
        """``now``: the job's arrival on this engine's clock (its deadline is ``now + job.slack_s``)."""
        self._pending.setdefault(job.request_id, deque()).append(job)
        self._deadlines[(job.request_id, job.chunk_index)] = now + job.slack_s

    def abort_request(self, request_id: str) -> bool:
        self.runner.drop(request_id)
        jobs = self._pending.pop(request_id, None)
        for job in jobs or ():
            self._deadlines.pop((request_id, job.chunk_index), None)
        return jobs is not None

    def has_pending(self) -> bool:
        return bool(self._pending)

    def schedule(self) -> list[ChunkJob]:
        heads = [jobs[0] for jobs in self._pending.values()]
        if not heads:
            return []
        if self.policy == "deadline":
            heads.sort(key=lambda job: self._deadlines[(job.request_id, job.chunk_index)])  # stable: ties keep order
        key = heads[0].shape_key
        if self.runner.pads_rows:
            batch = [job for job in heads if job.shape_key[0] == key[0]][:self.max_batch]
        else:
            batch = [job for job in heads if job.shape_key == key][:self.max_batch]
        for job in batch:
            jobs = self._pending[job.request_id]
            jobs.popleft()
            del self._deadlines[(job.request_id, job.chunk_index)]
            # Served requests go to the back so a busy request cannot starve the others.
            self._pending.move_to_end(job.request_id)
            if not jobs:
                del self._pending[job.request_id]
        return batch

    def step(self) -> list[ChunkOutput]:
        batch = self.schedule()
        if not batch:
            return []
        refs = [ChunkRef(job.request_id, job.chunk_index, job.is_last, job.lookahead, job.voice) for job in batch]
        wavs = self.runner.run([job.codes for job in batch], [job.left_context for job in batch], refs)
        spf = self.runner.samples_per_frame
        if any(job.discard_frames or job.lookahead for job in batch) and not spf:
            raise ValueError("this vocoder does not say its samples per frame: a chunk cannot drop frames")
        return [ChunkOutput(job.request_id, job.chunk_index,
                            wav[job.discard_frames * spf:wav.shape[0] - job.lookahead * spf], job.is_last)
                for job, wav in zip(batch, wavs)]

    def run_until_done(self) -> list[ChunkOutput]:
        outputs: list[ChunkOutput] = []
        while self.has_pending():
            outputs.extend(self.step())
        return outputs
