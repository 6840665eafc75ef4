"""Streamed 12 Hz decoding whose joined chunks equal one whole decode, whatever the chunk boundaries.

The decoder is causal end to end (:mod:`omnistage.models.qwen3_tts.codec_decoder`), so a stream only needs its
past, kept between chunks:
- the dequantised latents of its last 2 frames (the kernel-3 ``pre_conv`` reads them);
- per transformer layer the keys/values of its last ``sliding_window - 1`` frames (:class:`KVWindow`), so new
  frames attend exactly as in a whole pass (positions continue);
- the transformer outputs of its last few frames, enough for the convolutional decoder's receptive field
  (:func:`conv_context_frames`, 11 frames at the real rates), which the convs re-read as context.
A chunk of ``n`` new frames then yields the whole decode's samples ``[start * 1920, (start + n) * 1920)``.
State lives from a stream's first chunk to its last (or :meth:`drop`). The interface is the one
:class:`omnistage.runner.GenerationRunner` drives (``decode_streams``/``drop``).

The reference decodes whole utterances with ``chunked_decode(300, 25)`` (each 300-frame chunk alone with 25
frames of context), which approximates this exact decode once an utterance passes 300 frames (24 s).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from omnistage.models.codec_transformer import KVWindow
from omnistage.models.codec_convs import conv_context_frames as codec_context_frames
from omnistage.models.qwen3_tts.codec_decoder import CausalConvTranspose1d, CodecDecoder


def conv_context_frames(model: CodecDecoder) -> int:
    """Frames of transformer output the conv decoder reads behind a sample's own frame."""
    return codec_context_frames(model.upsample, model.decoder, CausalConvTranspose1d)


@dataclass
class CodecStreamState:
    windows: list[KVWindow]
    position: int = 0  # frames decoded so far
    latents: torch.Tensor | None = None  # [codebook_dim, <= 2] dequantised latents of the last frames
    tail: torch.Tensor | None = None  # [latent, <= context] transformer outputs of the last frames
    next_chunk: int = 0


class StreamingCodecDecoder:
    """The 12 Hz decoder as a streaming vocoder stage uses it: per-stream state, chunks in order, exact joins."""

    def __init__(self, model: CodecDecoder) -> None:
        self.model = model
        self.context = conv_context_frames(model)
        self.conv_reach = model.pre_conv.left_pad
        self.streams: dict[str, CodecStreamState] = {}

    @property
    def samples_per_frame(self) -> int:
        return self.model.samples_per_frame

    def drop(self, stream_id: str) -> None:
        self.streams.pop(stream_id, None)

    @torch.inference_mode()
    def decode_streams(self, stream_ids: Sequence[str], chunk_indices: Sequence[int], codes: Sequence[torch.Tensor],
                       left_contexts: Sequence[int], last: Sequence[bool]) -> list[torch.Tensor]:
        """One chunk per stream: ``codes[i]`` ``[G, T_i]`` whose first ``left_contexts[i]`` frames were in its previous
        chunk (not needed: the stream's state holds them) -> each chunk's samples ``[1920 (T_i - left_contexts[i])]``."""
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
            out.append(wav[i, context * self.samples_per_frame:n * self.samples_per_frame])
            if done:
                self.drop(sid)
        return out

    def decode(self, stream_id: str, chunk_index: int, codes: torch.Tensor, last: bool = False) -> torch.Tensor:
        """One stream's next chunk of new frames ``[G, n]`` -> its ``1920 n`` samples."""
        return self.decode_streams([stream_id], [chunk_index], [codes], [0], [last])[0]

    def _transform(self, stream_id: str, chunk_index: int, codes: torch.Tensor) -> torch.Tensor:
        """Transformer outputs ``[latent, context + n]`` of the stream's kept frames and the chunk's new ones."""
        state = self._state(stream_id, chunk_index)
        model = self.model
        device = next(model.parameters()).device
        model.check_codes(codes[None])
        latents = model.quantizer.decode(codes[None].to(device))[0]  # [codebook_dim, n]
        joined = latents if state.latents is None else torch.cat([state.latents, latents], dim=1)
        state.latents = joined[:, -self.conv_reach:]
        pre = model.pre_conv(joined[None])[:, :, -codes.shape[-1]:].transpose(1, 2)  # the new frames only
        new = model.pre_transformer(pre, state.windows, state.position)[0].T  # [latent, n]
        out = new if state.tail is None else torch.cat([state.tail, new], dim=1)
        state.tail = out[:, -self.context:]
        state.position += codes.shape[-1]
        state.next_chunk += 1
        return out

    def _state(self, stream_id: str, chunk_index: int) -> CodecStreamState:
        state = self.streams.get(stream_id)
        if state is None:
            if chunk_index != 0:
                raise ValueError(f"{stream_id}: chunk {chunk_index} of a stream this decoder has no state for")
            state = self.streams[stream_id] = CodecStreamState(self.model.pre_transformer.windows())
        if chunk_index != state.next_chunk:
            raise ValueError(f"{stream_id}: chunk {chunk_index} arrived, chunk {state.next_chunk} was due")
        return state
