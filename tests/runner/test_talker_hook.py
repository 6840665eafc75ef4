"""The talker step hook: whole frames per step, trailing text fed back, waiting for the thinker."""

from __future__ import annotations

import pytest
import torch

from omnistage.engine import Request
from omnistage.runner import TalkerRequestData, TalkerStepHook
from omnistage.runner.talker_hook import talker_suppress_mask
from omnistage.sampling_params import SamplingParams
from tests.runner.helpers import config, make_engine
from tests.runner.toy_model import ToyTalker

GROUPS = 4
PARAMS = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def talker() -> ToyTalker:
    return ToyTalker(groups=GROUPS, seed=1)


def _request(rid: str, talker: ToyTalker, prompt_len: int, text_len: int, finished: bool = True,
             params: SamplingParams = PARAMS) -> Request:
    gen = torch.Generator().manual_seed(prompt_len * 31 + text_len)
    hidden = talker.embed.embedding_dim
    data = TalkerRequestData(tts_pad_embed=torch.randn(hidden, generator=gen))
    data.add_text(torch.randn(text_len, hidden, generator=gen))
    if finished:
        data.finish_text()
    prompt = torch.randn(prompt_len, hidden, generator=gen)
    return Request(rid, None, params, prompt_embeds=prompt, stage_data=data)


def _run(talker: ToyTalker, reqs: list[Request], **cfg: object) -> dict[str, torch.Tensor]:
    engine = make_engine(talker, config(**cfg), hook=TalkerStepHook(talker))
    for r in reqs:
        engine.add_request(r)
    frames: dict[str, list[torch.Tensor]] = {}
    for out in engine.run_until_done():
        assert out.new_frames is not None and out.new_frames[0, 0].item() == out.new_token_ids[0]
        frames.setdefault(out.request_id, []).append(out.new_frames)
    return {rid: torch.cat(f) for rid, f in frames.items()}


def test_each_step_yields_a_whole_frame_batched_like_alone(talker: ToyTalker) -> None:
    shapes = [(5, 3), (9, 12), (2, 0), (14, 6)]
    alone = {f"t{i}": _run(talker, [_request("x", talker, p, t)])["x"] for i, (p, t) in enumerate(shapes)}
    together = _run(talker, [_request(f"t{i}", talker, p, t) for i, (p, t) in enumerate(shapes)])
    for rid, frames in alone.items():
        assert frames.shape == (PARAMS.max_tokens, GROUPS)
        assert torch.equal(together[rid], frames)


def test_preemption_recomputes_fed_frames(talker: ToyTalker) -> None:
    reqs = [_request(f"t{i}", talker, 9, 4) for i in range(3)]
    alone = {r.request_id: _run(talker, [_request("x", talker, 9, 4)])["x"] for r in reqs}
    squeezed = _run(talker, reqs, num_blocks=12, enable_prefix_caching=False)
    assert sum(r.num_preemptions for r in reqs) > 0
    assert all(torch.equal(squeezed[rid], alone[rid]) for rid in alone)


def test_waits_for_trailing_text_then_pads_after_thinker_finishes(talker: ToyTalker) -> None:
    slow = _request("slow", talker, 6, 1, finished=False)
    engine = make_engine(talker, config(), hook=TalkerStepHook(talker))
    engine.add_request(slow)
    engine.add_request(_request("fast", talker, 6, 2))
    counts = {"slow": 0, "fast": 0}
    for _ in range(5):
        for out in engine.step():
            counts[out.request_id] += 1
    # One frame from the prompt, one more fed with text entry 0, then it waits for entry 1.
    assert counts == {"slow": 2, "fast": 5}
    data = slow.stage_data
    assert isinstance(data, TalkerRequestData)
    data.add_text(torch.zeros(1, talker.embed.embedding_dim))
    engine.step()
    assert slow.num_output_tokens == 3 and not engine.runner.is_ready(slow)
    data.finish_text()  # the thinker is done: tts_pad from now on
    engine.run_until_done()
    assert slow.num_output_tokens == PARAMS.max_tokens


def test_suppressed_ids_are_never_sampled(talker: ToyTalker) -> None:
    vocab = talker.head.out_features
    eos = 40
    mask = talker_suppress_mask(vocab, eos)
    assert mask.sum() == vocab - 1 - 0 and not mask[eos]  # vocab < 1024: everything but EOS is special
    mask[:32] = False  # pretend ids below 32 are codebook-0 codes
    engine = make_engine(talker, config(), hook=TalkerStepHook(talker, mask))
    engine.add_request(_request("s", talker, 4, 2, params=SamplingParams(temperature=1.0, seed=3, max_tokens=20)))
    tokens = [t for out in engine.run_until_done() for t in out.new_token_ids]
    assert all(t < 32 or t == eos for t in tokens)
