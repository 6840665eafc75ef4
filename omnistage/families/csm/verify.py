"""``omnistage verify`` on a CSM folder: omnistage's modules against transformers' on the same checkpoint.

Cases (greedy, both sides deterministic), two context turns of random audio (two speakers) before the text:
- ``context``: the context audios' Mimi codes, ours against ``codec_model.encode`` (must be identical);
- ``codes``: ``generate``'s frames against the backbone stage's runner (every code identical; its figure is the
  share of codes that differ);
- ``waveform``: transformers' ``codec_model.decode`` of those frames against a whole decode here, within
  ``--tolerance`` (default ``WAVE_TOLERANCE``);
- ``streamed``: the frames decoded in uneven chunks on one carried state against the whole decode, within
  ``STREAM_TOLERANCE`` (the issue's 1e-5).
Exit status 0 when every case holds, 1 otherwise.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from omnistage.families.csm.checkpoint import load_codec, load_model
from omnistage.families.csm.config import CsmConfig
from omnistage.families.csm.prompt import CsmTokenizer, Segment
from omnistage.families.csm.runner import CsmRunner
from omnistage.families.parity_report import CaseResult, max_abs_diff, verify_command
from omnistage.sampling_params import SamplingParams

WAVE_TOLERANCE = 1e-4  # samples within [-1, 1] through ~25 conv layers: fp32 rounding stays near 1e-6
STREAM_TOLERANCE = 1e-5
CHUNKS = (1, 3, 7)  # then the rest: a first frame alone, and boundaries off any stride
CONTEXT_SAMPLES = (3 * 1920 + 500, 2 * 1920)  # two earlier turns, the first no whole number of frames
CONTEXT_TURNS = ((1, "Once upon a time."), (0, "There was a robot."))


def greedy_frames(runner: CsmRunner, prompt: object, frames: int) -> torch.Tensor:
    runner.add("verify", prompt, SamplingParams(temperature=0.0, max_tokens=frames))  # type: ignore[arg-type]
    made = []
    while runner.running:
        made += [f.codes for f in runner.step() if f.codes is not None]
    return torch.stack(made) if made else torch.zeros(0, runner.model.cfg.num_codebooks, dtype=torch.long)


@torch.inference_mode()
def run_csm_verify(folder: Path, frames: int = 12, tolerance: float = WAVE_TOLERANCE) -> list[CaseResult]:
    from transformers import CsmForConditionalGeneration

    cfg = CsmConfig.from_folder(folder)
    model, codec = load_model(folder, cfg), load_codec(folder, cfg)
    noise = torch.Generator().manual_seed(0)
    audios = [(torch.randn(n, generator=noise) * 0.3).clamp(-1, 1) for n in CONTEXT_SAMPLES]
    contexts = [codec.encode(a[None], num_quantizers=cfg.num_codebooks)[0].T for a in audios]
    turns = tuple(Segment(speaker, text, codes) for (speaker, text), codes in zip(CONTEXT_TURNS, contexts))
    prompt = CsmTokenizer(folder, cfg).prompt("Hello there, how are you today?", 0, turns)
    ours = greedy_frames(CsmRunner(model), prompt, frames)
    reference = CsmForConditionalGeneration.from_pretrained(folder).eval()
    ids = torch.tensor([prompt.input_ids])
    theirs_context = torch.cat([reference.codec_model.encode(a[None, None], num_quantizers=cfg.num_codebooks)
                                .audio_codes[0].T for a in audios])
    # attention_mask as CSM's processor returns it: the audio positions' id is also the pad id, and generate
    # would otherwise mask them out
    cutoffs = torch.tensor([CONTEXT_SAMPLES]).cumsum(dim=-1)
    out = reference.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                             input_values=torch.cat(audios)[None, None], input_values_cutoffs=cutoffs,
                             do_sample=False, depth_decoder_do_sample=False, max_new_tokens=frames)[0]
    theirs = out[:_eos_index(out, cfg.codebook_eos_token_id)]
    whole = codec.decode(ours.T[None])[0]
    reference_wave = reference.codec_model.decode(ours.T[None]).audio_values[0, 0]
    return [CaseResult("context", _mismatch(torch.cat(contexts), theirs_context), 0.0),
            CaseResult("codes", _mismatch(ours, theirs), 0.0),
            CaseResult("waveform", max_abs_diff(whole, reference_wave), tolerance),
            CaseResult("streamed", max_abs_diff(_streamed(codec, ours), whole), STREAM_TOLERANCE)]


def _streamed(codec: torch.nn.Module, frames: torch.Tensor) -> torch.Tensor:
    bounds = [0]
    for size in CHUNKS:
        bounds.append(min(bounds[-1] + size, len(frames)))
    bounds.append(len(frames))
    state = codec.decoder.new_stream()
    parts = [codec.decode(frames[a:b].T[None], state)[0] for a, b in zip(bounds, bounds[1:]) if b > a]
    return torch.cat(parts)


def _eos_index(frames: torch.Tensor, eos: int) -> int:
    ended = (frames == eos).all(dim=-1).nonzero()
    return int(ended[0]) if ended.numel() else frames.shape[0]


def _mismatch(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.shape != b.shape:
        return float("inf")
    return float((a != b).float().mean()) if a.numel() else 0.0


def run_csm_verify_command(args: argparse.Namespace, folder: Path) -> int:
    """CSM's ``verify`` hook (``--talker-max-new-tokens``: frames generated; ``--tolerance``: waveform)."""
    return verify_command(args, folder, run_csm_verify, 12, WAVE_TOLERANCE)
