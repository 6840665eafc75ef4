"""Qwen2.5-Omni's talker on omnistage's engine equals transformers' greedy talker on the tiny checkpoint: the
thinker's reply run with its hidden states captured, then the talker fed it, gives identical codes (text and
audio prompts; transformers' ``generate`` cannot speak image/video prompts: it hands ``pixel_values`` to the
talker's ``generate``, which rejects them). Also: the reply fed row by row while the talker runs gives the same
codes as the reply given whole."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from omnistage.families.qwen2_5_omni.offline import _engine, generate_spoken, load_talker_context
from omnistage.families.qwen2_5_omni.reference import reference_reply
from omnistage.families.qwen2_5_omni.talker_stage import (TalkerContext, build_talker_request, feed_reply,
                                                          finish_reply)
from omnistage.models.qwen2_5_omni.config import Qwen25OmniConfig
from omnistage.models.qwen2_5_omni.thinker import Thinker
from omnistage.sampling_params import SamplingParams
from tests.families.qwen2_5_omni.conftest import prompt_cases

THINKER_TOKENS, TALKER_TOKENS = 8, 40
GREEDY_THINKER = SamplingParams(temperature=0.0, max_tokens=THINKER_TOKENS)
# transformers' talker defaults keep repetition_penalty=1.05 under greedy (over its prompt's codec ids too).
GREEDY_TALKER = SamplingParams(temperature=0.0, max_tokens=TALKER_TOKENS, repetition_penalty=1.05)


@pytest.fixture(scope="module")
def stages(omni25_dir: Path) -> tuple[Thinker, TalkerContext, Qwen25OmniConfig]:
    config = Qwen25OmniConfig.from_folder(omni25_dir)
    thinker = Thinker.from_checkpoint(omni25_dir, config=config)
    return thinker, load_talker_context(omni25_dir, thinker, config), config


@pytest.mark.parametrize("name", ("text", "audio"))
@pytest.mark.parametrize("speaker", ("Chelsie", "Ethan"))
def test_talker_codes_equal_transformers(name: str, speaker: str, stages: tuple, reference: torch.nn.Module) -> None:
    thinker, ctx, config = stages
    case = prompt_cases(reference.config)[name]
    theirs = reference_reply(reference, case.ids, case.hf_kwargs(), speaker, THINKER_TOKENS, TALKER_TOKENS)
    bos = int(reference.speaker_map[speaker]["bos_token"])
    ours = generate_spoken(thinker, ctx, case.ids, case.mm, bos, GREEDY_THINKER, GREEDY_TALKER, config.eos_token_id)
    assert ours.text_tokens == theirs.text_tokens
    assert ours.codes == theirs.codes and len(ours.codes) == TALKER_TOKENS


def test_reply_fed_row_by_row_gives_the_same_codes(stages: tuple, reference: torch.nn.Module) -> None:
    thinker, ctx, config = stages
    case = prompt_cases(reference.config)["text"]
    bos = int(reference.speaker_map["Chelsie"]["bos_token"])
    whole = generate_spoken(thinker, ctx, case.ids, case.mm, bos, GREEDY_THINKER, GREEDY_TALKER, config.eos_token_id)
    hidden = torch.randn(len(case.ids) + THINKER_TOKENS, thinker.config.text_config.hidden_size,
                         generator=torch.Generator().manual_seed(1))
    tokens = whole.text_tokens
    runs = []
    for streamed in (False, True):
        p = len(case.ids)
        request = build_talker_request(ctx, "t", case.ids, case.mm, hidden[:p], bos, tokens[0], hidden[p],
                                       GREEDY_TALKER)
        engine = _engine(ctx.talker, p + 2 + TALKER_TOKENS, ctx.step_hook())
        engine.add_request(request)
        rest = list(range(1, len(tokens) - 1))
        if not streamed:
            feed_reply(ctx, request, [tokens[m] for m in rest], hidden[p + 1:p + len(tokens) - 1])
            rest = []
        while not request.is_finished:
            engine.step()
            if rest:  # one more reply row per step, so the talker waits for some
                m = rest.pop(0)
                feed_reply(ctx, request, [tokens[m]], hidden[p + m:p + m + 1])
                if not rest:
                    finish_reply(ctx, request)
            elif not request.stage_data.text_finished:
                finish_reply(ctx, request)
        runs.append(list(request.output_token_ids))
    assert runs[0] == runs[1] and len(runs[0]) == TALKER_TOKENS
