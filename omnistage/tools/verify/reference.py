"""transformers' own Qwen3-Omni on a verify case: the answer omnistage must reproduce."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from omnistage.families.qwen3_omni.offline import GenerationSettings
from omnistage.tools.verify.prompts import VerifyCase


@dataclass(frozen=True)
class StageResult:
    tokens: list[int]  # generated thinker ids
    prompt_logits: torch.Tensor  # [L, vocab] thinker logits over the prompt
    codes: torch.Tensor  # [G, frames] talker codec frames
    wav: torch.Tensor  # [samples] 24 kHz


class Reference:
    def __init__(self, folder: Path) -> None:
        from transformers import Qwen3OmniMoeForConditionalGeneration

        with quiet_transformers():
            self.model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()

    @torch.no_grad()
    def run(self, case: VerifyCase, settings: GenerationSettings, eos_id: int) -> StageResult:
        if settings.talker_temperature != 0.0:
            raise ValueError("verify compares greedy runs: talker_temperature must be 0")
        inputs = _model_inputs(case)
        logits = self.model.thinker(**inputs).logits[0]
        codes: list[torch.Tensor] = []

        def grab(module, args):  # code2wav's forward sees each chunk of codes
            codes.append(args[0][0])

        handle = self.model.code2wav.register_forward_pre_hook(grab)
        try:
            with quiet_transformers():
                sequences, wav = self.model.generate(
                    **inputs, thinker_max_new_tokens=settings.max_new_tokens, thinker_do_sample=False,
                    thinker_min_new_tokens=settings.min_new_tokens, thinker_eos_token_id=eos_id,
                    talker_max_new_tokens=settings.talker_max_new_tokens,
                    talker_min_new_tokens=settings.talker_min_new_tokens, talker_do_sample=False,
                    talker_repetition_penalty=settings.talker_repetition_penalty, speaker=settings.speaker,
                )
        finally:
            handle.remove()
        prompt_len = inputs["input_ids"].shape[1]
        groups = self.model.config.talker_config.num_code_groups
        return StageResult(tokens=sequences[0, prompt_len:].tolist(), prompt_logits=logits,
                           codes=_join_chunks(codes, groups), wav=wav.reshape(-1))


def _join_chunks(chunks: list[torch.Tensor], groups: int, left_context: int = 25) -> torch.Tensor:
    """chunked_decode's chunks (each after the first led by 25 context frames, as chunks hold 300) -> ``[G, T]``."""
    if not chunks:  # no frames: generate never called the vocoder
        return torch.zeros(groups, 0, dtype=torch.long)
    parts = [chunks[0]] + [c[:, left_context:] for c in chunks[1:]]
    return torch.cat(parts, dim=-1)


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silences transformers' notices (unused sampling flags, rope keys, load progress) for a readable report;
    the previous verbosity and warning filters come back afterwards."""
    from transformers.utils import logging

    previous, bar = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            yield
    finally:
        logging.set_verbosity(previous)
        if bar:
            logging.enable_progress_bar()


def _model_inputs(case: VerifyCase) -> dict[str, torch.Tensor]:
    ids = torch.tensor([case.prompt.token_ids])
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    mm = case.prompt.mm
    if mm.input_features is not None:
        inputs.update(input_features=mm.input_features, feature_attention_mask=mm.feature_attention_mask)
    if mm.pixel_values is not None:
        inputs.update(pixel_values=mm.pixel_values, image_grid_thw=mm.image_grid_thw)
    if mm.pixel_values_videos is not None:
        inputs.update(pixel_values_videos=mm.pixel_values_videos, video_grid_thw=mm.video_grid_thw,
                      video_second_per_grid=mm.video_second_per_grid)
    return inputs
