"""Pocket TTS's backbone: a causal LayerNorm transformer over [voice prompt, text, audio latents].

Parameter names are transformers' ``PocketTTSForConditionalGeneration`` (``model.*``, ``eos_head``,
``latent_mean``/``latent_std``; the flow head in :mod:`.flow_head`). Each sequence keeps its keys and values
contiguous (:class:`SequenceCache`): the backbone is 6 layers over a few hundred positions, so one tensor per
layer that grows by a frame a step costs less than any block table.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.families.pocket_tts.config import PocketConfig
from omnistage.families.pocket_tts.flow_head import FlowHead
from omnistage.layers.linear import FusedRows
from omnistage.models.sequence_cache import SequenceCache


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def rotary(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """cos/sin ``[T, head_dim]`` of ``positions``, computed in fp32 (a buffer would follow the model's dtype)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim)
    angles = positions.float()[:, None] * inv_freq
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


class Attention(nn.Module):
    def __init__(self, cfg: PocketConfig) -> None:
        super().__init__()
        self.heads, self.head_dim = cfg.num_attention_heads, cfg.head_dim
        width = cfg.num_attention_heads * cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, width, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, width, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, width, bias=False)
        self.o_proj = nn.Linear(width, cfg.hidden_size, bias=False)
        self.qkv = FusedRows(self.q_proj, self.k_proj, self.v_proj)  # one matmul: a frame step is call-bound
        self.o = FusedRows(self.o_proj)

    def quantizable_linears(self) -> list[nn.Linear]:
        return [self.q_proj, self.k_proj, self.v_proj, self.o_proj]

    def _qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        batch, length, _ = x.shape
        q, k, v = (t.view(batch, length, self.heads, self.head_dim).transpose(1, 2) for t in self.qkv(x))
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin, v

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None,
                cache: SequenceCache, layer: int) -> torch.Tensor:
        batch, length, _ = x.shape
        q, k, v = self._qkv(x, cos, sin)
        k, v = cache.extend(layer, k, v)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.head_dim**-0.5)
        return self.o.joint(out.transpose(1, 2).reshape(batch, length, -1))

    def step(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, caches: list[SequenceCache],
             layer: int) -> torch.Tensor:
        """One new position for each of ``B`` sequences ``[B, 1, hidden]`` (``cos``/``sin`` ``[B, 1, 1, d]``):
        the projections batched, the attention over each sequence's own cache."""
        batch = x.shape[0]
        q, k, v = self._qkv(x, cos, sin)
        rows = []
        for i, cache in enumerate(caches):
            keys, values = cache.extend(layer, k[i:i + 1], v[i:i + 1])
            rows.append(F.scaled_dot_product_attention(q[i:i + 1], keys, values, scale=self.head_dim**-0.5))
        return self.o.joint(torch.cat(rows).transpose(1, 2).reshape(batch, 1, -1))


class Mlp(nn.Module):
    def __init__(self, cfg: PocketConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.up, self.down = FusedRows(self.fc1), FusedRows(self.fc2)  # where an int8 weight is multiplied

    def quantizable_linears(self) -> list[nn.Linear]:
        return [self.fc1, self.fc2]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down.joint(F.gelu(self.up.joint(x), approximate="tanh"))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: PocketConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = Mlp(cfg)
        self.input_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.post_attention_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None,
                cache: SequenceCache, layer: int) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, cache, layer)
        return x + self.mlp(self.post_attention_layernorm(x))

    def step(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, caches: list[SequenceCache],
             layer: int) -> torch.Tensor:
        x = x + self.self_attn.step(self.input_layernorm(x), cos, sin, caches, layer)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    """``model.*``: embeddings, the layers, the final norm and the two latent projections."""

    def __init__(self, cfg: PocketConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.audio_prompt_proj = nn.Linear(cfg.latent_dim, cfg.hidden_size, bias=False)
        self.audio_latent_proj = nn.Linear(cfg.latent_dim, cfg.hidden_size, bias=False)
        self.bos_latent = nn.Parameter(torch.zeros(cfg.latent_dim))

    def forward(self, embeds: torch.Tensor, cache: SequenceCache) -> torch.Tensor:
        """``[1, T, hidden]`` input embeddings continuing ``cache`` -> normalised hidden states."""
        past, length = cache.length, embeds.shape[1]
        positions = torch.arange(past, past + length, device=embeds.device)
        cos, sin = rotary(positions, self.cfg.head_dim, self.cfg.rope_theta, embeds.dtype)
        # Causal over the new positions; every cached one is visible (a single query needs no mask).
        mask = None if length == 1 else torch.ones(length, past + length, dtype=torch.bool,
                                                   device=embeds.device).tril(past)
        x = embeds
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, mask, cache, i)
        return self.norm(x)

    def step(self, embeds: torch.Tensor, caches: list[SequenceCache]) -> torch.Tensor:
        """One new position per sequence, ``[B, 1, hidden]``, each continuing its own cache: every weight is
        read once for the batch (the decode step is bound by reading them)."""
        positions = torch.tensor([c.length for c in caches], device=embeds.device)
        cos, sin = (t[:, None, None] for t in rotary(positions, self.cfg.head_dim, self.cfg.rope_theta,
                                                        embeds.dtype))
        x = embeds
        for i, layer in enumerate(self.layers):
            x = layer.step(x, cos, sin, caches, i)
        return self.norm(x)


class PocketTTS(nn.Module):
    """The whole generating model, named as transformers names it."""

    def __init__(self, cfg: PocketConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg)
        self.flow_head = FlowHead(cfg.flow_head)
        self.eos_head = nn.Linear(cfg.hidden_size, 1)
        self.register_buffer("latent_mean", torch.zeros(cfg.latent_dim))  # the latents' statistics, saved
        self.register_buffer("latent_std", torch.ones(cfg.latent_dim))

    def prompt_embeds(self, input_ids: torch.Tensor, voice: torch.Tensor | None) -> torch.Tensor:
        """``[T]`` prompt ids -> ``[1, T, hidden]``: the voice's latents ``[n, latent]`` on its ``n`` placeholders,
        the learnt BOS latent on the audio BOS position, token embeddings elsewhere."""
        cfg, backbone = self.cfg, self.model
        embeds = backbone.embed_tokens(input_ids)
        bos = backbone.audio_latent_proj(backbone.bos_latent.to(embeds.dtype))
        embeds = torch.where((input_ids == cfg.audio_bos_token_id)[:, None], bos, embeds)
        slots = input_ids == cfg.audio_prompt_token_id
        count = int(slots.sum())
        if count:
            if voice is None or voice.shape[0] != count:
                raise ValueError(f"the prompt has {count} voice positions, the voice "
                                 f"{0 if voice is None else voice.shape[0]} frames")
            embeds = embeds.clone()
            embeds[slots] = backbone.audio_prompt_proj(voice.to(embeds.dtype))
        return embeds[None]

    def latent_embeds(self, latents: torch.Tensor) -> torch.Tensor:
        """Normalised latents ``[B, latent]`` -> the next step's inputs ``[B, 1, hidden]``."""
        return self.model.audio_latent_proj(latents.to(self.model.audio_latent_proj.weight.dtype))[:, None]

    def denormalize(self, latents: torch.Tensor) -> torch.Tensor:
        """The flow head's normalised space -> the audio tokenizer's."""
        return latents * self.latent_std + self.latent_mean
