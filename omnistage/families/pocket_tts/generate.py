"""Pocket TTS's frame loop: the backbone steps on the previous latent, the flow head samples the next one, and
the EOS head stops the utterance as the reference does.

Stopping (transformers' ``PocketTTSEosThresholdCriteria``): from frame ``min_frames_before_eos`` on, the first
frame whose EOS logit exceeds ``eos_threshold`` starts a countdown of ``frames_after_eos`` more frames; that frame
and the tail are kept. The noise is ``sqrt(temperature)`` times a standard normal, zero when greedy.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from omnistage.families.pocket_tts.backbone import PocketTTS
from omnistage.models.sequence_cache import SequenceCache

SHORT_TEXT_MAX_WORDS = 4  # the processor's: short texts get a longer tail after end of speech
FRAMES_AFTER_EOS_SHORT, FRAMES_AFTER_EOS = 4, 2


@dataclass(frozen=True)
class FlowSampling:
    """The flow sampler's and the stopping rule's knobs (the released checkpoints' defaults)."""

    temperature: float = 0.7
    greedy: bool = False
    num_flow_steps: int = 1
    eos_threshold: float = -4.0
    min_frames_before_eos: int = 6
    frames_after_eos: int = FRAMES_AFTER_EOS
    max_frames: int = 250
    seed: int | None = None

    @property
    def noise_scale(self) -> float:
        return 0.0 if self.greedy else math.sqrt(self.temperature)


@dataclass(frozen=True)
class FlowDefaults:
    """The checkpoint's own generation knobs (its ``generation_config.json``, as transformers reads them; the
    released checkpoints' values when absent)."""

    num_flow_steps: int = 1
    eos_threshold: float = -4.0
    min_frames_before_eos: int = 6

    @classmethod
    def from_folder(cls, folder: str | Path) -> FlowDefaults:
        path = Path(folder) / "generation_config.json"
        raw = json.loads(path.read_text()) if path.is_file() else {}
        known = {k: raw[k] for k in ("num_flow_steps", "eos_threshold", "min_frames_before_eos")
                 if raw.get(k) is not None}
        defaults = cls(**known)
        if defaults.num_flow_steps < 1 or defaults.min_frames_before_eos < 0:
            raise ValueError(f"{path}: num_flow_steps >= 1 and min_frames_before_eos >= 0, got {defaults}")
        return defaults


def frames_after_eos(text: str) -> int:
    return FRAMES_AFTER_EOS_SHORT if len(text.split()) <= SHORT_TEXT_MAX_WORDS else FRAMES_AFTER_EOS


def frame_budget(num_text_tokens: int, frame_rate: float) -> int:
    """The reference's default budget: ``ceil((text tokens / 3 + 2) * frame rate)``."""
    return math.ceil((num_text_tokens / 3 + 2) * frame_rate)


class EosRule:
    """One utterance's stopping state, fed each frame's EOS logit in order."""

    def __init__(self, sampling: FlowSampling) -> None:
        self.sampling = sampling
        self.frame = 0
        self.remaining = -1  # frames left after end of speech; -1 until it is seen

    def done_after(self, eos_logit: float) -> bool:
        """Whether the frame whose logit this is ends the utterance (it is kept either way)."""
        can_end = self.frame >= self.sampling.min_frames_before_eos
        self.frame += 1
        if self.remaining < 0 and eos_logit > self.sampling.eos_threshold and can_end:
            self.remaining = self.sampling.frames_after_eos
        if self.remaining == 0:
            return True
        if self.remaining > 0:
            self.remaining -= 1
        return self.frame >= self.sampling.max_frames


@torch.inference_mode()
def generate_latents(model: PocketTTS, input_ids: torch.Tensor, sampling: FlowSampling,
                     voice: torch.Tensor | None = None, cache: SequenceCache | None = None) -> torch.Tensor:
    """A prompt's ids ``[T]`` (ending with the audio BOS) -> its latents ``[n, latent]`` in the tokenizer's space.

    ``cache``: a voice prefix already run (a built-in voice); the ids then continue it."""
    cache = SequenceCache() if cache is None else cache.copy()
    generator = torch.Generator().manual_seed(sampling.seed) if sampling.seed is not None else None
    hidden = model.model(model.prompt_embeds(input_ids, voice), cache)[:, -1]
    rule, frames = EosRule(sampling), []
    while True:
        eos = float(model.eos_head(hidden)[0, 0])
        noise = torch.randn(hidden.shape[0], model.cfg.latent_dim, generator=generator).to(hidden)
        latent = model.flow_head.sample(hidden, noise * sampling.noise_scale, sampling.num_flow_steps)
        frames.append(latent.float())
        if rule.done_after(eos):
            break
        hidden = model.model(model.latent_embeds(latent), cache)[:, -1]
    return model.denormalize(torch.cat(frames))
