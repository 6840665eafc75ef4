"""The non-autoregressive runner (Code2Wav): one batched decode per step.

Chunks of one shape go through ``decode_chunk`` as one batch. A vocoder that
also offers ``decode_rows`` (causal, so right-padding cannot change a row's
samples) takes chunks of different lengths and left contexts in one call.
"""

from __future__ import annotations

import torch

from omnistage.runner.base import Code2WavModel


class GenerationRunner:
    def __init__(self, model: Code2WavModel, device: torch.device | str = "cpu") -> None:
        self.model = model
        self.device = torch.device(device)
        self.pads_rows = callable(getattr(model, "decode_rows", None))

    @torch.inference_mode()
    def run(self, chunks: list[torch.Tensor], left_contexts: list[int]) -> list[torch.Tensor]:
        """Chunks ``[G, T_i]`` with their left contexts → one host float32 wav per chunk."""
        lengths = [c.shape[-1] for c in chunks]
        same = len(set(lengths)) == 1 and len(set(left_contexts)) == 1
        if same:
            codes = torch.stack(chunks).to(self.device, non_blocking=True)
            wav = self.model.decode_chunk(codes, left_contexts[0]).float().cpu()
            return list(wav.unbind(0))
        if not self.pads_rows:
            raise ValueError("this vocoder decodes one chunk shape per call; group chunks by shape")
        codes = chunks[0].new_zeros(len(chunks), chunks[0].shape[0], max(lengths))  # code 0 pads: any valid code
        for i, chunk in enumerate(chunks):
            codes[i, :, :lengths[i]] = chunk
        rows = self.model.decode_rows(codes.to(self.device, non_blocking=True), lengths, left_contexts)
        return [row.float().cpu() for row in rows]
