"""``omnistage verify`` on a Higgs Audio v2 folder: omnistage's modules against transformers' on the same checkpoint.

Cases (greedy, so both sides are deterministic):
- ``codes``: every generated frame (8 codes, the staircase's markers included) against
  ``HiggsAudioV2ForConditionalGeneration.generate`` on a text prompt; identical;
- ``codes_cloned``: the same with a cloned voice's frames in the prompt (audio positions on the audio MLPs);
- ``frames``: the generated rows de-delayed by the codec edge's ``Undelay`` (as a stream is) against transformers'
  ``HiggsAudioV2Processor.revert_delay_pattern`` after the first row; identical;
- ``waveform``: those frames decoded here against transformers' ``HiggsAudioV2TokenizerModel.decode``, within
  ``--tolerance`` (``WAVE_TOLERANCE``); transformers' tokenizer class needs torchaudio, and without it the case is
  reported skipped (omnistage's decoder is transformers' DAC decoder module either way);
- ``voice_codes``: a second of noise encoded for cloning here against ``HiggsAudioV2TokenizerModel.encode``;
  identical (torchaudio's resampling is reproduced); skipped likewise without torchaudio;
- ``streamed``: the frames decoded in uneven chunks as the codec stage's windows (``PAST_FRAMES`` before,
  ``LOOKAHEAD_FRAMES`` after) against the whole decode, within ``STREAM_TOLERANCE`` of the whole decode's peak.
Exit status 0 when every case that ran holds, 1 otherwise.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import torch

from omnistage.engine.frame_chunker import Undelay
from omnistage.families.higgs_audio_v2.checkpoint import load_codec, load_model
from omnistage.families.higgs_audio_v2.codec import HiggsCodec
from omnistage.families.higgs_audio_v2.config import CODEC_FOLDER, HiggsCheckpoint
from omnistage.families.higgs_audio_v2.family import LOOKAHEAD_FRAMES, PAST_FRAMES
from omnistage.families.higgs_audio_v2.prompt import HiggsPrompt, HiggsTokenizer
from omnistage.families.higgs_audio_v2.runner import generate_rows
from omnistage.families.parity_report import CaseResult, max_abs_diff, report_cases
from omnistage.sampling_params import SamplingParams

WAVE_TOLERANCE = 1e-5  # the same modules in the same order: float rounding only
STREAM_TOLERANCE = 1e-3  # of the whole decode's peak: the 4 look-ahead frames leave the tail of the receptive field
CHUNKS = (1, 5, 9)  # then the rest: a first frame alone, and boundaries off any stride
VOICE_FRAMES = 12


def streamed_decode(codec: HiggsCodec, frames: torch.Tensor, chunks: tuple[int, ...] = CHUNKS,
                    past: int = PAST_FRAMES, ahead: int = LOOKAHEAD_FRAMES) -> torch.Tensor:
    """Aligned frames ``[n, G]`` decoded as the codec stage's windows, joined."""
    bounds, n = [0], frames.shape[0]
    for size in chunks:
        bounds.append(min(bounds[-1] + size, n))
    bounds.append(n)
    parts = []
    for start, end in zip(bounds, bounds[1:]):
        if end > start:
            left, right = min(past, start), min(ahead, n - end)
            window = frames[start - left:end + right].T
            wav = codec.decode_windows(["v"], [0], [window], [left], [right], [end == n])[0]
            parts.append(wav[:wav.shape[0] - right * codec.hop])  # the engine drops the look-ahead's samples
    return torch.cat(parts)


def reference_rows(reference: object, prompt: HiggsPrompt, ckpt: HiggsCheckpoint, frames: int) -> torch.Tensor:
    kwargs = {}
    audio = prompt.audio_frames(ckpt.model)
    if audio is not None:
        kwargs = {"audio_input_ids": audio[None], "audio_input_ids_mask": torch.ones(1, audio.shape[0], dtype=bool)}
    out = reference.generate(input_ids=prompt.input_ids(ckpt.model)[None], do_sample=False, max_new_tokens=frames,
                             **kwargs)[0]
    out = out[0 if audio is None else audio.shape[0]:]
    ended = (out == ckpt.model.audio_stream_eos_id).all(-1)
    return out[:int(ended.nonzero()[0])] if bool(ended.any()) else out


@torch.inference_mode()
def run_higgs_verify(folder: Path, frames: int = 40, tolerance: float = WAVE_TOLERANCE) -> list[CaseResult]:
    from transformers import HiggsAudioV2ForConditionalGeneration, HiggsAudioV2Processor

    ckpt = HiggsCheckpoint.from_folder(folder)
    model, codec = load_model(folder, ckpt), load_codec(folder)
    tokenizer = HiggsTokenizer(folder, ckpt.model)
    voice = torch.randint(0, ckpt.codec.codebook_size, (ckpt.model.num_codebooks, VOICE_FRAMES),
                          generator=torch.Generator().manual_seed(0))
    plain = tokenizer.prompt("The quick brown fox jumps over the lazy dog.")
    cloned = tokenizer.prompt("Tell me a short story.", voice, "Hello, how are you today?")
    reference = HiggsAudioV2ForConditionalGeneration.from_pretrained(folder).eval()
    greedy = SamplingParams(temperature=0.0)
    ours = [generate_rows(model, p, greedy, frames) for p in (plain, cloned)]
    theirs = [reference_rows(reference, p, ckpt, frames) for p in (plain, cloned)]
    aligned = Undelay(ckpt.model.delays).push(ours[0])
    reverted = HiggsAudioV2Processor.revert_delay_pattern(None, theirs[0][1:]).clip(0, ckpt.codec.codebook_size - 1)
    whole = codec.decode(aligned.T[None])[0]
    results = [CaseResult("codes", _mismatch(ours[0], theirs[0]), 0.0),
               CaseResult("codes_cloned", _mismatch(ours[1], theirs[1]), 0.0),
               CaseResult("frames", _mismatch(aligned.clip(0, ckpt.codec.codebook_size - 1), reverted), 0.0),
               *_codec_cases(folder, reverted, whole, tolerance)]
    peak = float(whole.abs().max())
    results.append(CaseResult("streamed", max_abs_diff(streamed_decode(codec, aligned), whole),
                              STREAM_TOLERANCE * max(peak, 1e-12)))
    return results


def _codec_cases(folder: Path, frames: torch.Tensor, whole: torch.Tensor, tolerance: float) -> list[CaseResult]:
    """The waveform and the clone's codes against transformers' tokenizer (which needs torchaudio)."""
    if importlib.util.find_spec("torchaudio") is None:
        why = "transformers' HiggsAudioV2TokenizerModel needs torchaudio"
        return [CaseResult("waveform", float("nan"), tolerance, why), CaseResult("voice_codes", float("nan"), 0, why)]
    from transformers import HiggsAudioV2TokenizerModel

    codec = HiggsAudioV2TokenizerModel.from_pretrained(folder / CODEC_FOLDER).eval()
    ours = load_codec(folder, encoder=True)
    wave = torch.randn(ours.config.sample_rate, generator=torch.Generator().manual_seed(1)) * 0.1
    return [CaseResult("waveform", max_abs_diff(whole, codec.decode(frames.T[None]).audio_values[0, 0]), tolerance),
            CaseResult("voice_codes", _mismatch(ours.encode(wave), codec.encode(wave[None, None]).audio_codes[0]),
                       0.0)]


def _mismatch(a: torch.Tensor, b: torch.Tensor) -> float:
    """Codes that differ (a different count of frames is every code)."""
    if a.shape != b.shape:
        return float(max(a.numel(), b.numel()))
    return float((a != b).sum())


def run_higgs_verify_command(args: argparse.Namespace, folder: Path) -> int:
    """Higgs Audio v2's ``verify`` hook (``--talker-max-new-tokens``: frames generated; ``--tolerance``: waveform)."""
    tolerance = args.tolerance if getattr(args, "tolerance", None) is not None else WAVE_TOLERANCE
    try:
        results = run_higgs_verify(folder, frames=getattr(args, "talker_max_new_tokens", 40) or 40,
                                   tolerance=max(tolerance, 0.0))
    except Exception as exc:  # noqa: BLE001 - a side that cannot run is a failed verification
        print(f"omnistage verify: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return report_cases(args, folder, results)
