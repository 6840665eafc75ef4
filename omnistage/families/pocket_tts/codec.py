"""Pocket TTS's audio decoder: 32-d latents at 12.5 Hz -> 24 kHz audio, streamed with its state carried.

Mirrors transformers' ``PocketTTSAudioTokenizerModel.decode`` (names from ``latent_proj`` and ``decoder.*`` in
``audio_tokenizer/model.safetensors``): a 1x1 projection, a depthwise transposed conv upsampling the frames to
the SEANet rate, a sliding-window LayerNorm transformer with layer scale, and the SEANet decoder (ELU,
transposed convs, residual blocks, a last conv). Every conv is causal and every transposed conv drops its
overhang on the right, so ``T`` frames give exactly ``frame_size * T`` samples and sample ``s`` reads frames
``<= s // frame_size``.

A stream (:class:`DecodeState`) keeps, per conv, its last inputs (what its kernel reaches back to), and per
transformer layer its last ``sliding_window - 1`` keys/values: a chunk of new frames then yields the whole
decode's next samples, whatever the chunk boundaries. A whole decode is one chunk on a fresh state.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.families.pocket_tts.backbone import rotary, rotate_half
from omnistage.families.pocket_tts.config import CodecConfig
from omnistage.models.codec_transformer import KVWindow, sliding_causal_mask


@dataclass
class DecodeState:
    """One stream's carried state: conv tails in the decoder's order, KV windows, frames decoded so far."""

    windows: list[KVWindow]
    tails: list[torch.Tensor] = field(default_factory=list)
    slot: int = 0  # the next conv's tail during a chunk
    position: int = 0

    def joined(self, x: torch.Tensor, reach: int) -> torch.Tensor:
        """``x`` ``[1, C, n]`` after this conv's kept last ``reach`` inputs (zeros before the first chunk, a whole
        decode's padding); keeps the new last ``reach``."""
        slot, self.slot = self.slot, self.slot + 1
        kept = self.tails[slot] if slot < len(self.tails) else x.new_zeros(x.shape[0], x.shape[1], reach)
        joined = torch.cat([kept, x], dim=-1)
        tail = joined[..., joined.shape[-1] - reach:]
        if slot < len(self.tails):
            self.tails[slot] = tail
        else:
            self.tails.append(tail)
        return joined


class CausalConv(nn.Module):
    """``*.conv`` of transformers' ``PocketTTSAudioTokenizerConv1d`` at stride 1, padded on the left."""

    def __init__(self, in_dim: int, out_dim: int, kernel: int, dilation: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv1d(in_dim, out_dim, kernel, dilation=dilation)
        self.reach = (kernel - 1) * dilation

    def forward(self, x: torch.Tensor, state: DecodeState) -> torch.Tensor:
        return self.conv(state.joined(x, self.reach) if self.reach else x)


class CausalConvTranspose(nn.Module):
    """Upsampling by ``stride`` with the overhang cut on the right: block ``j`` of ``stride`` samples reads input
    steps ``j - reach .. j`` (kernel ``(reach + 1) * stride``), so a stream keeps its last ``reach`` inputs."""

    def __init__(self, in_dim: int, out_dim: int, stride: int, groups: int = 1, bias: bool = True) -> None:
        super().__init__()
        self.conv = nn.ConvTranspose1d(in_dim, out_dim, 2 * stride, stride, groups=groups, bias=bias)
        self.stride, self.reach = stride, 1

    def forward(self, x: torch.Tensor, state: DecodeState) -> torch.Tensor:
        steps = x.shape[-1]
        y = self.conv(state.joined(x, self.reach))
        return y[..., self.reach * self.stride:(self.reach + steps) * self.stride]


class ResnetBlock(nn.Module):
    """SEANet's residual block: ELU, conv k, ELU, conv 1, plus the input (no conv shortcut)."""

    def __init__(self, cfg: CodecConfig, dim: int, dilation: int) -> None:
        super().__init__()
        hidden = dim // cfg.compress
        self.block = nn.ModuleList([nn.ELU(), CausalConv(dim, hidden, cfg.residual_kernel_size, dilation),
                                    nn.ELU(), CausalConv(hidden, dim, 1)])

    def forward(self, x: torch.Tensor, state: DecodeState) -> torch.Tensor:
        h = x
        for layer in self.block:
            h = layer(h, state) if isinstance(layer, CausalConv) else layer(h)
        return x + h


class Seanet(nn.Module):
    """``decoder.decoder_seanet.layers``: the layer list transformers builds, at the same indices."""

    def __init__(self, cfg: CodecConfig) -> None:
        super().__init__()
        scale = 2 ** len(cfg.upsampling_ratios)
        layers: list[nn.Module] = [CausalConv(cfg.hidden_size, scale * cfg.num_filters, cfg.kernel_size)]
        for ratio in cfg.upsampling_ratios:
            dim = scale * cfg.num_filters
            layers += [nn.ELU(), CausalConvTranspose(dim, dim // 2, ratio)]
            layers += [ResnetBlock(cfg, dim // 2, cfg.dilation_growth_rate**j) for j in range(cfg.num_residual_layers)]
            scale //= 2
        layers += [nn.ELU(), CausalConv(cfg.num_filters, 1, cfg.last_kernel_size)]
        self.layers = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor, state: DecodeState) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x) if isinstance(layer, nn.ELU) else layer(x, state)
        return x


class LayerScale(nn.Module):
    def __init__(self, cfg: CodecConfig) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((cfg.hidden_size,), cfg.layer_scale_initial_scale))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


class WindowAttention(nn.Module):
    def __init__(self, cfg: CodecConfig) -> None:
        super().__init__()
        self.heads, self.head_dim = cfg.num_attention_heads, cfg.head_dim
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (
            nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor,
                window: KVWindow) -> torch.Tensor:
        batch, length, _ = x.shape
        q, k, v = (p(x).view(batch, length, self.heads, self.head_dim).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        q, k = (t * cos + rotate_half(t) * sin for t in (q, k))
        k, v = window.extend(k, v)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.head_dim**-0.5)
        return self.o_proj(out.transpose(1, 2).reshape(batch, length, -1))


class TransformerLayer(nn.Module):
    def __init__(self, cfg: CodecConfig) -> None:
        super().__init__()
        self.self_attn = WindowAttention(cfg)
        self.mlp = nn.Module()
        self.mlp.fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.mlp.fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.input_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.post_attention_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.self_attn_layer_scale = LayerScale(cfg)
        self.mlp_layer_scale = LayerScale(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor,
                window: KVWindow) -> torch.Tensor:
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), cos, sin, mask, window))
        h = self.mlp.fc2(F.gelu(self.mlp.fc1(self.post_attention_layernorm(x)), approximate="tanh"))
        return x + self.mlp_layer_scale(h)


class DecoderTransformer(nn.Module):
    def __init__(self, cfg: CodecConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(TransformerLayer(cfg) for _ in range(cfg.num_hidden_layers))

    def forward(self, x: torch.Tensor, state: DecodeState) -> torch.Tensor:
        positions = torch.arange(state.position, state.position + x.shape[1], device=x.device)
        cos, sin = rotary(positions, self.cfg.head_dim, self.cfg.rope_theta, x.dtype)
        mask = sliding_causal_mask(x.shape[1], self.cfg.sliding_window, x.device, state.windows[0].length)
        for layer, window in zip(self.layers, state.windows):
            x = layer(x, cos, sin, mask, window)
        return x


class DecoderModel(nn.Module):
    """``decoder.*``."""

    def __init__(self, cfg: CodecConfig) -> None:
        super().__init__()
        self.upsample = CausalConvTranspose(cfg.hidden_size, cfg.hidden_size, cfg.latent_stride,
                                            groups=cfg.upsample_groups, bias=False)
        self.decoder_transformer = DecoderTransformer(cfg)
        self.decoder_seanet = Seanet(cfg)


class LatentDecoder(nn.Module):
    """The audio tokenizer's decoding half: ``latent_proj`` and ``decoder``."""

    def __init__(self, cfg: CodecConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.latent_proj = nn.Conv1d(cfg.latent_dim, cfg.hidden_size, 1, bias=False)
        self.decoder = DecoderModel(cfg)

    @property
    def samples_per_frame(self) -> int:
        return self.cfg.frame_size

    def new_state(self) -> DecodeState:
        window = self.cfg.sliding_window - 1
        return DecodeState([KVWindow(window) for _ in range(self.cfg.num_hidden_layers)])

    @torch.inference_mode()
    def decode(self, latents: torch.Tensor, state: DecodeState | None = None) -> torch.Tensor:
        """Latents ``[n, latent]`` (the tokenizer's space) continuing ``state`` (a fresh one: a whole decode) ->
        their ``frame_size * n`` samples ``[S]``."""
        state = self.new_state() if state is None else state
        state.slot = 0
        weight = self.latent_proj.weight
        x = self.latent_proj(latents.T[None].to(weight.device, weight.dtype))
        x = self.decoder.upsample(x, state)  # per-stream tails from here on, in this order
        x = self.decoder.decoder_transformer(x.transpose(1, 2), state).transpose(1, 2)
        state.position += x.shape[-1]
        return self.decoder.decoder_seanet(x, state)[0, 0]
