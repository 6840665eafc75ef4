"""The generator's rows: utterances joining, ending and aborted mid-way while others run (each leaving row takes
the last one's place) still make, frame for frame, what each makes alone."""

from __future__ import annotations

import torch

from omnistage.families.higgs_audio_v2.checkpoint import load_model
from omnistage.families.higgs_audio_v2.config import HiggsCheckpoint
from omnistage.families.higgs_audio_v2.prompt import HiggsTokenizer
from omnistage.families.higgs_audio_v2.runner import HiggsRunner, generate_rows
from omnistage.sampling_params import SamplingParams

TEXTS = ("hello there", "the quick brown fox jumps over the lazy dog", "good morning to you all", "one two")
GREEDY = SamplingParams(temperature=0.0)


def test_rows_joining_ending_and_aborted_make_what_each_makes_alone(higgs_tiny):
    ckpt = HiggsCheckpoint.from_folder(higgs_tiny)
    model, tokenizer = load_model(higgs_tiny, ckpt), HiggsTokenizer(higgs_tiny, ckpt.model)
    prompts = [tokenizer.prompt(t) for t in TEXTS]
    budgets = (12, 30, 20, 25)  # different ends
    alone = [generate_rows(model, p, GREEDY, n) for p, n in zip(prompts, budgets)]
    runner, made = HiggsRunner(model), {i: [] for i in range(len(TEXTS))}
    for step in range(40):
        if step in (0, 3):  # joins at different lengths
            for i in (0, 1) if step == 0 else (2, 3):
                runner.add(str(i), prompts[i], GREEDY, budgets[i])
        if step == 8:
            runner.abort("1")  # the second row leaves mid-way; the last takes its place
        for frame in runner.step():
            made[int(frame.request_id)].append(frame.codes)
    assert not runner.running and not runner.rows and runner.slots.count == 0
    assert len(made[1]) == 8
    torch.testing.assert_close(torch.stack(made[1]), alone[1][:8], rtol=0, atol=0)
    for i in (0, 2, 3):
        torch.testing.assert_close(torch.stack(made[i]), alone[i], rtol=0, atol=0)  # integer codes
