"""Pocket TTS's flow head: an adaLN MLP that turns Gaussian noise into the next 32-d latent.

Two kinds, as the checkpoint's ``flow_type`` says (transformers' ``PocketTTSFlowHead``/``sample_latent``):
- ``lsd`` (Lagrangian self-distillation): conditioned on a step's start and end times, sampled by Euler steps
  (one by default) from noise;
- ``drifting``: no time conditioning; one call maps the noise to the latent.
The noise is scaled by sqrt(temperature) and is zero when greedy, so greedy parity is deterministic.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.families.pocket_tts.config import FlowHeadConfig


def _layer_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    # Written out as the reference's head does (not the fused kernel): the same rounding, so greedy latents,
    # fed back every frame, stay within 1e-5 of transformers'.
    centred = x - x.mean(-1, keepdim=True)
    return centred * torch.rsqrt(x.var(-1, unbiased=False, keepdim=True) + eps)


class FlowLayerNorm(nn.LayerNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _layer_norm(x, self.eps) * self.weight + self.bias


class TimestepNorm(nn.Module):
    """x / std(x) (unbiased variance, no centring) times a learnt weight."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * (self.weight * torch.rsqrt(x.var(-1, keepdim=True) + self.eps))


class TimestepEmbedding(nn.Module):
    def __init__(self, cfg: FlowHeadConfig) -> None:
        super().__init__()
        half = cfg.frequency_embedding_size // 2
        freqs = torch.exp(-math.log(cfg.max_period) * torch.arange(half, dtype=torch.float32) / half)
        self.register_buffer("freqs", freqs)  # saved in the checkpoint, so loaded like a weight
        self.fc1 = nn.Linear(cfg.frequency_embedding_size, cfg.hidden_size)
        self.fc2 = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.norm = TimestepNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, times: torch.Tensor) -> torch.Tensor:
        angles = times * self.freqs.to(times.dtype)
        embedding = torch.cat([angles.cos(), angles.sin()], dim=-1)
        return self.norm(self.fc2(F.silu(self.fc1(embedding))))


class ResBlock(nn.Module):
    def __init__(self, cfg: FlowHeadConfig) -> None:
        super().__init__()
        self.norm = FlowLayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.fc1 = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.fc2 = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.adaln_proj = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size)

    def forward(self, x: torch.Tensor, condition: torch.Tensor) -> torch.Tensor:
        shift, scale, gate = self.adaln_proj(F.silu(condition)).chunk(3, dim=-1)
        modulated = self.norm(x) * (1 + scale) + shift
        return x + gate * self.fc2(F.silu(self.fc1(modulated)))


class FinalLayer(nn.Module):
    def __init__(self, cfg: FlowHeadConfig) -> None:
        super().__init__()
        self.eps = cfg.layer_norm_eps
        self.adaln_proj = nn.Linear(cfg.hidden_size, 2 * cfg.hidden_size)
        self.proj = nn.Linear(cfg.hidden_size, cfg.latent_dim)

    def forward(self, x: torch.Tensor, condition: torch.Tensor) -> torch.Tensor:
        shift, scale = self.adaln_proj(F.silu(condition)).chunk(2, dim=-1)
        return self.proj(_layer_norm(x, self.eps) * (1 + scale) + shift)


class FlowHead(nn.Module):
    def __init__(self, cfg: FlowHeadConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.input_proj = nn.Linear(cfg.latent_dim, cfg.hidden_size)
        self.cond_proj = nn.Linear(cfg.condition_dim, cfg.hidden_size)
        self.timestep_embeddings = nn.ModuleList(TimestepEmbedding(cfg) for _ in range(cfg.num_time_conditions))
        self.layers = nn.ModuleList(ResBlock(cfg) for _ in range(cfg.num_hidden_layers))
        self.final_layer = FinalLayer(cfg)
        self._times: dict[tuple[int, int, torch.dtype], torch.Tensor] = {}  # time_condition's, made once each

    def forward(self, latents: torch.Tensor, condition: torch.Tensor,
                times: torch.Tensor | None = None) -> torch.Tensor:
        """``times``: the step's time condition (:meth:`time_condition`), ``[1, hidden]``, added to every row."""
        x = self.input_proj(latents)
        condition = self.cond_proj(condition)
        if times is not None:
            condition = condition + times
        for layer in self.layers:
            x = layer(x, condition)
        return self.final_layer(x, condition)

    def time_condition(self, step: int, num_steps: int, dtype: torch.dtype) -> torch.Tensor:
        """The mean of the step's start- and end-time embeddings ``[1, hidden]``: the same for every frame of
        every utterance, so made once per (step, steps) and kept (they were a fifth of a served frame's time)."""
        key = (step, num_steps, dtype)
        if key not in self._times:
            device = self.input_proj.weight.device
            ends = [torch.full((1, 1), t / num_steps, device=device, dtype=dtype) for t in (step, step + 1)]
            embedded = sum(embedding(t) for embedding, t in zip(self.timestep_embeddings, ends))
            self._times[key] = embedded / len(ends)
        return self._times[key]

    def sample(self, condition: torch.Tensor, noise: torch.Tensor, num_steps: int = 1) -> torch.Tensor:
        """The next normalised latents ``[B, latent]`` from hidden states ``[B, hidden]`` and scaled noise."""
        if self.cfg.flow_type == "drifting":
            return self(noise, condition)
        if num_steps < 1:
            raise ValueError(f"the LSD sampler takes at least one Euler step, got {num_steps}")
        latents = noise
        for step in range(num_steps):
            latents = latents + self(latents, condition, self.time_condition(step, num_steps, noise.dtype)) / num_steps
        return latents
