"""The generator's start crosses a process boundary whole: a cloned voice's codes and the sampling survive the
replica codec (as a multi-process pipeline sends them)."""

from __future__ import annotations

import torch

from omnistage.families.higgs_audio_v2.payloads import PAYLOADS, HiggsSpeech
from omnistage.families.higgs_audio_v2.prompt import HiggsPrompt
from omnistage.ipc.messages import StageInput
from omnistage.ipc.serialization import MessageCodec
from omnistage.sampling_params import SamplingParams


def test_a_cloned_start_round_trips():
    voice = torch.randint(0, 1024, (8, 30))
    start = HiggsSpeech(HiggsPrompt([1, 2, 3], voice, 2), SamplingParams(temperature=0.3, top_k=50, seed=7))
    codec = MessageCodec(PAYLOADS.replica_input())
    back = codec.decode([bytes(f) for f in codec.encode(StageInput("r", start))]).payload
    assert back.prompt.ids == [1, 2, 3] and back.prompt.text_tokens == 2 and back.sampling == start.sampling
    assert torch.equal(back.prompt.voice, voice)
