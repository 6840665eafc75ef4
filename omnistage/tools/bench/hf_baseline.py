"""The baseline: transformers' ``Qwen3OmniMoeForConditionalGeneration.generate``, one request at a time.

Same checkpoint folder, same prompt ids, thinker held to exactly ``output_tokens`` (min = max new tokens, as
``ignore_eos`` does on our side), talker held to exactly ``audio_frames`` frames, talker sampled as our
talker stage is. Audio seconds are counted from the returned waveform.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

REFERENCE_RATE = 24000  # transformers' Qwen3-Omni speaks at 24 kHz


@dataclass(frozen=True)
class HFResult:
    e2el_s: float
    output_tokens: int
    audio_s: float


class HFBaseline:
    def __init__(self, folder: Path, threads: int | None = None) -> None:
        from transformers import Qwen3OmniMoeForConditionalGeneration

        from omnistage.tools.verify.reference import quiet_transformers

        if threads:
            torch.set_num_threads(threads)
        with quiet_transformers():
            self.model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()

    @torch.no_grad()
    def run(self, prompt_ids: list[int], output_tokens: int, audio_frames: int, seed: int,
            speaker: str = "ethan") -> HFResult:
        from omnistage.tools.verify.reference import quiet_transformers

        torch.manual_seed(seed)
        ids = torch.tensor([prompt_ids])
        start = time.perf_counter()
        with quiet_transformers():
            sequences, wav = self.model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids),
                thinker_max_new_tokens=output_tokens, thinker_min_new_tokens=output_tokens, thinker_do_sample=False,
                talker_max_new_tokens=audio_frames, talker_min_new_tokens=audio_frames, talker_do_sample=True,
                talker_temperature=0.9, talker_top_k=50, talker_repetition_penalty=1.05, speaker=speaker,
            )
        elapsed = time.perf_counter() - start
        samples = 0 if wav is None else int(wav.reshape(-1).shape[0])
        return HFResult(elapsed, int(sequences.shape[1] - ids.shape[1]), samples / REFERENCE_RATE)


def summarize_hf(results: list[HFResult]) -> dict[str, float]:
    total = sum(r.e2el_s for r in results)
    e2el = sorted(r.e2el_s for r in results)
    return {
        "completed": len(results),
        "mean_e2el_ms": 1000.0 * total / len(results),
        "median_e2el_ms": 1000.0 * e2el[len(e2el) // 2],
        "output_throughput": sum(r.output_tokens for r in results) / total,
        "total_audio_s": sum(r.audio_s for r in results),
        "audio_throughput": sum(r.audio_s for r in results) / total,
        "mean_audio_s": sum(r.audio_s for r in results) / len(results),
        # Its best request (a loaded machine only slows HF down): what the ratios are taken against.
        "min_e2el_ms": 1000.0 * e2el[0],
        "best_audio_throughput": max(r.audio_s / r.e2el_s for r in results),
    }
