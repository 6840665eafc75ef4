"""``omnistage verify`` on a Qwen2.5-Omni folder: omnistage's stages against transformers.

On each prompt of :mod:`omnistage.families.qwen2_5_omni.verify_cases` (text, audio, image, video, a video with its
sound track), greedy text tokens must be identical. With a talker: the spoken reply (greedy thinker and talker,
transformers' repetition penalty 1.05) run through the offline path (thinker, talker, token2wav one after the
other, as the pipeline's test holds the served audio against) must give the talker codes transformers' ``generate``
gives, identical, and its waveform within ``WAV_ATOL`` of transformers' under ``torch.manual_seed(SEED)``.
Where tokens or codes differ, the report names the first step that differs with transformers' top-2 score gap
there (:mod:`omnistage.tools.verify.divergence`), so a near-tie can be told from a real difference.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from omnistage.engine import EngineConfig
from omnistage.families.qwen2_5_omni.offline import generate_spoken, load_talker_context
from omnistage.families.qwen2_5_omni.reference import reference_reply
from omnistage.families.qwen2_5_omni.thinker_stage import build_thinker_request
from omnistage.families.qwen2_5_omni.verify_cases import CASE_NAMES, prompt_cases
from omnistage.families.qwen2_5_omni.voices import DEFAULT_VOICE, load_speakers
from omnistage.models.qwen2_5_omni.config import Qwen25OmniConfig
from omnistage.models.qwen2_5_omni.inputs import OmniInputs
from omnistage.models.qwen2_5_omni.thinker import Thinker
from omnistage.models.qwen2_5_omni.token2wav import Token2Wav
from omnistage.runner import build_ar_engine
from omnistage.sampling_params import SamplingParams
from omnistage.tools.verify.divergence import Divergence, first_divergence

PROMPT = [{"role": "user", "content": "Hello, how are you today? Tell me a short story."}]
NEW_TOKENS = 12
TALKER_TOKENS = 40
WAV_ATOL = 1e-5
SEED = 0


def greedy_tokens(thinker: Thinker, ids: list[int], eos: int | None, new_tokens: int,
                  mm: OmniInputs | None = None) -> list[int]:
    """One prompt through the thinker's paged engine, greedy."""
    request = build_thinker_request(thinker, "verify", ids, mm or OmniInputs(),
                                    SamplingParams(temperature=0.0, max_tokens=new_tokens), eos)
    length = len(ids) + new_tokens
    engine = build_ar_engine(thinker, EngineConfig(block_size=16, num_blocks=-(-length // 16) + 2, max_num_seqs=1,
                                                   max_num_batched_tokens=length, max_model_len=length,
                                                   enforce_eager=True))
    engine.add_request(request)
    engine.run_until_done()
    return list(request.output_token_ids)


@dataclass(frozen=True)
class TokenCheck:
    ours: list[int]
    theirs: list[int]
    scores: list[torch.Tensor]  # transformers' [V] scores per generated token

    @property
    def ok(self) -> bool:
        return self.ours == self.theirs

    def divergence(self) -> Divergence | None:
        return first_divergence(self.ours, self.theirs, self.scores)


def verify_folder(folder: Path, new_tokens: int = NEW_TOKENS, case: str = "text") -> TokenCheck:
    """Ours and transformers' greedy tokens of prompt ``case`` on ``folder``."""
    from transformers import Qwen2_5OmniForConditionalGeneration

    config = Qwen25OmniConfig.from_folder(folder)
    reference = Qwen2_5OmniForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()
    prompt = prompt_cases(reference.config, _chat_ids(folder))[case]
    thinker = Thinker.from_checkpoint(folder, config=config)
    ours = greedy_tokens(thinker, prompt.ids, config.eos_token_id, new_tokens, prompt.mm)
    with torch.no_grad():
        out = reference.thinker.generate(torch.tensor([prompt.ids]), max_new_tokens=new_tokens, do_sample=False,
                                         eos_token_id=config.eos_token_id, output_scores=True,
                                         return_dict_in_generate=True, **prompt.hf_kwargs())
    return TokenCheck(ours, out.sequences[0, len(prompt.ids):].tolist(), [step[0] for step in out.scores])


@dataclass(frozen=True)
class SpokenCheck:
    speaker: str
    codes: tuple[list[int], list[int]]  # (ours, transformers') talker codes
    wav_error: float  # max |ours - transformers'| (inf when the decoded codes or lengths differ)
    code_scores: list[torch.Tensor]  # transformers' [V] scores per talker step

    @property
    def ok(self) -> bool:
        return self.codes[0] == self.codes[1] and self.wav_error < WAV_ATOL

    def divergence(self) -> Divergence | None:
        return first_divergence(*self.codes, self.code_scores)


def verify_spoken(folder: Path, speaker: str = DEFAULT_VOICE, new_tokens: int = NEW_TOKENS,
                  talker_tokens: int = TALKER_TOKENS, seed: int = SEED, case: str = "text") -> SpokenCheck:
    """Prompt ``case`` spoken in ``speaker`` by the offline path and by transformers' ``generate``."""
    from transformers import Qwen2_5OmniForConditionalGeneration

    config = Qwen25OmniConfig.from_folder(folder)
    reference = Qwen2_5OmniForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()
    prompt = prompt_cases(reference.config, _chat_ids(folder))[case]
    thinker = Thinker.from_checkpoint(folder, config=config)
    ctx = load_talker_context(folder, thinker, config)
    voice = load_speakers(folder)[speaker]
    ours = generate_spoken(thinker, ctx, prompt.ids, prompt.mm, voice.bos_token,
                           SamplingParams(temperature=0.0, max_tokens=new_tokens),
                           SamplingParams(temperature=0.0, max_tokens=talker_tokens, repetition_penalty=1.05),
                           config.eos_token_id)
    theirs = reference_reply(reference, prompt.ids, prompt.hf_spoken_kwargs(), speaker, new_tokens, talker_tokens, seed=seed)
    codes = ours.audio_codes(ctx.stop_codes)
    error = float("inf")
    if codes == theirs.wav_codes and codes:
        wav = Token2Wav.from_checkpoint(folder, config=config)(torch.tensor(codes), voice.cond, voice.ref_mel, seed)
        if wav.shape == theirs.wav.shape:
            error = (wav - theirs.wav).abs().max().item()
    return SpokenCheck(speaker, (ours.codes, theirs.codes), error, theirs.code_scores)


def _chat_ids(folder: Path) -> list[int]:
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(folder).apply_chat_template(PROMPT, add_generation_prompt=True,
                                                                    tokenize=True, return_dict=False)
    return list(ids["input_ids"] if isinstance(ids, dict) else ids)


def run_verify(args: argparse.Namespace, folder: Path) -> int:
    """The family's ``verify`` hook: every prompt case, thinker tokens, then (with a talker) codes and waveform."""
    folder = Path(folder)
    talker = Qwen25OmniConfig.from_folder(folder).has_talker
    ok = True
    for case in CASE_NAMES:
        ok &= _verify_case(folder, case, talker)
    if not talker:
        print("talker codes and waveform: not compared (this checkpoint has no talker)")
    return 0 if ok else 1


def _verify_case(folder: Path, case: str, talker: bool) -> bool:
    tokens = verify_folder(folder, case=case)
    print(f"[{case}] thinker greedy tokens: {'identical' if tokens.ok else 'DIFFER'} ({len(tokens.ours)} tokens)")
    _print_difference(tokens.ours, tokens.theirs, tokens.divergence())
    if not talker:
        return tokens.ok
    spoken = verify_spoken(folder, case=case)
    same = spoken.codes[0] == spoken.codes[1]
    print(f"[{case}] talker codes ({spoken.speaker}): {'identical' if same else 'DIFFER'} ({len(spoken.codes[0])} "
          f"codes)")
    _print_difference(*spoken.codes, spoken.divergence())
    print(f"[{case}] waveform: max |diff| {spoken.wav_error:.3g} "
          f"({'within' if spoken.wav_error < WAV_ATOL else 'OVER'} {WAV_ATOL:g})")
    return tokens.ok and spoken.ok


def _print_difference(ours: list[int], theirs: list[int], divergence: Divergence | None) -> None:
    if divergence is not None:
        print(f"  {divergence.describe()}")
        print(f"  omnistage:    {ours}\n  transformers: {theirs}", file=sys.stderr)
