"""What every streaming codec decoder shares: per-stream state kept between chunks, chunks batched across streams.

A stream keeps, from its first chunk to its last (or :meth:`StreamingVocoder.drop`), the pre-transformer's
keys/values of its last frames (:class:`KVWindow`: new frames attend exactly as in a whole pass) and the transformer
outputs of its last ``context`` frames, which the convolutional decoder re-reads. A family's decoder says how codes
become the transformer's input (:meth:`_features`) and which samples of a chunk's vocoded window are new
(:meth:`_samples`); Qwen3-Omni's code2wav and Qwen3-TTS's codec decoder are the two.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import torch
from torch import nn

from omnistage.models.codec_transformer import KVWindow


@dataclass
class StreamState:
    windows: list[KVWindow]
    position: int = 0  # frames decoded so far
    tail: torch.Tensor | None = None  # [hidden, <= context] transformer outputs of the last frames
    next_chunk: int = 0


S = TypeVar("S", bound=StreamState)


class StreamingVocoder(ABC, Generic[S]):
    """The interface :class:`omnistage.runner.GenerationRunner` drives (``decode_streams``/``drop``)."""

    def __init__(self, model: nn.Module, context: int) -> None:
        self.model = model
        self.context = context  # transformer output frames the convs read behind a sample's own frame
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
        previous chunk (not needed here: the stream's state holds them) -> each chunk's samples ``[S_i]``."""
        hidden = [self._transform(sid, idx, c[:, ctx:]) for sid, idx, c, ctx in
                  zip(stream_ids, chunk_indices, codes, left_contexts)]
        lengths = [h.shape[-1] for h in hidden]
        batch = hidden[0].new_zeros(len(hidden), hidden[0].shape[0], max(lengths))  # right-padded: causal convs
        for i, h in enumerate(hidden):
            batch[i, :, :lengths[i]] = h
        wav = self.model.vocode(batch)[:, 0]
        out = []
        for i, (sid, n, done) in enumerate(zip(stream_ids, lengths, last)):
            context = n - (codes[i].shape[-1] - left_contexts[i])
            out.append(self._samples(wav[i], context, n))
            if done:
                self.drop(sid)
        return out

    def _transform(self, stream_id: str, chunk_index: int, codes: torch.Tensor) -> torch.Tensor:
        """Transformer outputs ``[hidden, context + n]`` of the stream's kept frames and the chunk's new ones."""
        state = self.streams.get(stream_id)
        if state is None:
            if chunk_index != 0:
                raise ValueError(f"{stream_id}: chunk {chunk_index} of a stream this decoder has no state for")
            state = self.streams[stream_id] = self._new_state()
        if chunk_index != state.next_chunk:
            raise ValueError(f"{stream_id}: chunk {chunk_index} arrived, chunk {state.next_chunk} was due")
        features = self._features(state, codes)  # [1, n, hidden]
        new = self.model.pre_transformer(features, state.windows, state.position)[0].T  # [hidden, n]
        joined = new if state.tail is None else torch.cat([state.tail, new], dim=1)
        state.tail = joined[:, -self.context:]
        state.position += codes.shape[-1]
        state.next_chunk += 1
        return joined

    @abstractmethod
    def _new_state(self) -> S: ...

    @abstractmethod
    def _features(self, state: S, codes: torch.Tensor) -> torch.Tensor:
        """The pre-transformer's input ``[1, n, hidden]`` for a chunk's new codes ``[G, n]``."""

    @abstractmethod
    def _samples(self, wav: torch.Tensor, context: int, n: int) -> torch.Tensor:
        """The chunk's new samples of its vocoded window ``wav`` (``context`` kept frames, then new ones, ``n``
        frames in all)."""
