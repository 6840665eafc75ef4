"""The backbone stage's step loop: every running utterance makes one frame per step.

A new utterance's prompt is prefilled alone (its own contiguous KV cache); then every utterance with a frame
behind it takes one batched backbone step on that frame, codebook 0 is picked for all at once, and the depth
decoder fills codebooks 1..31 of every frame in lockstep. An all-EOS frame ends an utterance (it is not audio);
so does its frame budget.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from omnistage.families.csm.model import CsmModel
from omnistage.families.csm.prompt import CsmPrompt
from omnistage.families.csm.sampling import CodeSampling, pick_codes
from omnistage.models.sequence_cache import SequenceCache
from omnistage.sampling_params import SamplingParams


@dataclass
class Utterance:
    request_id: str
    prompt: CsmPrompt
    sampling: CodeSampling
    max_frames: int
    cache: SequenceCache = field(default_factory=SequenceCache)
    last: torch.Tensor | None = None  # [32] the frame the next step reads
    made: int = 0


@dataclass(frozen=True)
class Frame:
    request_id: str
    codes: torch.Tensor | None  # [32] on the host; None: the EOS frame (no audio)
    finished: bool
    by_length: bool = False

    @property
    def frames(self) -> torch.Tensor | None:
        return None if self.codes is None else self.codes[None]


class CsmRunner:
    def __init__(self, model: CsmModel) -> None:
        self.model = model
        self.running: dict[str, Utterance] = {}

    def add(self, request_id: str, prompt: CsmPrompt, sampling: SamplingParams) -> None:
        budget = prompt.max_frames(self.model.cfg)
        max_frames = max(1, min(budget, sampling.max_tokens or budget))
        self.running[request_id] = Utterance(request_id, prompt, CodeSampling.of(sampling), max_frames)

    def abort(self, request_id: str) -> None:
        self.running.pop(request_id, None)

    @torch.inference_mode()
    def step(self) -> list[Frame]:
        if not self.running:
            return []
        utterances = list(self.running.values())
        hidden = self._hidden(utterances)
        samplings = [u.sampling for u in utterances]
        first = pick_codes(self.model.first_codebook(hidden), samplings)
        codes = self.model.depth_frames(hidden, first, lambda logits, _: pick_codes(logits, samplings)).cpu()
        eos = (codes == self.model.cfg.codebook_eos_token_id).all(dim=-1).tolist()
        return [self._emit(u, row, ended) for u, row, ended in zip(utterances, codes, eos)]

    def _hidden(self, utterances: list[Utterance]) -> torch.Tensor:
        """Each utterance's backbone state ``[B, H]`` before its next frame: a prompt prefilled, or the last
        frame stepped (all of those in one batch)."""
        model, rows = self.model, {}
        going = [u for u in utterances if u.last is not None]
        if going:
            embeds = model.frame_embeds(torch.stack([u.last for u in going]).to(model.lm_head.weight.device))
            stepped = model.backbone_model.step(embeds[:, None].to(model.lm_head.weight.dtype),
                                                [u.cache for u in going])[:, -1]
            rows.update((u.request_id, row) for u, row in zip(going, stepped))
        for u in utterances:
            if u.last is None:
                device = model.lm_head.weight.device
                ids = torch.tensor(u.prompt.input_ids, device=device)
                embeds = model.prompt_embeds(ids, u.prompt.context).to(model.lm_head.weight.dtype)
                rows[u.request_id] = model.backbone_model(embeds, u.cache)[0, -1]
        return torch.stack([rows[u.request_id] for u in utterances])

    def _emit(self, u: Utterance, codes: torch.Tensor, ended: bool) -> Frame:
        if ended:
            del self.running[u.request_id]
            return Frame(u.request_id, None, True)
        u.made += 1
        u.last = codes
        by_length = u.made >= u.max_frames
        if by_length:
            del self.running[u.request_id]
        return Frame(u.request_id, codes, by_length, by_length)
