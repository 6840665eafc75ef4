"""The latent decoder as a streaming vocoder stage drives it (``decode_streams``/``drop``): one
:class:`omnistage.models.mimi_convs.ConvStream` per stream, kept from its first chunk to its last, chunks in order.

A stream's first samples are faded in over 5 ms, as the reference's processor does (a fresh decoder state
starts with a small step, heard as a click).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from omnistage.families.pocket_tts.codec import LatentDecoder
from omnistage.models.mimi_stream import StreamStates

FADE_IN_S = 0.005


class StreamingLatentDecoder:
    def __init__(self, decoder: LatentDecoder) -> None:
        self.decoder = decoder
        self.states = StreamStates(decoder.new_state)
        self.fade = torch.linspace(0, 1, int(FADE_IN_S * decoder.cfg.sampling_rate))

    @property
    def samples_per_frame(self) -> int:
        return self.decoder.samples_per_frame

    def drop(self, stream_id: str) -> None:
        self.states.drop(stream_id)

    @torch.inference_mode()
    def decode_streams(self, stream_ids: Sequence[str], chunk_indices: Sequence[int],
                       latents: Sequence[torch.Tensor], left_contexts: Sequence[int],
                       last: Sequence[bool]) -> list[torch.Tensor]:
        """One chunk per stream: ``latents[i]`` ``[latent, T_i]`` whose first ``left_contexts[i]`` frames its
        state already holds -> each chunk's new samples."""
        out = []
        for sid, index, chunk, context, done in zip(stream_ids, chunk_indices, latents, left_contexts, last):
            state = self.states.take(sid, index)
            wav = self.decoder.decode(chunk[:, context:].T.float(), state)
            if index == 0:
                n = min(len(self.fade), wav.shape[0])
                wav = wav.clone()
                wav[:n] *= self.fade[:n].to(wav)
            out.append(wav)
            if done:
                self.drop(sid)
        return out
