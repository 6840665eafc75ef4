"""Qwen2.5-Omni's DiT flow matching over several windows of codes at once (chunks of many streams in one batch).

The same ODE as :meth:`omnistage.models.qwen2_5_omni.token2wav.Token2Wav.mel` (transformers' RK4 over the
swayed time grid, classifier-free guidance), on rows of different lengths padded on the right: a padded frame is
put in a block of its own, so the DiT's block mask keeps every real frame from attending to padding (and padding
attends only to padding, never to nothing). Everything else in a DiT layer is per frame, so a row's mel is its own
window's, whatever it was batched with (up to float rounding).

What stays fixed over the ODE's evaluations is computed once per call: the codes' embeddings, the speaker's rows
(its ECAPA encoding of the reference mel, once per voice: :meth:`DiTWindows.voice`), positions and each layer's
attention mask (transformers' layer compares its block differences anew at every call, and attention converts the
result: a third of a batch's time). So a layer runs here as transformers' ``DiTDecoderLayer`` does, on its own
weights, with the mask given (:func:`_layer`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

PAD_BLOCK = 1 << 30  # the block index of padded frames: no real frame's block is within a look of it
PAD_REACH = 100  # block differences clamped to this: a layer looks at most one block ahead or back


@dataclass(frozen=True)
class DiTVoice:
    """A speaker as the DiT reads it: its conditioning vector ``[C]`` and the ECAPA encodings ``[2, E]`` of its
    reference mel and of silence (the guided and the unconditioned rows)."""

    cond: torch.Tensor
    encoded: torch.Tensor


@dataclass(frozen=True)
class OdeSettings:
    """Transformers' defaults for ``Qwen2_5OmniToken2WavModel.forward``."""

    num_steps: int = 10
    guidance_scale: float = 0.5
    sway_coefficient: float = -1.0


class DiTWindows:
    def __init__(self, dit: nn.Module, ode: OdeSettings = OdeSettings()) -> None:
        if ode.guidance_scale < 1e-5:
            raise ValueError("batched windows are decoded with guidance (transformers' default 0.5)")
        self.dit, self.ode = dit, ode
        self.device = next(dit.parameters()).device

    @torch.no_grad()
    def voice(self, cond: torch.Tensor, reference_mel: torch.Tensor) -> DiTVoice:
        ref = reference_mel.to(self.device, torch.float32).view(1, *reference_mel.shape[-2:])
        encoded = self.dit.input_embed.spk_encoder(torch.cat([ref, torch.zeros_like(ref)]))
        return DiTVoice(cond.to(self.device, torch.float32).reshape(-1), encoded)

    @torch.no_grad()
    def solve(self, codes: Sequence[torch.Tensor], noise: Sequence[torch.Tensor],
              voices: Sequence[DiTVoice]) -> list[torch.Tensor]:
        """Windows of codes ``[T_i]``, their noise ``[2 T_i, mel]`` and speakers → each window's mel
        ``[mel, 2 T_i]``."""
        from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import RungeKutta4ODESolver

        repeats = self.dit.repeats
        lengths = [c.numel() * repeats for c in codes]
        frames = max(lengths)
        code = torch.zeros(len(codes), frames // repeats, dtype=torch.long, device=self.device)
        x0 = torch.zeros(len(codes), frames, self.dit.mel_dim, device=self.device)
        for i, (c, n) in enumerate(zip(codes, noise)):
            code[i, :c.numel()] = c.to(self.device)
            x0[i, :lengths[i]] = n.to(self.device, torch.float32).view(lengths[i], -1)
        velocity = self._velocity(code, voices, lengths)
        t = torch.linspace(0, 1, self.ode.num_steps, device=self.device)
        t += self.ode.sway_coefficient * (torch.cos(torch.pi / 2 * t) - 1 + t)
        x = RungeKutta4ODESolver(function=velocity, initial_value=x0).integrate(t)[-1]
        return [x[i, :n].T for i, n in enumerate(lengths)]

    def _velocity(self, code: torch.Tensor, voices: Sequence[DiTVoice],
                  lengths: Sequence[int]) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        dit, guidance = self.dit, self.ode.guidance_scale
        rows, frames = code.shape[0], code.shape[1] * dit.repeats
        static = self._static(code, voices)
        position_ids = torch.arange(frames, device=self.device).expand(2 * rows, -1)
        positions = dit.rotary_embed(static, position_ids)
        block_diff = self._block_diff(lengths, frames).repeat(2, 1, 1, 1)  # the guided rows, then the null rows
        looks = {(b.look_backward_block, b.look_ahead_block) for b in dit.transformer_blocks}
        masks = {look: _mask(block_diff, *look) for look in looks}

        def velocity(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            time = dit.time_embed(t.repeat(2 * rows))
            hidden = dit.input_embed.proj(torch.cat((torch.cat((x, x)), static), dim=-1))
            for block in dit.transformer_blocks:
                mask = masks[(block.look_backward_block, block.look_ahead_block)]
                hidden = _layer(block, hidden, time, positions, mask)
            guided, null = torch.chunk(dit.proj_out(dit.norm_out(hidden, time)), 2, dim=0)
            return guided + (guided - null) * guidance

        return velocity

    def _static(self, code: torch.Tensor, voices: Sequence[DiTVoice]) -> torch.Tensor:
        """What the input projection reads beside the state, guided rows then unconditioned ones (as
        ``DiTInputEmbedding`` concatenates them): speaker encoding, code embedding, speaker conditioning."""
        dit = self.dit
        frames = code.shape[1] * dit.repeats
        encoded = torch.cat([torch.stack([v.encoded[0] for v in voices]), torch.stack([v.encoded[1] for v in voices])])
        cond = torch.stack([v.cond for v in voices])
        codes = torch.cat([dit.text_embed(code), dit.text_embed(code, drop_code=True)])
        speaker = torch.cat([cond, torch.zeros_like(cond)])
        return torch.cat((encoded.unsqueeze(1).expand(-1, frames, -1), codes,
                          speaker.unsqueeze(1).expand(-1, frames, -1)), dim=-1)

    def _block_diff(self, lengths: Sequence[int], frames: int) -> torch.Tensor:
        """``[rows, 1, F, F]``: key block minus query block, each row's padding in a block of its own (so far from
        every real block that a look of one block never reaches it). One head's: every layer compares it anew at
        each evaluation, and attention broadcasts the mask over the heads. int8 (clamped): a fraction of int64's
        bytes to compare."""
        block = torch.arange(frames, device=self.device) // self.dit.block_size
        blocks = block.repeat(len(lengths), 1)
        for i, n in enumerate(lengths):
            blocks[i, n:] = PAD_BLOCK
        diff = (blocks.unsqueeze(1) - blocks.unsqueeze(2)).clamp(-PAD_REACH, PAD_REACH)
        return diff.to(torch.int8).unsqueeze(1)


def _mask(block_diff: torch.Tensor, back: int, ahead: int) -> torch.Tensor:
    """A layer's additive attention mask: keys from ``back`` blocks before a query's to ``ahead`` after it."""
    allowed = (block_diff >= -back) & (block_diff <= ahead)
    return torch.zeros(allowed.shape, device=allowed.device).masked_fill_(~allowed, float("-inf"))


def _layer(block: nn.Module, hidden: torch.Tensor, time: torch.Tensor,
           positions: tuple[torch.Tensor, torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
    """transformers' ``DiTDecoderLayer.forward`` with its attention mask given."""
    norm, gate_msa, shift_mlp, scale_mlp, gate_mlp = block.attn_norm(hidden, emb=time)
    hidden = hidden + gate_msa.unsqueeze(1) * _attention(block.attn, norm, positions, mask)
    norm = block.ff_norm(hidden) * (1 + scale_mlp[:, None]) + shift_mlp[:, None]
    return hidden + gate_mlp.unsqueeze(1) * block.ff(norm)


def _attention(attn: nn.Module, hidden: torch.Tensor, positions: tuple[torch.Tensor, torch.Tensor],
               mask: torch.Tensor) -> torch.Tensor:
    """transformers' ``DiTAttention.forward`` (rotary on the first head only, as the checkpoint was trained)."""
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import apply_rotary_pos_emb, deinterleave_head_dim

    rows = hidden.shape[0]
    query, key, value = (proj(hidden).view(rows, -1, attn.heads, attn.inner_dim // attn.heads).transpose(1, 2)
                         for proj in (attn.to_q, attn.to_k, attn.to_v))
    cos, sin = positions
    query[:, :1], key[:, :1] = apply_rotary_pos_emb(deinterleave_head_dim(query[:, :1]),
                                                    deinterleave_head_dim(key[:, :1]), cos, sin)
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask)
    return attn.to_out[0](out.transpose(1, 2).reshape(rows, -1, attn.inner_dim))
