"""Mimi's decoder as a streaming codec stage drives it (``decode_streams``/``drop``): one :class:`ConvStream` per
stream, kept from its first chunk to its last, chunks in order, so a stream's chunks join to its whole decode."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from omnistage.models.mimi import MimiCodec
from omnistage.models.mimi_convs import ConvStream


class MimiStreams:
    def __init__(self, codec: MimiCodec) -> None:
        if codec.decoder is None:
            raise ValueError("a Mimi stream decoder needs the codec's decoder")
        self.codec = codec
        self.streams: dict[str, tuple[ConvStream, int]] = {}  # stream id -> (state, next chunk index)

    @property
    def samples_per_frame(self) -> int:
        return self.codec.samples_per_frame

    def drop(self, stream_id: str) -> None:
        self.streams.pop(stream_id, None)

    @torch.inference_mode()
    def decode_streams(self, stream_ids: Sequence[str], chunk_indices: Sequence[int], codes: Sequence[torch.Tensor],
                       left_contexts: Sequence[int], last: Sequence[bool]) -> list[torch.Tensor]:
        """One chunk per stream: ``codes[i]`` ``[K, T_i]`` whose first ``left_contexts[i]`` frames its state
        already holds -> each chunk's new samples ``[frame_size * new frames]``."""
        states = [self._state(sid, index) for sid, index in zip(stream_ids, chunk_indices)]
        top = self.codec.cfg.codebook_size - 1
        # A model's vocabulary may hold ids past the codec's (CSM's 2048..2050, its own markers) that a trained
        # model does not emit in a frame; clamped, one such code cannot end the stream.
        out = [self.codec.decode(chunk[None, :, context:].clamp(0, top), state)[0]
               for state, chunk, context in zip(states, codes, left_contexts)]
        for sid, done in zip(stream_ids, last):
            if done:
                self.drop(sid)
        return out

    def _state(self, stream_id: str, index: int) -> ConvStream:
        if index == 0:
            state = self.codec.decoder.new_stream()
        else:
            held = self.streams.get(stream_id)
            if held is None or held[1] != index:
                due = None if held is None else held[1]
                raise ValueError(f"{stream_id}: chunk {index} arrived, chunk {due} was due")
            state = held[0]
        self.streams[stream_id] = (state, index + 1)
        return state
