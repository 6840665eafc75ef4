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

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from omnistage.models.codec_transformer import KVWindow
from omnistage.models.qwen3_omni.code2wav import Code2Wav
from omnistage.models.codec_convs import TrimmedConvTranspose1d
from omnistage.models.codec_convs import conv_context_frames as codec_context_frames


def conv_context_frames(model: Code2Wav) -> int:
    """Frames of transformer output the convolutional decoder reads behind a sample's own frame."""
    return codec_context_frames(model.upsample, model.decoder, TrimmedConvTranspose1d)


@dataclass
class StreamState:
    windows: list[KVWindow]
    position: int = 0  # frames decoded so far
    tail: torch.Tensor | None = None  # [hidden, <= context] transformer outputs of the last frames
    next_chunk: int = 0


class StreamingCode2Wav:
    """The vocoder as the code2wav stage uses it: per-stream state, chunks in order, exact joins."""

    def __init__(self, model: Code2Wav) -> None:
        self.model = model
        self.context = conv_context_frames(model)
        self.streams: dict[str, StreamState] = {}

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
            start = context * self.model.samples_per_frame - (self.model.lookahead_samples if context else 0)
            # The last chunk also ends the utterance: its final 555 samples stay unproduced, as in a whole decode.
            out.append(wav[i, start:self.model.num_samples(n)])
            if done:
                self.drop(sid)
        return out

    def _transform(self, stream_id: str, chunk_index: int, codes: torch.Tensor) -> torch.Tensor:
        """Transformer outputs ``[hidden, context + n]`` of the stream's kept frames and the chunk's new ones."""
        state = self.streams.get(stream_id)
        if state is None:
            if chunk_index != 0:
                raise ValueError(f"{stream_id}: chunk {chunk_index} of a stream this vocoder has no state for")
            state = self.streams[stream_id] = StreamState(self.model.pre_transformer.windows())
        if chunk_index != state.next_chunk:
            raise ValueError(f"{stream_id}: chunk {chunk_index} arrived, chunk {state.next_chunk} was due")
        embeds = self.model.embed(codes[None].to(self.model.code_offset.device))
        new = self.model.pre_transformer(embeds, state.windows, state.position)[0].T  # [hidden, n]
        joined = new if state.tail is None else torch.cat([state.tail, new], dim=1)
        state.tail = joined[:, -self.context:]
        state.position += codes.shape[-1]
        state.next_chunk += 1
        return joined
