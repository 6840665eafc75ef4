"""Code2Wav: Qwen3-Omni's vocoder, codec codes ``[B, groups, T]`` -> 24 kHz waveform.

The math matches transformers' ``Qwen3OmniMoeCode2Wav`` and the parameter names
are transformers' (relative to ``code2wav.``), so ``load_module(model, ckpt,
"code2wav.")`` fills it from a Hugging Face checkpoint. The stack: average the
groups' code embeddings (one vector per 80 ms frame); a causal sliding-window
transformer with layer scale; transposed convs + ConvNeXt blocks (x4); a conv
decoder of SnakeBeta / transposed-conv blocks (x480); clamp to [-1, 1].

Everything is causal except the decoder's transposed convs, where a sample may
depend on the next frame: ``forward`` returns ``T * samples_per_frame -
lookahead_samples`` samples (1920 T - 555), the rest would need frame ``T``.
Rows padded on the right therefore keep their samples (see ``decode_rows``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from omnistage.models.codec_convs import (CausalConv1d, ConvNeXtBlock, DecoderBlock, SnakeBeta,
                                                       TrimmedConvTranspose1d)
from omnistage.models.codec_transformer import Code2WavConfig, PreTransformer
from omnistage.models.weights import Checkpoint, load_module

class Code2Wav(nn.Module):
    """Codes ``[B, num_quantizers, T]`` (int64) -> waveform in [-1, 1] at 24 kHz.

    All rows of a call share T: the generation runner either groups chunks of
    equal length or right-pads them and calls ``decode_rows``.
    """

    def __init__(self, config: Code2WavConfig) -> None:
        super().__init__()
        self.config = config
        hidden = config.hidden_size
        self.pre_transformer = PreTransformer(config)
        # One table for all groups; group g's codes live at offset g * codebook_size.
        self.code_embedding = nn.Embedding(config.codebook_size * config.num_quantizers, hidden)
        offsets = torch.arange(config.num_quantizers).view(1, -1, 1) * config.codebook_size
        self.register_buffer("code_offset", offsets, persistent=False)
        self.upsample = nn.ModuleList(
            nn.ModuleList([TrimmedConvTranspose1d(hidden, hidden, r, r), ConvNeXtBlock(hidden)])
            for r in config.upsampling_ratios
        )
        dims = [config.decoder_dim // 2**i for i in range(len(config.upsample_rates) + 1)]
        blocks = [DecoderBlock(dims[i], dims[i + 1], r) for i, r in enumerate(config.upsample_rates)]
        self.decoder = nn.ModuleList(
            [CausalConv1d(hidden, config.decoder_dim, 7), *blocks, SnakeBeta(dims[-1]), CausalConv1d(dims[-1], 1, 7)]
        )

    @property
    def samples_per_frame(self) -> int:
        return self.config.samples_per_frame

    @property
    def sample_rate(self) -> int:
        return self.config.sample_rate

    @property
    def lookahead_samples(self) -> int:
        """Samples at the end of a decode that would need the next frame, so are not produced.

        Each decoder transposed conv loses ``rate`` steps at its input rate: 555 for (8, 5, 4, 3).
        """
        rates = self.config.upsample_rates
        return sum(rate * math.prod(rates[i + 1 :]) for i, rate in enumerate(rates))

    def num_samples(self, num_frames: int) -> int:
        """Length of ``forward``'s output for ``num_frames`` frames."""
        return num_frames * self.samples_per_frame - self.lookahead_samples

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """``[B, G, T]`` codes -> ``[B, 1, num_samples(T)]``, as transformers' ``Code2Wav.forward``."""
        self._check_codes(codes)
        hidden = self.pre_transformer(self.embed(codes)).transpose(1, 2)  # [B, hidden, T]: channels first
        return self.vocode(hidden)

    def embed(self, codes: torch.Tensor) -> torch.Tensor:
        """``[B, G, T]`` codes -> ``[B, T, hidden]``, the mean of the groups' code embeddings."""
        return self.code_embedding(codes + self.code_offset).mean(1)

    def vocode(self, hidden: torch.Tensor) -> torch.Tensor:
        """The convolutional part: transformer outputs ``[B, hidden, T]`` -> ``[B, 1, num_samples(T)]``."""
        for upsample_conv, convnext in self.upsample:
            hidden = convnext(upsample_conv(hidden))
        for layer in self.decoder:
            hidden = layer(hidden)
        return hidden.clamp(min=-1.0, max=1.0)

    def decode_chunk(self, codes: torch.Tensor, left_context: int, seamless: bool = False) -> torch.Tensor:
        """Decodes a chunk whose first ``left_context`` frames are context -> ``[B, samples]``.

        Default, as transformers' ``chunked_decode``: drops ``left_context * samples_per_frame``
        samples, leaving ``num_samples(T - left_context)``. That also drops the previous chunk's
        missing tail, so chunks join with a ``lookahead_samples`` hole at each boundary.
        ``seamless=True`` keeps that tail (computed from the context): chunks then join gaplessly.
        """
        start = self._chunk_start(codes.shape[-1], left_context, seamless)
        return self(codes)[:, 0, start:]

    def decode_rows(
        self, codes: torch.Tensor, lengths: Sequence[int], left_contexts: Sequence[int], seamless: bool = False
    ) -> list[torch.Tensor]:
        """Chunks of several requests in one call, right-padded to ``codes.shape[-1]`` with any valid code.

        Row i holds ``lengths[i]`` real frames, the first ``left_contexts[i]``
        of them context. Decoding is causal, so pad frames cannot change a
        row's first ``num_samples(lengths[i])`` samples: each row equals its
        own ``decode_chunk``.
        """
        rows, total = codes.shape[0], codes.shape[-1]
        if len(lengths) != rows or len(left_contexts) != rows or not all(0 < n <= total for n in lengths):
            raise ValueError(f"need {rows} lengths in [1, {total}] and {rows} left contexts, got {lengths}")
        wav = self(codes)[:, 0]
        return [
            wav[i, self._chunk_start(n, ctx, seamless) : self.num_samples(n)]
            for i, (n, ctx) in enumerate(zip(lengths, left_contexts))
        ]

    def chunked_decode(self, codes: torch.Tensor, chunk_size: int = 300, left_context: int = 25) -> torch.Tensor:
        """Whole-utterance decode in chunks, as transformers' ``chunked_decode`` -> ``[B, 1, samples]``."""
        spans = chunk_spans(codes.shape[-1], chunk_size, left_context)
        pieces = [self.decode_chunk(codes[..., lo:hi], ctx) for lo, hi, ctx in spans]
        return torch.cat(pieces, dim=-1).unsqueeze(1)

    def _chunk_start(self, num_frames: int, left_context: int, seamless: bool) -> int:
        if not 0 <= left_context < num_frames:
            raise ValueError(f"left_context must be in [0, {num_frames}), got {left_context}")
        start = left_context * self.samples_per_frame
        return start - self.lookahead_samples if seamless and left_context > 0 else start

    def _check_codes(self, codes: torch.Tensor) -> None:
        groups = self.config.num_quantizers
        if codes.dim() != 3 or codes.shape[1] != groups or codes.shape[2] < 1 or codes.is_floating_point():
            raise ValueError(f"codes must be integer [B, {groups}, T >= 1], got {codes.dtype} {tuple(codes.shape)}")


def chunk_spans(num_frames: int, chunk_size: int, left_context: int) -> list[tuple[int, int, int]]:
    """``(first frame incl. context, end frame, context frames)`` per chunk, as transformers cuts them."""
    if chunk_size < 1 or left_context < 0:
        raise ValueError("chunk_size must be positive and left_context non-negative")
    starts = range(0, num_frames, chunk_size)
    return [(s - min(left_context, s), min(s + chunk_size, num_frames), min(left_context, s)) for s in starts]


def load_code2wav(
    folder: str | Path, config: Code2WavConfig, device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> Code2Wav:
    """Builds the vocoder of a Hugging Face Qwen3-Omni folder (``Qwen3OmniConfig.code2wav``) and loads its
    ``code2wav.`` weights."""
    model = Code2Wav(config)
    with Checkpoint(folder) as ckpt:
        load_module(model, ckpt, "code2wav.", dtype=dtype)
    return model.to(device=device).eval()
