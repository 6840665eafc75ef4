"""The backbone stage's step loop: every running utterance advances one latent frame per step.

Each utterance keeps its own contiguous KV cache (:class:`SequenceCache`): one batched backbone step runs every
utterance on its last latent (each weight read once per step, not once per utterance), then the flow head samples
every next latent in one batched call. Greedy requests
(temperature 0) get zero noise; a seeded request draws its noise from its own generator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from omnistage.families.pocket_tts.backbone import PocketTTS
from omnistage.families.pocket_tts.generate import EosRule, FlowDefaults, FlowSampling
from omnistage.families.pocket_tts.prompt import PocketPrompt
from omnistage.models.sequence_cache import SequenceCache
from omnistage.sampling_params import SamplingParams


@dataclass
class Utterance:
    request_id: str
    input_ids: torch.Tensor
    voice: torch.Tensor | None
    rule: EosRule
    noise_scale: float
    generator: torch.Generator | None
    cache: SequenceCache = field(default_factory=SequenceCache)
    hidden: torch.Tensor | None = None  # [1, hidden] the next frame's condition


@dataclass(frozen=True)
class Frame:
    request_id: str
    latent: torch.Tensor  # [latent] in the decoder's space
    finished: bool
    by_length: bool = False  # finished at the frame budget, not by the EOS head

    @property
    def frames(self) -> torch.Tensor:
        return self.latent[None].cpu()


class BackboneRunner:
    def __init__(self, model: PocketTTS, defaults: FlowDefaults = FlowDefaults()) -> None:
        self.model, self.defaults = model, defaults
        self.running: dict[str, Utterance] = {}

    def add(self, request_id: str, prompt: PocketPrompt, sampling: SamplingParams) -> None:
        cfg = self.model.cfg
        budget = prompt.max_frames(cfg)
        max_frames = max(1, min(budget, sampling.max_tokens or budget))
        d = self.defaults
        flow = FlowSampling(temperature=sampling.temperature, greedy=sampling.temperature <= 0,
                            num_flow_steps=d.num_flow_steps, eos_threshold=d.eos_threshold,
                            min_frames_before_eos=d.min_frames_before_eos, frames_after_eos=prompt.frames_after_eos,
                            max_frames=max_frames)
        generator = torch.Generator().manual_seed(sampling.seed) if sampling.seed is not None else None
        self.running[request_id] = Utterance(request_id, prompt.input_ids(cfg), prompt.voice, EosRule(flow),
                                             math.sqrt(max(sampling.temperature, 0.0)), generator)

    def abort(self, request_id: str) -> None:
        self.running.pop(request_id, None)

    @torch.inference_mode()
    def step(self) -> list[Frame]:
        """One frame for every running utterance (a new one is prefilled first)."""
        if not self.running:
            return []
        utterances = list(self.running.values())
        for u in utterances:
            if u.hidden is None:
                u.hidden = self.model.model(self.model.prompt_embeds(u.input_ids, u.voice), u.cache)[:, -1]
        condition = torch.cat([u.hidden for u in utterances])
        eos = self.model.eos_head(condition)[:, 0].tolist()
        noise = torch.stack([self._noise(u) for u in utterances]).to(condition)
        latents = self.model.flow_head.sample(condition, noise, self.defaults.num_flow_steps)
        frames, going = [], []
        for u, latent, logit in zip(utterances, latents, eos):
            done = u.rule.done_after(logit)
            by_length = done and u.rule.remaining < 0
            frames.append(Frame(u.request_id, self.model.denormalize(latent.float()), done, by_length))
            if done:
                del self.running[u.request_id]
            else:
                going.append((u, latent))
        if going:  # the next frames' conditions, every going utterance in one batched step
            embeds = self.model.latent_embeds(torch.stack([latent for _, latent in going]))
            hidden = self.model.model.step(embeds, [u.cache for u, _ in going])[:, -1]
            for (u, _), row in zip(going, hidden):
                u.hidden = row[None]
        return frames

    def _noise(self, u: Utterance) -> torch.Tensor:
        if u.noise_scale == 0.0:
            return torch.zeros(self.model.cfg.latent_dim)
        return torch.randn(self.model.cfg.latent_dim, generator=u.generator) * u.noise_scale
