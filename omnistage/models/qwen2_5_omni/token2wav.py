"""Qwen2.5-Omni's token2wav: a DiT flow-matching model (codes → mel) and BigVGAN (mel → 24 kHz waveform).

transformers' own ``Qwen2_5OmniToken2WavModel`` serves as the sub-module (filled by our checkpoint reader under
``token2wav.``); what differs from its ``forward`` is where the noise comes from: transformers draws the ODE's
initial state from the global RNG, here it is drawn from a generator seeded per utterance, so a decode is
reproducible whatever else runs in the process. With the same seed (``torch.manual_seed(seed)`` before
transformers' call) the noise is the same tensor, and the decode is transformers' RK4 integration of
``(1 + g)·v(x, codes) − g·v(x, ∅)`` (``g`` = guidance scale) over its swayed time grid, then BigVGAN.

``forward`` decodes a whole utterance; :mod:`omnistage.models.qwen2_5_omni.token2wav_stream` decodes it in
chunks from ``mel`` and ``vocode``. Every DiT layer attends within blocks of ``block_size`` mel frames plus
look-back or look-ahead blocks, so each function evaluation widens the receptive field, over 4 evaluations per
RK4 step and 10 steps: a chunk decoded with bounded context differs from the whole decode (within a tolerance).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from omnistage.models.build import build_on
from omnistage.models.decoder_checkpoint import load_checkpoint
from omnistage.models.qwen2_5_omni.config import Qwen25OmniConfig

CHECKPOINT_PREFIX = "token2wav."
SAMPLES_PER_CODE = 480  # 2 mel frames per code (DiT ``repeats``) x 240 samples per mel frame (BigVGAN)


class Token2Wav(nn.Module):
    def __init__(self, config: object) -> None:
        """config: transformers' ``Qwen2_5OmniToken2WavConfig``."""
        super().__init__()
        from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniToken2WavModel

        self.model = Qwen2_5OmniToken2WavModel._from_config(config, dtype=torch.get_default_dtype())

    @classmethod
    def from_checkpoint(cls, folder: str | Path, device: torch.device | str = "cpu",
                        dtype: torch.dtype = torch.float32, *, config: Qwen25OmniConfig | None = None) -> Token2Wav:
        hf = (config or Qwen25OmniConfig.from_folder(folder)).hf
        with build_on(device, dtype):
            model = cls(hf.token2wav_config)
        load_checkpoint(model.model, folder, CHECKPOINT_PREFIX, dtype, {})
        return model.eval().requires_grad_(False)

    @property
    def dit(self) -> nn.Module:
        return self.model.code2wav_dit_model

    def noise(self, num_codes: int, seed: int) -> torch.Tensor:
        """The ODE's initial state ``[1, mel frames, mel_dim]`` for an utterance of ``num_codes`` codes."""
        g = torch.Generator().manual_seed(seed)
        return torch.randn(1, num_codes * self.dit.repeats, self.dit.mel_dim, generator=g)

    @torch.no_grad()
    def forward(self, codes: torch.Tensor, conditioning: torch.Tensor, reference_mel: torch.Tensor, seed: int,
                num_steps: int = 10, guidance_scale: float = 0.5, sway_coefficient: float = -1.0) -> torch.Tensor:
        """codes ``[T]``, conditioning ``[C]``, reference_mel ``[F, mel]`` → waveform ``[T * 480]``."""
        noise = self.noise(codes.numel(), seed)
        mel = self.mel(codes, conditioning, reference_mel, noise, num_steps, guidance_scale, sway_coefficient)
        return self.vocode(mel)

    @torch.no_grad()
    def mel(self, codes: torch.Tensor, conditioning: torch.Tensor, reference_mel: torch.Tensor, noise: torch.Tensor,
            num_steps: int = 10, guidance_scale: float = 0.5, sway_coefficient: float = -1.0) -> torch.Tensor:
        """The DiT's ODE from ``noise`` ``[1, 2T, mel]`` over codes ``[T]`` → mel ``[1, mel, 2T]``."""
        from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import RungeKutta4ODESolver

        dit, device = self.dit, self.model.code2wav_bigvgan_model.conv_pre.weight.device
        dtype = torch.float32
        code = codes.view(1, -1).to(device)
        ref = reference_mel.to(device, dtype).view(1, *reference_mel.shape[-2:])
        frames = code.shape[1] * dit.repeats
        cond = conditioning.to(device, dtype).view(1, 1, -1).expand(1, frames, -1)

        def velocity(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            if guidance_scale < 1e-5:
                return dit(hidden_states=x, speaker_embedding=cond, condition_vector=ref, quantized_code=code,
                           time_step=t, drop_audio_conditioning=False, drop_code=False, apply_cfg=False)
            out = dit(hidden_states=x, quantized_code=code, speaker_embedding=cond, condition_vector=ref,
                      time_step=t, apply_cfg=True)
            guided, null = torch.chunk(out, 2, dim=0)
            return guided + (guided - null) * guidance_scale

        t = torch.linspace(0, 1, num_steps, device=device, dtype=dtype)
        if sway_coefficient is not None:
            t += sway_coefficient * (torch.cos(torch.pi / 2 * t) - 1 + t)
        x0 = noise.to(device, dtype)
        return RungeKutta4ODESolver(function=velocity, initial_value=x0).integrate(t)[-1].permute(0, 2, 1)

    @torch.no_grad()
    def vocode(self, mel: torch.Tensor) -> torch.Tensor:
        """BigVGAN: mel ``[1, mel, F]`` → waveform ``[F * 240]`` (on the CPU, as transformers returns it)."""
        return self.model.code2wav_bigvgan_model(mel).reshape(-1)
