"""Streamed decoding that equals one whole-utterance decode, whatever the chunk boundaries.

Decoding each chunk alone with some frames of left context (transformers' ``chunked_decode``) is approximate: the
pre-transformer's sliding window (72 frames per layer, so 8 x 71 frames back at real size) reaches far past any
affordable context, so the samples depend on where chunks start. Here each stream keeps, between its chunks,
- per transformer layer the keys/values of its last 71 frames (:class:`KVWindow`), so new frames attend exactly as
  in a whole pass (positions continue; nothing before them is recomputed);
- the transformer outputs of its last few frames, enough to cover the convolutional decoder's receptive field
  (:func:`conv_context_frames`, ~10 frames for the real rates), which the convs re-read as context.
A chunk's samples are then the whole decode's samples ``[start * 1920 - 555, end * 1920 - 555)`` (the last 555
need the next frame, and come with the next chunk): joined chunks equal ``Code2Wav.forward`` of all frames up to
floating-point order. State lives from a stream's first chunk to its last (or :meth:`drop`).
"""

from __future__ import annotations

import torch

from omnistage.models.qwen3_omni.code2wav import Code2Wav
from omnistage.models.codec_convs import TrimmedConvTranspose1d
from omnistage.models.codec_convs import conv_context_frames as codec_context_frames
from omnistage.models.codec_stream import StreamingVocoder, StreamState


def conv_context_frames(model: Code2Wav) -> int:
    """Frames of transformer output the convolutional decoder reads behind a sample's own frame."""
    return codec_context_frames(model.upsample, model.decoder, TrimmedConvTranspose1d)


class StreamingCode2Wav(StreamingVocoder[StreamState]):
    """The vocoder as the code2wav stage uses it: per-stream state, chunks in order, exact joins."""

    def __init__(self, model: Code2Wav) -> None:
        super().__init__(model, conv_context_frames(model))

    def _new_state(self) -> StreamState:
        return StreamState(self.model.pre_transformer.windows())

    def _features(self, state: StreamState, codes: torch.Tensor) -> torch.Tensor:
        return self.model.embed(codes[None].to(self.model.code_offset.device))

    def _samples(self, wav: torch.Tensor, context: int, n: int) -> torch.Tensor:
        start = context * self.model.samples_per_frame - (self.model.lookahead_samples if context else 0)
        # The last chunk also ends the utterance: its final 555 samples stay unproduced, as in a whole decode.
        return wav[start:self.model.num_samples(n)]
