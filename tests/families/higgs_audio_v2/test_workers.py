"""The generator worker sends each utterance's frames ``FRAMES_PER_OUTPUT`` at a time (its last output the rest,
with the finish), and the frames it sent, joined, are the utterance's rows; an aborted utterance's held frames go."""

from __future__ import annotations

import torch

from omnistage.config.pipeline import load_preset
from omnistage.families.higgs_audio_v2.family import PRESET
from omnistage.families.higgs_audio_v2.payloads import HiggsSpeech
from omnistage.families.higgs_audio_v2.prompt import HiggsTokenizer
from omnistage.families.higgs_audio_v2.runner import generate_rows
from omnistage.families.higgs_audio_v2.workers import FRAMES_PER_OUTPUT, GeneratorWorker
from omnistage.ipc.messages import StageInput
from omnistage.ipc.payloads import CodecFrames
from omnistage.sampling_params import SamplingParams
from omnistage.workers.base import WorkerSpec

GREEDY = SamplingParams(temperature=0.0, max_tokens=10)


def test_frames_go_in_groups_and_join_to_the_rows(higgs_tiny):
    worker = GeneratorWorker(WorkerSpec(str(higgs_tiny), load_preset(PRESET).stage("generator")))
    prompt = HiggsTokenizer(higgs_tiny, worker.runner.model.cfg).prompt("hello there")
    worker.handle(StageInput("a", HiggsSpeech(prompt, GREEDY)))
    worker.handle(StageInput("b", HiggsSpeech(prompt, GREEDY)))
    sent: list[torch.Tensor] = []
    for step in range(12):
        if step == 5:
            worker.abort(["b"])
            assert "b" not in worker.held and len(worker.held["a"]) == 5 % FRAMES_PER_OUTPUT
        for out in worker.step().outputs:
            assert out.request_id == "a" or step < 5
            if out.request_id == "a":
                assert isinstance(out.payload, CodecFrames)
                assert out.payload.frames.shape[0] == (FRAMES_PER_OUTPUT if not out.finished else 10 % FRAMES_PER_OUTPUT)
                sent.append(out.payload.frames)
    assert not worker.has_work() and not worker.held
    expected = generate_rows(worker.runner.model, prompt, GREEDY, 10)
    torch.testing.assert_close(torch.cat(sent), expected, rtol=0, atol=0)  # integer codes


def test_utterances_that_started_apart_send_in_the_same_steps(higgs_tiny):
    """One clock for every utterance: a batch's outputs share a pass (one send each way), whenever each began."""
    worker = GeneratorWorker(WorkerSpec(str(higgs_tiny), load_preset(PRESET).stage("generator")))
    prompt = HiggsTokenizer(higgs_tiny, worker.runner.model.cfg).prompt("hello there")
    long = SamplingParams(temperature=0.0, max_tokens=3 * FRAMES_PER_OUTPUT)
    worker.handle(StageInput("a", HiggsSpeech(prompt, long)))
    sent: dict[str, list[tuple[int, int]]] = {"a": [], "b": []}
    for step in range(2 * FRAMES_PER_OUTPUT + 1):
        if step == 3:
            worker.handle(StageInput("b", HiggsSpeech(prompt, long)))
        for out in worker.step().outputs:
            assert not out.finished
            sent[out.request_id].append((step, out.payload.frames.shape[0]))
    steps = [FRAMES_PER_OUTPUT - 1, 2 * FRAMES_PER_OUTPUT - 1]
    assert sent["a"] == [(s, FRAMES_PER_OUTPUT) for s in steps]
    assert sent["b"] == [(steps[0], FRAMES_PER_OUTPUT - 3), (steps[1], FRAMES_PER_OUTPUT)]
