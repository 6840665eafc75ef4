"""The non-autoregressive runner (Code2Wav): one batched decode per step.

A streaming vocoder (``decode_streams``: it keeps each stream's state between chunks, so chunks join exactly)
takes the step's chunks of any shapes at once, each named by its stream and index. A vocoder of overlapping
windows (``decode_windows``: not causal, so each chunk is decoded with context on both sides) takes them the same
way, with each chunk's look-ahead frames. A vocoder conditioned per stream (``open_stream``: a speaker, a noise
seed) hears a stream's voice before its first chunk. Otherwise chunks of one shape go through ``decode_chunk`` as
one batch, and a vocoder that also offers ``decode_rows`` (causal, so right-padding cannot change a row's samples)
takes chunks of different lengths and left contexts in one call.

Such a causal vocoder's calls, like a streaming one's convs, are right-padded to a few bucketed lengths
(:func:`~omnistage.models.codec_conv_stream.bucket_frames`).
"""

from __future__ import annotations

import torch

from omnistage.engine.generation_engine import ChunkRef, StreamVoice
from omnistage.models.codec_conv_stream import bucket_frames
from omnistage.runner.base import Code2WavModel
from omnistage.runner.device import bind_device


def _offers(model: object, name: str) -> bool:
    return callable(getattr(model, name, None))


class GenerationRunner:
    def __init__(self, model: Code2WavModel, device: torch.device | str = "cpu") -> None:
        self.model = model
        self.device = torch.device(device)
        bind_device(self.device)
        self.windows = _offers(model, "decode_windows")
        self.streams = self.windows or _offers(model, "decode_streams")
        self.conditioned = _offers(model, "open_stream")
        self.pads_rows = self.streams or _offers(model, "decode_rows")
        # 0 when the vocoder does not say: its chunks cannot ask for frames to be discarded.
        self.samples_per_frame = int(getattr(model, "samples_per_frame", 0))

    def drop(self, stream_id: str) -> None:
        """Frees what a streaming vocoder keeps for a stream that will send no more chunks (an abort)."""
        if self.streams:
            self.model.drop(stream_id)  # type: ignore[attr-defined]

    @torch.inference_mode()
    def run(self, chunks: list[torch.Tensor], left_contexts: list[int],
            refs: list[ChunkRef] | None = None) -> list[torch.Tensor]:
        """Chunks ``[G, T_i]`` with their left contexts (and streams) → one host float32 wav per chunk."""
        if self.streams:
            if refs is None:
                raise ValueError("a streaming vocoder needs each chunk's stream")
            return [w.float().cpu() for w in self._run_streams(chunks, left_contexts, refs)]
        lengths = [c.shape[-1] for c in chunks]
        padded = bucket_frames(max(lengths)) if self.pads_rows else max(lengths)
        same = len(set(lengths)) == 1 and len(set(left_contexts)) == 1 and padded == lengths[0]
        if same:
            codes = torch.stack(chunks).to(self.device, non_blocking=True)
            wav = self.model.decode_chunk(codes, left_contexts[0]).float().cpu()
            return list(wav.unbind(0))
        if not self.pads_rows:
            raise ValueError("this vocoder decodes one chunk shape per call; group chunks by shape")
        codes = chunks[0].new_zeros(len(chunks), chunks[0].shape[0], padded)  # code 0 pads: any valid code
        for i, chunk in enumerate(chunks):
            codes[i, :, :lengths[i]] = chunk
        rows = self.model.decode_rows(codes.to(self.device, non_blocking=True), lengths, left_contexts)
        return [row.float().cpu() for row in rows]

    def _run_streams(self, chunks: list[torch.Tensor], left_contexts: list[int],
                     refs: list[ChunkRef]) -> list[torch.Tensor]:
        model = self.model
        if self.conditioned:
            for ref in refs:
                if ref.index == 0:
                    voice = ref.voice or StreamVoice()
                    model.open_stream(ref.stream_id, voice.voice, voice.seed)  # type: ignore[attr-defined]
        ids, indices, lasts = [r.stream_id for r in refs], [r.index for r in refs], [r.last for r in refs]
        on_device = [c.to(self.device, non_blocking=True) for c in chunks]
        if self.windows:
            return model.decode_windows(  # type: ignore[attr-defined]
                ids, indices, on_device, left_contexts, [r.lookahead for r in refs], lasts)
        return model.decode_streams(ids, indices, on_device, left_contexts, lasts)  # type: ignore[attr-defined]
