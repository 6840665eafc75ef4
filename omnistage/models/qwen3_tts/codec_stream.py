"""Streamed 12 Hz decoding whose joined chunks equal one whole decode, whatever the chunk boundaries.

The decoder is causal end to end (:mod:`omnistage.models.qwen3_tts.codec_decoder`), so a stream only needs its
past, kept between chunks:
- the dequantised latents of its last 2 frames (the kernel-3 ``pre_conv`` reads them);
- per transformer layer the keys/values of its last ``sliding_window - 1`` frames (:class:`KVWindow`), so new
  frames attend exactly as in a whole pass (positions continue);
- per conv of the decoder its last inputs (:mod:`omnistage.models.codec_conv_stream`), so the convs run on the
  new frames only.
A chunk of ``n`` new frames then yields the whole decode's samples ``[start * 1920, (start + n) * 1920)``.
State lives from a stream's first chunk to its last (or :meth:`drop`). The interface is the one
:class:`omnistage.runner.GenerationRunner` drives (``decode_streams``/``drop``).

The reference decodes whole utterances with ``chunked_decode(300, 25)`` (each 300-frame chunk alone with 25
frames of context), which approximates this exact decode once an utterance passes 300 frames (24 s).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from omnistage.models.codec_stream import StreamingVocoder, StreamState
from omnistage.models.qwen3_tts.codec_decoder import CodecDecoder


@dataclass
class CodecStreamState(StreamState):
    latents: torch.Tensor | None = None  # [codebook_dim, <= 2] dequantised latents of the last frames


class StreamingCodecDecoder(StreamingVocoder[CodecStreamState]):
    """The 12 Hz decoder as a streaming vocoder stage uses it: per-stream state, chunks in order, exact joins."""

    def __init__(self, model: CodecDecoder) -> None:
        super().__init__(model)
        self.conv_reach = model.pre_conv.left_pad

    def decode(self, stream_id: str, chunk_index: int, codes: torch.Tensor, last: bool = False) -> torch.Tensor:
        """One stream's next chunk of new frames ``[G, n]`` -> its ``1920 n`` samples."""
        return self.decode_streams([stream_id], [chunk_index], [codes], [0], [last])[0]

    def _new_state(self) -> CodecStreamState:
        return CodecStreamState(self.model.pre_transformer.windows())

    def _features(self, state: CodecStreamState, codes: torch.Tensor) -> torch.Tensor:
        model = self.model
        model.check_codes(codes[None])
        latents = model.quantizer.decode(codes[None].to(next(model.parameters()).device))[0]  # [codebook_dim, n]
        joined = latents if state.latents is None else torch.cat([state.latents, latents], dim=1)
        state.latents = joined[:, -self.conv_reach:]
        return model.pre_conv(joined[None])[:, :, -codes.shape[-1]:].transpose(1, 2)  # the new frames only
