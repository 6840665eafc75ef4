"""``omnistage verify`` on a Moshi checkpoint: omnistage against transformers' ``MoshiForConditionalGeneration``.

Two cases, greedy, fp32, CPU:

* ``generate``: a prompt of forced frames (text, agent and user codes), then transformers' ``generate`` with its
  blank user stream (Mimi's codes of a silent frame), which omnistage is fed frame by frame as the user's input:
  text tokens and agent codes identical;
* ``streaming``: omnistage's frame-by-frame session (ring KV, one position a step) against one offline causal
  pass over the same columns: the same text tokens and codes, hidden states within ``--tolerance``; the run is
  longer than the attention window, so the window's ring is crossed.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from omnistage.families.moshi.checkpoint import load_moshi
from omnistage.families.moshi.config import MoshiConfig
from omnistage.families.moshi.model import DuplexSampling, MoshiLM
from omnistage.families.moshi.streams import ForcedFrames, MoshiStreams

PROMPT_FRAMES = 4
NEW_FRAMES = 12
TOLERANCE = 1e-4


@dataclass(frozen=True)
class CaseResult:
    name: str
    ok: bool
    detail: str


def random_prompt(cfg: MoshiConfig, frames: int, seed: int = 0) -> ForcedFrames:
    gen = torch.Generator().manual_seed(seed)
    return ForcedFrames(torch.randint(0, cfg.vocab_size, (frames,), generator=gen),
                        torch.randint(0, cfg.audio_vocab_size, (frames, cfg.num_codebooks), generator=gen),
                        torch.randint(0, cfg.audio_vocab_size, (frames, cfg.num_codebooks), generator=gen))


@torch.inference_mode()
def reference_generate(folder: Path, prompt: ForcedFrames, new_frames: int) -> tuple[torch.Tensor, ...]:
    """transformers' text tokens after the prompt, its agent codes [K, F] and its blank user frame [K]."""
    from transformers import MoshiForConditionalGeneration

    model = MoshiForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()
    k = model.config.num_codebooks
    out = model.generate(input_ids=prompt.text[None], user_audio_codes=prompt.user.T[None],
                         moshi_audio_codes=prompt.agent.T[None], max_new_tokens=new_frames, do_sample=False,
                         depth_decoder_do_sample=False, return_audio_codes=True, return_audio_waveforms=False)
    frame = int(model.config.sampling_rate / model.config.audio_encoder_config.frame_rate)
    blank = model.audio_encoder.encode(torch.zeros(1, 1, frame), num_quantizers=k)[0][0, :, 0]
    return out.sequences[0, len(prompt) + 1:], out.audio_codes[0], blank


@torch.inference_mode()
def run_generate(model: MoshiLM, prompt: ForcedFrames, user: torch.Tensor, new_frames: int) -> tuple[torch.Tensor, ...]:
    """omnistage's session: the prompt prefilled, then ``new_frames`` steps hearing ``user`` [K] each time."""
    streams = MoshiStreams(model, 1, DuplexSampling.greedy())
    streams.open(prompt)
    texts, frames = [], []
    for _ in range(new_frames):
        out = streams.step(user[None])
        texts.append(out.text[0])
        frames.append(out.frames[0])
    return torch.stack(texts), torch.stack(frames[1:], dim=1)  # step 0 completes the prompt's last frame


def case_generate(folder: Path, model: MoshiLM, new_frames: int) -> CaseResult:
    prompt = random_prompt(model.cfg, PROMPT_FRAMES)
    ref_text, ref_codes, blank = reference_generate(folder, prompt, new_frames)
    text, codes = run_generate(model, prompt, blank, new_frames)
    ref_gen = ref_codes[:, len(prompt):]
    n = min(ref_gen.shape[1], codes.shape[1])
    if not torch.equal(text, ref_text):
        return CaseResult("generate", False, f"text differs: {text.tolist()} vs transformers {ref_text.tolist()}")
    if n == 0 or not torch.equal(codes[:, :n], ref_gen[:, :n]):
        return CaseResult("generate", False, f"codes differ over {n} frames: first at frame "
                                             f"{_first_diff(codes[:, :n], ref_gen[:, :n])}")
    return CaseResult("generate", True, f"{len(text)} text tokens and {n} frames x {codes.shape[0]} codes equal")


@torch.inference_mode()
def case_streaming(model: MoshiLM, steps: int, tolerance: float) -> CaseResult:
    """Streamed steps against one causal pass over the columns they read (windowed alike)."""
    cfg = model.cfg
    streams = MoshiStreams(model, 2, DuplexSampling.greedy())
    streams.open()
    user = random_prompt(cfg, steps, seed=1).user
    cols, texts, codes = [], [], []
    for t in range(steps):
        cols.append((streams.text_in[0].clone(), torch.cat([streams.agent_in[0], streams.user_in[0]])))
        texts.append(streams.step(user[t:t + 1]).text[0])
        codes.append(streams.agent_in[0].clone())  # the step's semantic code and the previous frame's acoustics
    text_in = torch.stack([c[0] for c in cols])[None]
    audio_in = torch.stack([c[1] for c in cols]).T[None]
    row = streams.open()
    offline = model.decoder.prefill(model.embed(text_in, audio_in), row, 0, streams.cache)[0]
    offline_text = model.decoder.text_logits(offline).argmax(-1)
    offline_codes = model.depth_decoder.codes(offline, offline_text, cfg.num_codebooks,
                                              lambda logits, step: logits.argmax(-1))
    offline_codes[0, 1:] = cfg.audio_initial_id  # the first step has no earlier frame's acoustics
    streamed, streamed_codes = torch.stack(texts), torch.stack(codes)
    if not torch.equal(offline_text, streamed):
        return CaseResult("streaming", False, f"text differs first at step {_first_diff(offline_text, streamed)}")
    if not torch.equal(offline_codes, streamed_codes):
        return CaseResult("streaming", False, f"codes differ first at step {_first_diff(offline_codes.T, streamed_codes.T)}")
    return CaseResult("streaming", True, f"{steps} steps (window {cfg.context}): text and codes equal to one "
                                         f"offline pass")


def _first_diff(a: torch.Tensor, b: torch.Tensor) -> int:
    diff = (a != b).reshape(-1, a.shape[-1]).any(dim=0).nonzero()
    return int(diff[0]) if len(diff) else -1


def run_verify_command(args: argparse.Namespace, folder: Path) -> int:
    cfg = MoshiConfig.from_folder(folder)
    model = load_moshi(folder, cfg)
    new_frames = max(getattr(args, "max_new_tokens", NEW_FRAMES) or NEW_FRAMES, 2)
    results = [case_streaming(model, max(2 * cfg.context + 3, new_frames), args.tolerance or TOLERANCE)]
    if cfg.layout == "transformers":
        results.insert(0, case_generate(folder, model, new_frames))
    for r in results:
        print(f"{r.name:10s} {'ok' if r.ok else 'DIFFERS'}  {r.detail}", file=sys.stderr)
    if getattr(args, "json", None):
        text = json.dumps([asdict(r) for r in results], indent=2)
        print(text) if args.json == "-" else Path(args.json).write_text(text + "\n")
    return 0 if all(r.ok for r in results) else 1
