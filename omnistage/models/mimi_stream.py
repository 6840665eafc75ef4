"""Mimi's decoder as a streaming codec stage drives it (``decode_streams``/``drop``): one :class:`ConvStream` per
stream, kept from its first chunk to its last, chunks in order, so a stream's chunks join to its whole decode."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from omnistage.models.mimi import MimiCodec
from omnistage.models.mimi_convs import ConvStream


class StreamStates:
    """Each stream's :class:`ConvStream` and the chunk it expects next: a chunk out of order is an error, never
    decoded on another chunk's state."""

    def __init__(self, new: Callable[[], ConvStream]) -> None:
        self.new = new
        self.held: dict[str, tuple[ConvStream, int]] = {}

    def drop(self, stream_id: str) -> None:
        self.held.pop(stream_id, None)

    def take(self, stream_id: str, index: int) -> ConvStream:
        """The state chunk ``index`` of ``stream_id`` continues (a fresh one for chunk 0)."""
        if index == 0:
            state = self.new()
        else:
            held = self.held.get(stream_id)
            if held is None or held[1] != index:
                due = None if held is None else held[1]
                raise ValueError(f"{stream_id}: chunk {index} arrived, chunk {due} was due")
            state = held[0]
        self.held[stream_id] = (state, index + 1)
        return state


class MimiStreams:
    def __init__(self, codec: MimiCodec) -> None:
        if codec.decoder is None:
            raise ValueError("a Mimi stream decoder needs the codec's decoder")
        self.codec = codec
        self.states = StreamStates(codec.decoder.new_stream)

    @property
    def samples_per_frame(self) -> int:
        return self.codec.samples_per_frame

    def drop(self, stream_id: str) -> None:
        self.states.drop(stream_id)

    @torch.inference_mode()
    def decode_streams(self, stream_ids: Sequence[str], chunk_indices: Sequence[int], codes: Sequence[torch.Tensor],
                       left_contexts: Sequence[int], last: Sequence[bool]) -> list[torch.Tensor]:
        """One chunk per stream: ``codes[i]`` ``[K, T_i]`` whose first ``left_contexts[i]`` frames its state
        already holds -> each chunk's new samples ``[frame_size * new frames]``."""
        states = [self.states.take(sid, index) for sid, index in zip(stream_ids, chunk_indices)]
        top = self.codec.cfg.codebook_size - 1
        # A model's vocabulary may hold ids past the codec's (CSM's 2048..2050, its own markers) that a trained
        # model does not emit in a frame; clamped, one such code cannot end the stream.
        out = [self.codec.decode(chunk[None, :, context:].clamp(0, top), state)[0]
               for state, chunk, context in zip(states, codes, left_contexts)]
        for sid, done in zip(stream_ids, last):
            if done:
                self.drop(sid)
        return out
