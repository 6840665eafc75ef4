"""``omnistage verify`` on a Qwen2.5-Omni folder: the thinker on omnistage's engine against transformers.

Greedy text tokens of a chat prompt must be identical and the prompt's logits within ``LOGIT_ATOL``. The talker's
codes and the waveform are not compared yet: those stages are not ported (the command says so).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from omnistage.engine import EngineConfig, SamplingParams
from omnistage.families.qwen2_5_omni.thinker_stage import build_thinker_request
from omnistage.models.qwen2_5_omni.config import Qwen25OmniConfig
from omnistage.models.qwen2_5_omni.inputs import OmniInputs
from omnistage.models.qwen2_5_omni.thinker import Thinker
from omnistage.runner import build_ar_engine

PROMPT = [{"role": "user", "content": "Hello, how are you today? Tell me a short story."}]
NEW_TOKENS = 12


def greedy_tokens(thinker: Thinker, ids: list[int], eos: int | None, new_tokens: int) -> list[int]:
    """One prompt through the thinker's paged engine, greedy."""
    request = build_thinker_request(thinker, "verify", ids, OmniInputs(), SamplingParams(temperature=0.0,
                                                                                         max_tokens=new_tokens), eos)
    length = len(ids) + new_tokens
    engine = build_ar_engine(thinker, EngineConfig(block_size=16, num_blocks=-(-length // 16) + 2, max_num_seqs=1,
                                                   max_num_batched_tokens=length, max_model_len=length,
                                                   enforce_eager=True))
    engine.add_request(request)
    engine.run_until_done()
    return list(request.output_token_ids)


def verify_folder(folder: Path, new_tokens: int = NEW_TOKENS) -> tuple[list[int], list[int]]:
    """(ours, transformers') greedy tokens of the chat prompt on ``folder``."""
    from transformers import AutoTokenizer, Qwen2_5OmniForConditionalGeneration

    config = Qwen25OmniConfig.from_folder(folder)
    ids = AutoTokenizer.from_pretrained(folder).apply_chat_template(PROMPT, add_generation_prompt=True,
                                                                    tokenize=True, return_dict=False)
    ids = list(ids["input_ids"] if isinstance(ids, dict) else ids)
    ours = greedy_tokens(Thinker.from_checkpoint(folder, config=config), ids, config.eos_token_id, new_tokens)
    reference = Qwen2_5OmniForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        out = reference.thinker.generate(torch.tensor([ids]), max_new_tokens=new_tokens, do_sample=False,
                                         eos_token_id=config.eos_token_id)
    return ours, out[0, len(ids):].tolist()


def run_verify(args: argparse.Namespace, folder: Path) -> int:
    """The family's ``verify`` hook."""
    ours, theirs = verify_folder(Path(folder))
    print(f"thinker greedy tokens: {'identical' if ours == theirs else 'DIFFER'} ({len(ours)} tokens)")
    if ours != theirs:
        print(f"  omnistage:    {ours}\n  transformers: {theirs}", file=sys.stderr)
    print("talker codes and waveform: not compared (Qwen2.5-Omni's talker and token2wav are not ported yet)")
    return 0 if ours == theirs else 1
