"""``bench serve --backend openai-audio-speech --baseline hf`` on a CSM checkpoint: transformers'
``CsmForConditionalGeneration.generate`` speaking each text alone, greedy, then its codec's decode
(``output_audio``), as a caller of transformers gets audio."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from omnistage.families.csm.config import CsmConfig
from omnistage.families.csm.prompt import CsmTokenizer


@torch.inference_mode()
def hf_speech(folder: Path, texts: list[str], frames: int) -> dict[str, float]:
    from transformers import CsmForConditionalGeneration

    cfg = CsmConfig.from_folder(folder)
    tokenizer = CsmTokenizer(folder, cfg)
    model = CsmForConditionalGeneration.from_pretrained(folder).eval()
    e2e, audio, start = [], [], time.perf_counter()
    for text in texts:
        ids = torch.tensor([tokenizer.prompt(text).input_ids])
        began = time.perf_counter()
        wav = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             depth_decoder_do_sample=False, max_new_tokens=frames, output_audio=True)[0]
        e2e.append(time.perf_counter() - began)  # its first audio is its whole audio
        audio.append(wav.numel() / cfg.codec.sampling_rate)
    wall = time.perf_counter() - start
    return {"completed": len(texts), "mean_e2el_ms": 1000 * sum(e2e) / len(e2e), "min_e2el_ms": 1000 * min(e2e),
            "best_audio_throughput": max(a / t for a, t in zip(audio, e2e)), "output_throughput": 0.0,
            "audio_throughput": sum(audio) / wall, "mean_audio_s": sum(audio) / len(audio)}
