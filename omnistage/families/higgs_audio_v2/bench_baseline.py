"""``bench serve --backend openai-audio-speech --baseline hf`` on a Higgs Audio v2 checkpoint: transformers'
``HiggsAudioV2ForConditionalGeneration.generate`` (greedy) of each utterance, one at a time, on the same prompt
ids the server makes, then one whole decode of its de-delayed frames (omnistage's codec: transformers' DAC decoder
modules, since transformers' tokenizer class needs torchaudio; ``verify`` holds the two equal)."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from omnistage.families.higgs_audio_v2.checkpoint import load_codec
from omnistage.families.higgs_audio_v2.config import HiggsCheckpoint
from omnistage.families.higgs_audio_v2.delay import undelay
from omnistage.families.higgs_audio_v2.prompt import HiggsTokenizer


@torch.inference_mode()
def run_transformers(folder: str | Path, texts: list[str], max_frames: int) -> list[tuple[float, float]]:
    from transformers import HiggsAudioV2ForConditionalGeneration

    folder = Path(folder)
    ckpt = HiggsCheckpoint.from_folder(folder)
    model = HiggsAudioV2ForConditionalGeneration.from_pretrained(folder).eval()
    codec, tokenizer = load_codec(folder), HiggsTokenizer(folder, ckpt.model)
    runs = []
    for text in texts:
        began = time.perf_counter()
        ids = tokenizer.prompt(text).input_ids(ckpt.model)[None]
        rows = model.generate(input_ids=ids, do_sample=False, max_new_tokens=max_frames)[0]
        ended = (rows == ckpt.model.audio_stream_eos_id).all(-1)
        rows = rows[:int(ended.nonzero()[0])] if bool(ended.any()) else rows
        wav = codec.decode(undelay(rows, ckpt.model.delays).T[None])[0]
        runs.append((time.perf_counter() - began, wav.numel() / ckpt.codec.sample_rate))
    return runs
