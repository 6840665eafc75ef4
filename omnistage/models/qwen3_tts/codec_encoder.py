"""The 12 Hz codec's encoder: 24 kHz reference audio -> codes ``[T, 16]`` (voice cloning's reference codes).

Mirrors the encoding half of transformers 4.57's ``MimiModel`` as ``Qwen3TTSTokenizerV2Encoder`` keeps it (names
relative to ``encoder.`` in ``speech_tokenizer/model.safetensors``): a SEANet conv encoder (``encoder.layers``),
a causal transformer with LayerNorm and layer scale (``encoder_transformer``), a stride-2 ``downsample`` conv
(replicate padding) to 12.5 Hz, then a split residual VQ (one semantic codebook, the acoustic rest, both reading
the same latents) whose first ``encoder_valid_num_quantizers`` codes are kept. Every conv is causal: left
padding, plus on the right whatever makes the last stride window whole.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.layers.linear import activation
from omnistage.layers.rotary import apply_rotary, rope_inv_freq
from omnistage.models.codec_transformer import LayerScale
from omnistage.models.qwen3_tts.codec_config import CodecEncoderConfig


class MimiConv1d(nn.Module):
    def __init__(self, in_dim: int, out_dim: int, kernel: int, stride: int = 1, dilation: int = 1,
                 pad_mode: str = "constant", bias: bool = True) -> None:
        super().__init__()
        self.conv = nn.Conv1d(in_dim, out_dim, kernel, stride, dilation=dilation, bias=bias)
        self.stride = stride
        self.kernel = (kernel - 1) * dilation + 1
        self.padding = self.kernel - stride
        self.pad_mode = pad_mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[-1]
        frames = math.ceil((length - self.kernel + self.padding) / self.stride + 1) - 1
        extra = frames * self.stride + self.kernel - self.padding - length
        return self.conv(F.pad(x, (self.padding, extra), mode=self.pad_mode))


class ResnetBlock(nn.Module):
    """``block``: ELU, conv (residual kernel, dilated), ELU, conv 1x1; identity shortcut."""

    def __init__(self, cfg: CodecEncoderConfig, dim: int, dilation: int) -> None:
        super().__init__()
        hidden = dim // cfg.compress
        self.block = nn.ModuleList([nn.ELU(), MimiConv1d(dim, hidden, cfg.residual_kernel_size, dilation=dilation),
                                    nn.ELU(), MimiConv1d(hidden, dim, 1)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        residual = x
        for layer in self.block:
            x = layer(x)
        return residual + x


class SEANetEncoder(nn.Module):
    def __init__(self, cfg: CodecEncoderConfig) -> None:
        super().__init__()
        layers: list[nn.Module] = [MimiConv1d(cfg.audio_channels, cfg.num_filters, cfg.kernel_size)]
        scale = 1
        for ratio in reversed(cfg.upsampling_ratios):
            dim = scale * cfg.num_filters
            layers += [ResnetBlock(cfg, dim, cfg.dilation_growth_rate**j) for j in range(cfg.num_residual_layers)]
            layers += [nn.ELU(), MimiConv1d(dim, dim * 2, kernel=ratio * 2, stride=ratio)]
            scale *= 2
        layers += [nn.ELU(), MimiConv1d(scale * cfg.num_filters, cfg.hidden_size, cfg.last_kernel_size)]
        self.layers = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class Attention(nn.Module):
    def __init__(self, cfg: CodecEncoderConfig) -> None:
        super().__init__()
        self.head_dim, self.kv_groups = cfg.head_dim, cfg.num_attention_heads // cfg.num_key_value_heads
        q_dim, kv_dim = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, q_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, kv_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, kv_dim, bias=bias)
        self.o_proj = nn.Linear(q_dim, cfg.hidden_size, bias=bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """``[T, H]`` one sequence, full causal attention."""
        length = x.shape[0]
        q, k, v = (p(x).view(length, -1, self.head_dim) for p in (self.q_proj, self.k_proj, self.v_proj))
        q, k = apply_rotary(q, k, cos, sin)
        q, k, v = (t.transpose(0, 1) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.head_dim**-0.5,
                                             enable_gqa=self.kv_groups > 1)
        return self.o_proj(out.transpose(0, 1).reshape(length, -1))


class Mlp(nn.Module):
    def __init__(self, cfg: CodecEncoderConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.act = activation(cfg.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class TransformerLayer(nn.Module):
    def __init__(self, cfg: CodecEncoderConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = Mlp(cfg)
        self.input_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.post_attention_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.self_attn_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)
        self.mlp_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), cos, sin))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class EncoderTransformer(nn.Module):
    """Causal over the SEANet's frames; no final norm (Mimi's)."""

    def __init__(self, cfg: CodecEncoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(TransformerLayer(cfg) for _ in range(cfg.num_hidden_layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[T, H]`` -> ``[T, H]``."""
        positions = torch.arange(x.shape[0], device=x.device, dtype=torch.float32)
        freqs = positions[:, None] * rope_inv_freq(self.cfg.head_dim, self.cfg.rope_theta).to(x.device)
        angles = torch.cat((freqs, freqs), dim=-1)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return x


class Codebook(nn.Module):
    """Buffers as Mimi stores them; entry ``i`` is ``embed_sum[i] / max(cluster_usage[i], eps)``."""

    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self.register_buffer("initialized", torch.ones(1))
        self.register_buffer("cluster_usage", torch.ones(size))
        self.register_buffer("embed_sum", torch.zeros(size, dim))

    def table(self) -> torch.Tensor:
        return self.embed_sum / self.cluster_usage.clamp(min=1e-5)[:, None]


class VectorQuantizer(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self.codebook = Codebook(size, dim)


class ResidualQuantizer(nn.Module):
    def __init__(self, cfg: CodecEncoderConfig, count: int) -> None:
        super().__init__()
        dim = cfg.vector_quantization_hidden_dimension
        self.layers = nn.ModuleList(VectorQuantizer(cfg.codebook_size, cfg.codebook_dim) for _ in range(count))
        self.input_proj = nn.Conv1d(cfg.hidden_size, dim, 1, bias=False) if dim != cfg.hidden_size else None
        self.output_proj = nn.Conv1d(dim, cfg.hidden_size, 1, bias=False) if dim != cfg.hidden_size else None

    def encode(self, latents: torch.Tensor, count: int) -> torch.Tensor:
        """latents ``[1, H, T]`` -> codes ``[count, T]``: nearest entry per layer, each of the residual left."""
        residual = (self.input_proj(latents) if self.input_proj is not None else latents)[0].T  # [T, D]
        codes = []
        for layer in self.layers[:count]:
            table = layer.codebook.table()
            index = torch.cdist(residual[None].float(), table[None].float(), p=2)[0].argmin(dim=-1)
            residual = residual - F.embedding(index, table)
            codes.append(index)
        return torch.stack(codes)


class SplitQuantizer(nn.Module):
    def __init__(self, cfg: CodecEncoderConfig) -> None:
        super().__init__()
        semantic = cfg.num_semantic_quantizers
        self.semantic_residual_vector_quantizer = ResidualQuantizer(cfg, semantic)
        self.acoustic_residual_vector_quantizer = ResidualQuantizer(cfg, cfg.num_quantizers - semantic)

    def encode(self, latents: torch.Tensor, count: int) -> torch.Tensor:
        semantic = self.semantic_residual_vector_quantizer
        codes = semantic.encode(latents, len(semantic.layers))
        if count > len(semantic.layers):
            rest = self.acoustic_residual_vector_quantizer.encode(latents, count - len(semantic.layers))
            codes = torch.cat([codes, rest])
        return codes


class CodecEncoder(nn.Module):
    def __init__(self, cfg: CodecEncoderConfig, valid_quantizers: int, samples_per_frame: int) -> None:
        super().__init__()
        if not cfg.num_semantic_quantizers < valid_quantizers <= cfg.num_quantizers:
            raise ValueError(f"codec encoder: {valid_quantizers} valid quantizers of {cfg.num_quantizers}")
        self.config, self.valid_quantizers, self.samples_per_frame = cfg, valid_quantizers, samples_per_frame
        self.encoder = SEANetEncoder(cfg)
        self.encoder_transformer = EncoderTransformer(cfg)
        self.downsample = MimiConv1d(cfg.hidden_size, cfg.hidden_size, cfg.downsample_kernel, stride=2,
                                     pad_mode="replicate", bias=False)
        self.quantizer = SplitQuantizer(cfg)

    @torch.inference_mode()
    def encode(self, audio: torch.Tensor) -> torch.Tensor:
        """Mono 24 kHz audio ``[L]`` (float, any length >= 1) -> codes ``[ceil(L / 1920), valid_quantizers]``."""
        if audio.dim() != 1 or audio.numel() == 0 or not audio.is_floating_point():
            raise ValueError(f"audio must be a non-empty float [samples] tensor, got {audio.dtype} {tuple(audio.shape)}")
        weight = self.downsample.conv.weight
        hidden = self.encoder(audio.to(weight.device, weight.dtype)[None, None])  # [1, H, L / 960]
        hidden = self.encoder_transformer(hidden[0].T).T[None]
        codes = self.quantizer.encode(self.downsample(hidden), self.valid_quantizers)  # [Q, T]
        return codes[:, : -(-audio.numel() // self.samples_per_frame)].T
