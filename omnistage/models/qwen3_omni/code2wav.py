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

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.models.qwen3_omni.code2wav_convs import (CausalConv1d, ConvNeXtBlock, DecoderBlock, SnakeBeta,
                                                       TrimmedConvTranspose1d)
from omnistage.models.qwen3_omni.weights import Checkpoint, load_module

_ACTIVATIONS = {"silu": F.silu, "gelu": F.gelu, "relu": F.relu}


@dataclass(frozen=True)
class Code2WavConfig:
    """The vocoder's shape; defaults are Qwen3-Omni-30B-A3B's. Build with ``from_hf``."""

    codebook_size: int = 2048
    num_quantizers: int = 16
    hidden_size: int = 1024
    num_hidden_layers: int = 8
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    head_dim: int | None = None  # None: hidden_size // num_attention_heads
    intermediate_size: int = 3072
    hidden_act: str = "silu"
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    sliding_window: int = 72
    layer_scale_initial_scale: float = 0.01
    attention_bias: bool = False
    upsampling_ratios: tuple[int, ...] = (2, 2)
    upsample_rates: tuple[int, ...] = (8, 5, 4, 3)
    decoder_dim: int = 1536

    def __post_init__(self) -> None:
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        object.__setattr__(self, "upsampling_ratios", tuple(self.upsampling_ratios))
        object.__setattr__(self, "upsample_rates", tuple(self.upsample_rates))
        self._validate()

    def _validate(self) -> None:
        sizes = ("codebook_size", "num_quantizers", "hidden_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "intermediate_size", "sliding_window", "decoder_dim")
        problems = [f"{name} must be positive" for name in sizes if int(getattr(self, name)) < 1]
        problems += [message for bad, message in (
            (self.num_attention_heads % max(self.num_key_value_heads, 1), "heads must be a multiple of KV heads"),
            (self.head_dim % 2, "head_dim must be even for rotary embeddings"),
            (self.hidden_act not in _ACTIVATIONS, f"hidden_act must be one of {sorted(_ACTIVATIONS)}"),
            (not self.upsample_rates or min(self.upsample_rates + self.upsampling_ratios) < 1, "bad rates"),
            (self.decoder_dim % 2 ** len(self.upsample_rates), "decoder_dim must divide by 2**len(upsample_rates)"),
        ) if bad]
        if problems:
            raise ValueError(f"invalid code2wav config {self}: " + "; ".join(problems))

    @classmethod
    def from_hf(cls, source: Mapping[str, Any] | Any) -> Code2WavConfig:
        """From config.json's ``code2wav_config`` dict or transformers' config object."""
        raw = dict(source) if isinstance(source, Mapping) else source.to_dict()
        # transformers 5 nests rope settings in rope_parameters; 4.x configs keep them at the top.
        rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
        if rope.get("rope_type", rope.get("type", "default")) != "default":
            raise ValueError(f"code2wav supports only default rotary embeddings, got {rope}")
        raw["rope_theta"] = float(rope.get("rope_theta", raw.get("rope_theta", cls.rope_theta)))
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in known and v is not None})


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Statistics in fp32 so bf16 inputs normalise like fp32 ones.
        x32 = x.float()
        return self.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


class LayerScale(nn.Module):
    def __init__(self, dim: int, initial: float) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), initial))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: Code2WavConfig) -> None:
        super().__init__()
        self.head_dim = int(cfg.head_dim)
        self.kv_groups = cfg.num_attention_heads // cfg.num_key_value_heads
        q_dim, kv_dim = cfg.num_attention_heads * self.head_dim, cfg.num_key_value_heads * self.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, q_dim, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, kv_dim, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, kv_dim, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(q_dim, cfg.hidden_size, bias=cfg.attention_bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor,
                window: KVWindow | None = None) -> torch.Tensor:
        batch, length, _ = x.shape
        q, k, v = (proj(x).view(batch, length, -1, self.head_dim).transpose(1, 2)
                   for proj in (self.q_proj, self.k_proj, self.v_proj))
        q, k = (t * cos + _rotate_half(t) * sin for t in (q, k))
        if window is not None:  # a stream's earlier frames: attend over them too, keep the newest
            k, v = window.extend(k, v)
        if self.kv_groups > 1:  # KV head h serves query heads h * groups ... (h + 1) * groups - 1
            k, v = (t.repeat_interleave(self.kv_groups, dim=1) for t in (k, v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.head_dim**-0.5)
        return self.o_proj(out.transpose(1, 2).reshape(batch, length, -1))


class Mlp(nn.Module):
    def __init__(self, cfg: Code2WavConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.act = _ACTIVATIONS[cfg.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class TransformerLayer(nn.Module):
    def __init__(self, cfg: Code2WavConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = Mlp(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)
        self.mlp_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor,
                window: KVWindow | None = None) -> torch.Tensor:
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), cos, sin, mask, window))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


@dataclass
class KVWindow:
    """One layer's keys/values ``[B, Hkv, L, D]`` of a stream's last ``size`` frames (the sliding window less
    one), so the next chunk's frames attend exactly as in a whole-utterance pass."""

    size: int
    keys: torch.Tensor | None = None
    values: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.keys is None else self.keys.shape[2]

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The earlier frames' keys/values followed by ``k``/``v``; the newest ``size`` are kept."""
        if self.keys is not None and self.values is not None:
            k, v = torch.cat([self.keys, k], dim=2), torch.cat([self.values, v], dim=2)
        self.keys, self.values = k[:, :, -self.size:], v[:, :, -self.size:]
        return k, v


class PreTransformer(nn.Module):
    """Causal sliding-window transformer over frames; no KV cache (each call sees its whole chunk)."""

    def __init__(self, cfg: Code2WavConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList([TransformerLayer(cfg) for _ in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, windows: list[KVWindow] | None = None, offset: int = 0) -> torch.Tensor:
        """``[B, T, hidden]`` -> ``[B, T, hidden]``. With ``windows`` (one per layer) the frames continue a
        stream at position ``offset``, attending over its earlier frames kept there."""
        length = x.shape[1]
        cos, sin = self._rope(length, x, offset)
        past = windows[0].length if windows else 0
        mask = sliding_causal_mask(length, self.cfg.sliding_window, x.device, past)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, mask, windows[i] if windows else None)
        return self.norm(x)

    def windows(self) -> list[KVWindow]:
        """Empty per-layer windows for a new stream."""
        return [KVWindow(self.cfg.sliding_window - 1) for _ in self.layers]

    def _rope(self, length: int, x: torch.Tensor, offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        # Computed per call in fp32 (not a buffer) so module.to(bf16) cannot coarsen the frequencies; positions
        # start at ``offset`` (0 for a stateless chunk; a stream's frames decoded so far when it carries a cache).
        dim = int(self.cfg.head_dim)
        steps = torch.arange(0, dim, 2, dtype=torch.float32, device=x.device) / dim
        inv_freq = 1.0 / (self.cfg.rope_theta**steps)
        positions = torch.arange(offset, offset + length, device=x.device, dtype=torch.float32)
        freqs = positions[:, None] * inv_freq
        angles = torch.cat((freqs, freqs), dim=-1)
        return angles.cos().to(x.dtype), angles.sin().to(x.dtype)


def sliding_causal_mask(length: int, window: int, device: torch.device, past: int = 0) -> torch.Tensor:
    """``[T, past + T]`` bool, True where query q may see key k: q - window < k <= q. The keys are ``past``
    earlier frames then the ``T`` queried ones."""
    queries = torch.arange(past, past + length, device=device)
    offset = queries[:, None] - torch.arange(past + length, device=device)[None, :]
    return (offset >= 0) & (offset < window)


class Code2Wav(nn.Module):
    """Codes ``[B, num_quantizers, T]`` (int64) -> waveform in [-1, 1] at 24 kHz.

    All rows of a call share T: the generation runner either groups chunks of
    equal length or right-pads them and calls ``decode_rows``.
    """

    sample_rate = 24000  # fixed by training; config.json does not carry it

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
        return math.prod(self.config.upsampling_ratios) * math.prod(self.config.upsample_rates)

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
    folder: str | Path, device: torch.device | str | None = None, dtype: torch.dtype | None = None
) -> Code2Wav:
    """Builds the vocoder from a Hugging Face Qwen3-Omni folder and loads its ``code2wav.`` weights."""
    config = json.loads((Path(folder) / "config.json").read_text())["code2wav_config"]
    model = Code2Wav(Code2WavConfig.from_hf(config))
    with Checkpoint(folder) as ckpt:
        load_module(model, ckpt, "code2wav.", dtype=dtype)
    return model.to(device=device).eval()
