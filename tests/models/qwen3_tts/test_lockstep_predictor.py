"""Qwen3-TTS's code predictor (with its width projection) through the lockstep stack is its decoder's forward."""

from __future__ import annotations

import copy

import torch

from omnistage.models.lockstep_stack import LockstepStack
from omnistage.models.qwen3_tts.checkpoint import Qwen3TTSModels
from tests.models.test_lockstep_stack import _PassThrough


def test_every_model_types_predictor_matches_its_decoder_forward(tts_models: dict[str, Qwen3TTSModels]) -> None:
    for kind, models in tts_models.items():
        predictor = models.talker.code_predictor
        assert LockstepStack.supports(predictor.model), kind
        width = predictor.model.codec_embedding[0].weight.shape[-1]
        hidden, code0_embed = torch.randn(2, 3, width, generator=torch.Generator().manual_seed(0)) * 3
        fast = predictor.predict(hidden, code0_embed)
        slow_predictor = copy.deepcopy(predictor)
        slow_predictor.model.leader = leader = _PassThrough()
        assert torch.equal(fast, slow_predictor.predict(hidden, code0_embed)), kind
        assert leader.calls == predictor.num_code_groups - 1
