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
def hf_speech(folder: Path, texts: list[str], max_frames: int) -> list[tuple[float, float]]:
    """Each text's (seconds to its whole audio, audio seconds). ``max_frames`` is the bench's budget, which counts
    an end frame besides the ``--audio-frames`` it asks for: ``generate`` makes the frames alone."""
    from transformers import CsmForConditionalGeneration

    cfg = CsmConfig.from_folder(folder)
    tokenizer = CsmTokenizer(folder, cfg)
    model = CsmForConditionalGeneration.from_pretrained(folder).eval()
    runs = []
    for text in texts:
        ids = torch.tensor([tokenizer.prompt(text).input_ids])
        began = time.perf_counter()
        wav = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             depth_decoder_do_sample=False, max_new_tokens=max_frames - 1, output_audio=True)[0]
        runs.append((time.perf_counter() - began, wav.numel() / cfg.codec.sampling_rate))  # first audio = whole
    return runs
