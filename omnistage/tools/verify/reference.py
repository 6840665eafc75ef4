"""transformers' own Qwen3-Omni on a verify case: the answer omnistage must reproduce."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from omnistage.tools.verify.prompts import VerifyCase


@dataclass(frozen=True)
class GenerationSettings:
    """Greedy settings both sides use; talker defaults follow transformers' generate."""

    max_new_tokens: int = 12
    talker_max_frames: int = 24
    talker_min_frames: int = 16
    talker_repetition_penalty: float = 1.05
    speaker: str = "ethan"


@dataclass(frozen=True)
class StageResult:
    tokens: list[int]  # generated thinker ids
    prompt_logits: torch.Tensor  # [L, vocab] thinker logits over the prompt
    codes: torch.Tensor  # [G, frames] talker codec frames
    wav: torch.Tensor  # [samples] 24 kHz


class Reference:
    def __init__(self, folder: Path) -> None:
        from transformers import Qwen3OmniMoeForConditionalGeneration

        self.model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()

    @torch.no_grad()
    def run(self, case: VerifyCase, settings: GenerationSettings, eos_id: int) -> StageResult:
        inputs = _model_inputs(case)
        logits = self.model.thinker(**inputs).logits[0]
        codes: list[torch.Tensor] = []

        def grab(module, args):  # code2wav's forward sees each chunk of codes
            codes.append(args[0][0])

        handle = self.model.code2wav.register_forward_pre_hook(grab)
        try:
            sequences, wav = self.model.generate(
                **inputs, thinker_max_new_tokens=settings.max_new_tokens, thinker_do_sample=False,
                thinker_eos_token_id=eos_id, talker_max_new_tokens=settings.talker_max_frames,
                talker_min_new_tokens=settings.talker_min_frames, talker_do_sample=False,
                talker_repetition_penalty=settings.talker_repetition_penalty, speaker=settings.speaker,
            )
        finally:
            handle.remove()
        prompt_len = inputs["input_ids"].shape[1]
        # chunked_decode passes chunks with left context; frames ≤ chunk size arrive in one call.
        return StageResult(tokens=sequences[0, prompt_len:].tolist(), prompt_logits=logits,
                           codes=codes[0] if len(codes) == 1 else _join_chunks(codes), wav=wav.reshape(-1))


def _join_chunks(chunks: list[torch.Tensor], left_context: int = 25) -> torch.Tensor:
    parts = [chunks[0]] + [c[:, left_context:] for c in chunks[1:]]
    return torch.cat(parts, dim=-1)


def _model_inputs(case: VerifyCase) -> dict[str, torch.Tensor]:
    ids = torch.tensor([case.prompt.token_ids])
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    mm = case.prompt.mm
    if mm.input_features is not None:
        inputs.update(input_features=mm.input_features, feature_attention_mask=mm.feature_attention_mask)
    if mm.pixel_values is not None:
        inputs.update(pixel_values=mm.pixel_values, image_grid_thw=mm.image_grid_thw)
    return inputs
