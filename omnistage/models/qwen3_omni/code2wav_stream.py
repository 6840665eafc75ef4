"""Streamed decoding that equals one whole-utterance decode, whatever the chunk boundaries.

Decoding each chunk alone with some frames of left context (transformers' ``chunked_decode``) is approximate: the
pre-transformer's sliding window (72 frames per layer, so 8 x 71 frames back at real size) reaches far past any
affordable context, so the samples depend on where chunks start. Here each stream keeps, between its chunks,
- per transformer layer the keys/values of its last 71 frames (:class:`KVWindow`), so new frames attend exactly as
  in a whole pass (positions continue; nothing before them is recomputed);
- per conv of the decoder its last inputs (:mod:`omnistage.models.codec_conv_stream`), so the convs run on the new
  frames only.
A chunk's samples are then the whole decode's samples ``[start * 1920 - 555, end * 1920 - 555)`` (the first chunk's
start at 0; the last 555 need the next frame, and come with the next chunk): joined chunks equal
``Code2Wav.forward`` of all frames up to floating-point order. State lives from a stream's first chunk to its last
(or :meth:`drop`).
"""

from __future__ import annotations

import torch

from omnistage.models.codec_stream import StreamingVocoder, StreamState


class StreamingCode2Wav(StreamingVocoder[StreamState]):
    """The vocoder as the code2wav stage uses it: per-stream state, chunks in order, exact joins."""

    def _new_state(self) -> StreamState:
        return StreamState(self.model.pre_transformer.windows())

    def _features(self, state: StreamState, codes: torch.Tensor) -> torch.Tensor:
        return self.model.embed(codes[None].to(self.model.code_offset.device))
