"""What every streaming codec decoder shares: per-stream state kept between chunks, chunks batched across streams.

A stream keeps, from its first chunk to its last (or :meth:`StreamingVocoder.drop`), the pre-transformer's
keys/values of its last frames (:class:`KVWindow`: new frames attend exactly as in a whole pass) and each conv's
last inputs (:class:`ConvTails`: the convolutional decoder runs on the new frames only). A family's decoder says
how codes become the transformer's input (:meth:`StreamingVocoder._features`); Qwen3-Omni's code2wav and
Qwen3-TTS's codec decoder are the two. A chunk's samples continue the whole decode's exactly where the previous
chunk's ended (up to float rounding), whatever the chunk boundaries.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import torch
from torch import nn

from omnistage.models.codec_conv_stream import ConvTails, StreamedConvs, bucket_frames
from omnistage.models.codec_transformer import KVWindow


@dataclass
class StreamState:
    windows: list[KVWindow]
    position: int = 0  # frames decoded so far
    convs: ConvTails = field(default_factory=ConvTails)
    next_chunk: int = 0


S = TypeVar("S", bound=StreamState)


class StreamingVocoder(ABC, Generic[S]):
    """The interface :class:`omnistage.runner.GenerationRunner` drives (``decode_streams``/``drop``)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.convs = StreamedConvs(model.upsample, model.decoder)
        self.streams: dict[str, S] = {}

    @property
    def samples_per_frame(self) -> int:
        return self.model.samples_per_frame

    def drop(self, stream_id: str) -> None:
        self.streams.pop(stream_id, None)

    @torch.inference_mode()
    def decode_streams(self, stream_ids: Sequence[str], chunk_indices: Sequence[int], codes: Sequence[torch.Tensor],
                       left_contexts: Sequence[int], last: Sequence[bool]) -> list[torch.Tensor]:
        """One chunk per stream: ``codes[i]`` ``[G, T_i]`` whose first ``left_contexts[i]`` frames were in its
        previous chunk (not needed here: the stream's state holds them) -> each chunk's new samples ``[S_i]``."""
        states = [self._state(sid, idx) for sid, idx in zip(stream_ids, chunk_indices)]
        for state in states:  # every chunk was due: only now does any stream move on
            state.next_chunk += 1
        hidden = [self._transform(state, c[:, ctx:]) for state, c, ctx in zip(states, codes, left_contexts)]
        lengths = [h.shape[-1] for h in hidden]
        # Right-padded (the convs are causal) to a bucketed width: few shapes for oneDNN to keep.
        batch = hidden[0].new_zeros(len(hidden), hidden[0].shape[0], bucket_frames(max(lengths)))
        for i, h in enumerate(hidden):
            batch[i, :, :lengths[i]] = h
        out = self.convs.run(batch, lengths, [state.convs for state in states])
        for sid, done in zip(stream_ids, last):
            if done:
                self.drop(sid)
        return out

    def _state(self, stream_id: str, chunk_index: int) -> S:
        state = self.streams.get(stream_id)
        if state is None:
            if chunk_index != 0:
                raise ValueError(f"{stream_id}: chunk {chunk_index} of a stream this decoder has no state for")
            state = self.streams[stream_id] = self._new_state()
        if chunk_index != state.next_chunk:
            raise ValueError(f"{stream_id}: chunk {chunk_index} arrived, chunk {state.next_chunk} was due")
        return state

    def _transform(self, state: S, codes: torch.Tensor) -> torch.Tensor:
        """Transformer outputs ``[hidden, n]`` of the chunk's new frames."""
        features = self._features(state, codes)  # [1, n, hidden]
        new = self.model.pre_transformer(features, state.windows, state.position)[0].T  # [hidden, n]
        state.position += codes.shape[-1]
        return new

    @abstractmethod
    def _new_state(self) -> S: ...

    @abstractmethod
    def _features(self, state: S, codes: torch.Tensor) -> torch.Tensor:
        """The pre-transformer's input ``[1, n, hidden]`` for a chunk's new codes ``[G, n]``."""
