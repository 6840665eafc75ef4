"""Higgs Audio v2's generator: a Llama decoder whose layers route audio positions to their own norms and MLP.

Parameter names are transformers' ``HiggsAudioV2ForConditionalGeneration`` (``model.*``, ``audio_lm_head``). Each
layer holds the text path (``input_layernorm``, ``post_attention_layernorm``, ``mlp``) and the audio path
(``audio_input_layernorm``, ``audio_post_attention_layernorm``, ``audio_mlp``); attention is shared. A prompt's
audio positions (a cloned voice's codes, under ``<|AUDIO_OUT|>`` and the delay token) take the audio path, the
rest the text path; every generated position is audio. A prompt is prefilled in its own contiguous cache
(:class:`SequenceCache`); a decode step runs every running sequence as a row of one :class:`SlotStep`: projections,
MLPs and attention each one batched call (at tiny widths the step is its number of calls). For the same reason the
step's submodules are called through ``.forward``: ``nn.Module.__call__`` costs ~2.4 us a call in hook bookkeeping,
~10% of a tiny batch-8 step, and nothing here registers hooks. Once loaded, every matmul runs as a
:class:`StackedLinear` (q/k/v and gate/up stacked): the checkpoint's linears stay, as views of its rows, so ``int8``
(quantized as loaded, :mod:`omnistage.layers.quant`) stacks the 1-byte weights with their scales.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.families.higgs_audio_v2.config import HiggsConfig, Llama3Rope
from omnistage.layers.linear import FusedRows, StackedLinear
from omnistage.layers.norm import RMSNorm
from omnistage.layers.packed_linear import PackedLinear
from omnistage.layers.rotary import rope_inv_freq
from omnistage.models.sequence_cache import SequenceCache
from omnistage.models.slot_cache import SlotStep

Caches = list[SequenceCache] | SlotStep  # a prompt's own cache, or every running row's one step
Route = torch.Tensor | bool  # which positions take the audio path: a mask, or True / False for all / none of them


def llama3_inv_freq(head_dim: int, rope: Llama3Rope) -> torch.Tensor:
    """Llama 3's scaled frequencies, as transformers' ``_compute_llama3_parameters`` makes them (float32)."""
    inv_freq = rope_inv_freq(head_dim, rope.theta)
    if not rope.scaled:
        return inv_freq
    low_wavelen = rope.original_max_position_embeddings / rope.low_freq_factor
    high_wavelen = rope.original_max_position_embeddings / rope.high_freq_factor
    wavelen = 2 * torch.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (rope.original_max_position_embeddings / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


class Attention(nn.Module):
    def __init__(self, cfg: HiggsConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, cfg.hidden_size, bias=bias)
        self.qkv_rows, self.o_rows = FusedRows(self.q_proj, self.k_proj, self.v_proj), FusedRows(self.o_proj)
        self.qkv: StackedLinear | None = None  # the stacks, held once loaded (fuse_): no staleness check a call
        self.o: StackedLinear | None = None

    def fuse_(self) -> None:
        """After loading: the three projections as one matmul (at tiny widths a step is its number of calls)."""
        self.qkv, self.o = self.qkv_rows.stacked(), self.o_rows.stacked()

    def quantizable_linears(self) -> list[nn.Linear]:
        return [self.q_proj, self.k_proj, self.v_proj, self.o_proj]

    def _qkv(self, x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        batch, length, _ = x.shape
        stacked = (self.qkv if self.qkv is not None else self.qkv_rows.stacked())(x)
        heads = stacked.view(batch, length, self.heads + 2 * self.kv_heads, self.head_dim).transpose(1, 2)
        rotated = self.heads + self.kv_heads  # q and k turn together: rotate_half(x) * sin, as a roll
        qk = heads[:, :rotated]
        qk = qk * cos + qk.roll(self.head_dim // 2, dims=-1) * signed_sin
        return qk[:, :self.heads], qk[:, self.heads:], heads[:, rotated:]

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, caches: Caches,
                layer: int) -> torch.Tensor:
        """``[B, T, hidden]``: ``B`` sequences each continuing its own cache (``T`` > 1 only for one sequence), or
        every row of a :class:`SlotStep` by one position; ``sin`` sign-folded (:meth:`Backbone.rotary`)."""
        batch, length, _ = x.shape
        q, k, v = self._qkv(x, cos, sin)
        if isinstance(caches, SlotStep):
            out = caches.attend(layer, q, k, v, self.head_dim**-0.5)
            return self._o(out.transpose(1, 2).reshape(batch, length, -1))
        rows = []
        for i, cache in enumerate(caches):
            keys, values = cache.extend(layer, k[i:i + 1], v[i:i + 1])
            past = keys.shape[2] - length
            mask = None if length == 1 else torch.ones(length, past + length, dtype=torch.bool,
                                                       device=x.device).tril(past)
            rows.append(F.scaled_dot_product_attention(q[i:i + 1], keys, values, attn_mask=mask,
                                                       scale=self.head_dim**-0.5, enable_gqa=True))
        return self._o(torch.cat(rows).transpose(1, 2).reshape(batch, length, -1))

    def _o(self, x: torch.Tensor) -> torch.Tensor:
        return (self.o if self.o is not None else self.o_rows.stacked())(x)


class Mlp(nn.Module):
    def __init__(self, cfg: HiggsConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)
        self.gate_up_rows, self.down_rows = FusedRows(self.gate_proj, self.up_proj), FusedRows(self.down_proj)
        self.gate_up: StackedLinear | None = None  # held once loaded (fuse_)
        self.down: StackedLinear | None = None

    def fuse_(self) -> None:
        self.gate_up, self.down = self.gate_up_rows.stacked(), self.down_rows.stacked()

    def quantizable_linears(self) -> list[nn.Linear]:
        return [self.gate_proj, self.up_proj, self.down_proj]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up is None or self.down is None:
            gate, up = self.gate_up_rows.joint(x).chunk(2, dim=-1)
            return self.down_rows.joint(F.silu(gate) * up)
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate).mul_(up))


def _routed(x: torch.Tensor, audio: Route, text_fn: nn.Module, audio_fn: nn.Module) -> torch.Tensor:
    """``audio_fn`` on the audio rows, ``text_fn`` on the rest. A prompt without a voice is all text: routed as a
    mask, each call would run the audio path on no rows (~15 calls a layer, a quarter of a tiny prefill)."""
    if audio is True or audio is False:
        return (audio_fn if audio else text_fn).forward(x)
    out = torch.empty_like(x)
    out[audio] = audio_fn(x[audio])
    out[~audio] = text_fn(x[~audio])
    return out


class DecoderLayer(nn.Module):
    def __init__(self, cfg: HiggsConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp, self.audio_mlp = Mlp(cfg), Mlp(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.audio_input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.audio_post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, audio: Route, cos: torch.Tensor, sin: torch.Tensor,
                caches: Caches, layer: int) -> torch.Tensor:
        normed = _routed(x, audio, self.input_layernorm, self.audio_input_layernorm)
        # Both residual sums land in tensors this layer made (the projection's output, then that sum), never in
        # the caller's x: no allocation each (a + b == b + a exactly).
        x = self.self_attn.forward(normed, cos, sin, caches, layer).add_(x)
        post = _routed(x, audio, self.post_attention_layernorm, self.audio_post_attention_layernorm)
        return x.add_(_routed(post, audio, self.mlp, self.audio_mlp))


class AudioEmbeddings(nn.Module):
    """``embed_audio_tokens``: one table for every codebook, a frame's embedding the sum of its codes'."""

    def __init__(self, cfg: HiggsConfig) -> None:
        super().__init__()
        self.embed_audio_tokens = nn.Embedding(cfg.num_codebooks * cfg.codebook_size, cfg.hidden_size)
        self.register_buffer("offsets", torch.arange(cfg.num_codebooks) * cfg.codebook_size, persistent=False)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """Frames ``[..., num_codebooks]`` -> ``[..., hidden]``."""
        return self.embed_audio_tokens(codes + self.offsets).sum(dim=-2)


class Backbone(nn.Module):
    """``model.*``: text and audio embeddings, the layers, the final norm."""

    def __init__(self, cfg: HiggsConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.embed_audio_tokens = AudioEmbeddings(cfg)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.register_buffer("inv_freq", llama3_inv_freq(cfg.head_dim, cfg.rope), persistent=False)
        self._table: tuple[torch.Tensor, torch.Tensor] | None = None  # cos, signed sin by position (rotary)

    def rotary(self, positions: torch.Tensor, top: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sign-folded sin ``[B, 1, T, head_dim]`` of positions ``[B, T]`` (all below ``top``), computed in
        fp32 once per position (:meth:`_angles`) and looked up: a decode step's rotary is two lookups, not ten ops."""
        if self._table is None or self._table[0].shape[0] < top:
            self._table = self._angles(max(top, 2 * (0 if self._table is None else self._table[0].shape[0]), 256))
        cos, signed_sin = self._table
        return cos[positions][:, None].to(dtype), signed_sin[positions][:, None].to(dtype)

    def _angles(self, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin ``[count, head_dim]`` of positions ``0..count-1``, the sin sign-folded:
        ``rotate_half(x) * sin == x.roll(D / 2) * signed_sin`` exactly (a sign moves from one factor to the other).
        Elementwise, so each position's values are those of computing it alone."""
        angles = torch.arange(count, device=self.inv_freq.device).float()[:, None] * self.inv_freq.float()
        angles = torch.cat((angles, angles), dim=-1)
        sin, half = angles.sin(), angles.shape[-1] // 2
        return angles.cos(), torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)

    def forward(self, embeds: torch.Tensor, audio: Route, caches: Caches) -> torch.Tensor:
        """``[B, T, hidden]`` continuing ``caches`` (one per row) -> normalised hidden states. ``audio`` ``[B, T]``
        marks the audio positions (True: all are, False: none)."""
        length = embeds.shape[1]
        if isinstance(caches, SlotStep):
            positions, top = caches.positions[:, None], max(caches.lengths) + 1
        else:
            starts = torch.tensor([c.length for c in caches], device=embeds.device)
            positions = starts[:, None] + torch.arange(length, device=embeds.device)
            top = max(c.length for c in caches) + length
        cos, sin = self.rotary(positions, top, embeds.dtype)
        x = embeds
        for i, layer in enumerate(self.layers):
            x = layer.forward(x, audio, cos, sin, caches, i)
        if isinstance(caches, SlotStep):
            caches.done()
        return self.norm(x)


class HiggsAudioV2(nn.Module):
    """The whole generator, named as transformers names it (no text head: it is training-only)."""

    def __init__(self, cfg: HiggsConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg)
        self.audio_lm_head = nn.Linear(cfg.hidden_size, cfg.num_codebooks * cfg.codebook_size, bias=False)
        self.head: PackedLinear | None = None  # the audio head for oneDNN, once loaded (fuse_)

    def fuse_(self) -> None:
        """Once loaded (and quantized, if so): every layer's matmuls, q/k/v and gate/up of both MLPs stacked; the
        linears become views of the stacks' rows, so the weights are held once. The audio head (8 codebooks wide:
        a third of a tiny step) is packed for oneDNN, a copy beside the checkpoint's weight."""
        for layer in self.model.layers:
            layer.self_attn.fuse_()
            layer.mlp.fuse_()
            layer.audio_mlp.fuse_()
        self.head = PackedLinear(self.audio_lm_head.weight)

    def prompt_embeds(self, input_ids: torch.Tensor, audio_codes: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        """Prompt ids ``[T]`` and its audio frames ``[n, G]`` (delayed, markers included) -> ``[1, T, hidden]`` and
        the audio mask ``[1, T]``: the ``n`` audio and delay-token positions take the frames' embeddings."""
        cfg = self.cfg
        audio = (input_ids == cfg.audio_token_id) | (input_ids == cfg.audio_delay_token_id)
        embeds = self.model.embed_tokens(input_ids)
        count = int(audio.sum())
        if count:
            if audio_codes is None or audio_codes.shape[0] != count:
                raise ValueError(f"the prompt has {count} audio positions, its audio "
                                 f"{0 if audio_codes is None else audio_codes.shape[0]} frames")
            embeds = embeds.clone()
            embeds[audio] = self.model.embed_audio_tokens(audio_codes.to(embeds.device)).to(embeds.dtype)
        return embeds[None], audio[None]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Last hidden states ``[B, hidden]`` -> ``[B, G, codebook_size]`` (float32)."""
        scores = self.head(hidden) if self.head is not None else self.audio_lm_head.forward(hidden)
        return scores.float().view(hidden.shape[0], self.cfg.num_codebooks, -1)

    def prefill(self, input_ids: torch.Tensor, audio_codes: torch.Tensor | None, cache: SequenceCache) -> torch.Tensor:
        embeds, audio = self.prompt_embeds(input_ids, audio_codes)
        route: Route = True if bool(audio.all()) else audio if bool(audio.any()) else False
        return self.logits(self.model(embeds, route, [cache])[:, -1])

    def step(self, frames: torch.Tensor, caches: Caches) -> torch.Tensor:
        """Each sequence's last frame ``[B, G]`` -> the next frames' logits ``[B, G, codebook_size]``."""
        embeds = self.model.embed_audio_tokens(frames.to(self.audio_lm_head.weight.device))[:, None]
        return self.logits(self.model(embeds.to(self.audio_lm_head.weight.dtype), True, caches)[:, -1])
