"""``omnistage verify`` on a Pocket TTS folder: omnistage's modules against transformers' on the same checkpoint.

Cases (each greedy, so the flow head's noise is zero and both sides are deterministic):
- ``latents``: ``generate`` with a cloned-voice prompt; every latent within ``LATENT_TOLERANCE`` (1e-5);
- ``waveform``: transformers' ``decode`` of those latents against a whole decode here, within ``--tolerance``
  (default ``WAVE_TOLERANCE``);
- ``streamed``: the latents decoded in uneven chunks on one carried state against the whole decode, within the
  same tolerance.
Exit status 0 when every case holds, 1 otherwise.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from omnistage.families.parity_report import CaseResult, max_abs_diff, verify_command
from omnistage.families.pocket_tts.checkpoint import load_decoder, load_model
from omnistage.families.pocket_tts.config import CODEC_FOLDER, PocketCheckpoint
from omnistage.families.pocket_tts.generate import FlowSampling, generate_latents

LATENT_TOLERANCE = 1e-5
WAVE_TOLERANCE = 1e-4  # samples of order 1 through ~20 conv layers: fp32 rounding stays near 1e-6
CHUNKS = (1, 3, 7)  # then the rest: a first frame alone, and boundaries off any stride
VOICE_FRAMES = 3


def verification_prompt(ckpt: PocketCheckpoint, text_ids: list[int]) -> torch.Tensor:
    cfg = ckpt.model
    return torch.tensor([cfg.audio_prompt_bos_token_id, *[cfg.audio_prompt_token_id] * VOICE_FRAMES, *text_ids,
                         cfg.audio_bos_token_id])


@torch.inference_mode()
def run_pocket_verify(folder: Path, frames: int = 16, tolerance: float = WAVE_TOLERANCE) -> list[CaseResult]:
    from transformers import PocketTTSAudioTokenizerModel, PocketTTSForConditionalGeneration

    ckpt = PocketCheckpoint.from_folder(folder)
    model, decoder = load_model(folder, ckpt), load_decoder(folder, ckpt)
    ids = verification_prompt(ckpt, [5, 17, 99, 42, 3])
    voice = torch.randn(VOICE_FRAMES, ckpt.model.latent_dim, generator=torch.Generator().manual_seed(0))
    ours = generate_latents(model, ids, FlowSampling(greedy=True, max_frames=frames), voice=voice)
    reference = PocketTTSForConditionalGeneration.from_pretrained(folder).eval()
    out = reference.generate(input_ids=ids[None], audio_prompt_latents=voice[None], do_sample=False,
                             max_new_tokens=frames, frames_after_eos=2, return_dict_in_generate=True)
    theirs = out.audio_latents[0, :int(out.audio_latents_mask[0].sum())]
    # the decoding half only: the checkpoint written here carries no encoder
    codec = PocketTTSAudioTokenizerModel.from_pretrained(folder / CODEC_FOLDER, encoder_config=None).eval()
    whole = decoder.decode(ours)
    reference_wave = codec.decode(ours[None]).audio_values[0, 0]
    state, bounds, parts = decoder.new_state(), [0], []
    for size in CHUNKS:
        bounds.append(min(bounds[-1] + size, len(ours)))
    bounds.append(len(ours))
    parts = [decoder.decode(ours[a:b], state) for a, b in zip(bounds, bounds[1:]) if b > a]
    return [CaseResult("latents", max_abs_diff(ours, theirs), LATENT_TOLERANCE),
            CaseResult("waveform", max_abs_diff(whole, reference_wave), tolerance),
            CaseResult("streamed", max_abs_diff(torch.cat(parts), whole), tolerance)]


def run_pocket_verify_command(args: argparse.Namespace, folder: Path) -> int:
    """Pocket TTS's ``verify`` hook (``--talker-max-new-tokens``: frames generated; ``--tolerance``: waveform)."""
    return verify_command(args, folder, run_pocket_verify, 16, WAVE_TOLERANCE)
