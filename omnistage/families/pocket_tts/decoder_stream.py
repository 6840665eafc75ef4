"""The latent decoder as a streaming vocoder stage drives it (``decode_streams``/``drop``): one
:class:`ConvStream` per stream, kept from its first chunk to its last, chunks in order.

A stream's first samples are faded in over 5 ms, as the reference's processor does (a fresh decoder state
starts with a small step, heard as a click).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from omnistage.families.pocket_tts.codec import LatentDecoder
from omnistage.models.mimi_convs import ConvStream

FADE_IN_S = 0.005


class StreamingLatentDecoder:
    def __init__(self, decoder: LatentDecoder) -> None:
        self.decoder = decoder
        self.streams: dict[str, tuple[ConvStream, int]] = {}  # stream id -> (state, next chunk index)
        self.fade = torch.linspace(0, 1, int(FADE_IN_S * decoder.cfg.sampling_rate))

    @property
    def samples_per_frame(self) -> int:
        return self.decoder.samples_per_frame

    def drop(self, stream_id: str) -> None:
        self.streams.pop(stream_id, None)

    @torch.inference_mode()
    def decode_streams(self, stream_ids: Sequence[str], chunk_indices: Sequence[int],
                       latents: Sequence[torch.Tensor], left_contexts: Sequence[int],
                       last: Sequence[bool]) -> list[torch.Tensor]:
        """One chunk per stream: ``latents[i]`` ``[latent, T_i]`` whose first ``left_contexts[i]`` frames its
        state already holds -> each chunk's new samples."""
        out = []
        for sid, index, chunk, context, done in zip(stream_ids, chunk_indices, latents, left_contexts, last):
            state = self._state(sid, index)
            wav = self.decoder.decode(chunk[:, context:].T.float(), state)
            if index == 0:
                n = min(len(self.fade), wav.shape[0])
                wav = wav.clone()
                wav[:n] *= self.fade[:n].to(wav)
            out.append(wav)
            if done:
                self.drop(sid)
        return out

    def _state(self, stream_id: str, index: int) -> ConvStream:
        if index == 0:
            state = self.decoder.new_state()
        else:
            held = self.streams.get(stream_id)
            if held is None or held[1] != index:
                due = None if held is None else held[1]
                raise ValueError(f"{stream_id}: chunk {index} arrived, chunk {due} was due")
            state = held[0]
        self.streams[stream_id] = (state, index + 1)
        return state
