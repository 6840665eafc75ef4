"""A listened audio's features computed past its frozen head only, and each audio's features computed once.

The whole-clip pass with the frozen head put in front is what the prompt had before: the tail-only path must
give the same frames (atol 1e-5: the STFT of a shorter piece, and the head's peak recovered from its scaled
values) and the extractor's mask, whether the clip's peak lies in the head or after it.
"""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import pytest
import torch

from omnistage.families.qwen3_omni.prompt import Qwen3OmniPromptProcessor
from omnistage.processing.identity_memo import IdentityMemo
from omnistage.processing.listened_audio import ListenedAudio, listened_features
from omnistage.processing.prompt import AUDIO_SAMPLE_RATE
from tests.entrypoints.test_realtime import spoken_like

RATE = AUDIO_SAMPLE_RATE


@pytest.fixture(scope="module")
def processor(tiny_dir: Path) -> Qwen3OmniPromptProcessor:
    return Qwen3OmniPromptProcessor.from_folder(tiny_dir)


def listened(processor: Qwen3OmniPromptProcessor, audio: np.ndarray) -> ListenedAudio:
    mel = processor.listener()
    assert mel is not None
    mel.advance(audio)
    head = mel.head()
    assert head is not None
    return ListenedAudio(audio, head)


def whole_pass(processor: Qwen3OmniPromptProcessor, item: ListenedAudio) -> dict[str, torch.Tensor]:
    out = processor.features(item.samples, sampling_rate=RATE, return_attention_mask=True, padding=True,
                             truncation=False, return_tensors="pt")
    out["input_features"][0, :, :item.head.shape[1]] = item.head
    return out


@pytest.mark.parametrize("seconds", [8.03, 9.3, 17.317, 24.0])
@pytest.mark.parametrize("loud", ["head", "tail"])
def test_tail_only_features_equal_the_whole_pass_with_the_head(processor, seconds: float, loud: str) -> None:
    audio = spoken_like(seconds, RATE, seed=int(seconds))
    if loud == "head":
        audio[RATE:2 * RATE] *= 3.0
    else:
        audio[-RATE // 2:] *= 3.0
    item = listened(processor, audio)
    expected = whole_pass(processor, item)
    got = processor._features(item)
    assert got["input_features"].shape == expected["input_features"].shape
    assert torch.equal(got["attention_mask"], expected["attention_mask"])
    torch.testing.assert_close(got["input_features"], expected["input_features"], rtol=0, atol=1e-5)
    assert got["input_features"].shape[2] > item.head.shape[1]  # a tail was computed


def test_a_head_covering_the_clip_is_the_features(processor) -> None:
    audio = spoken_like(9.0, RATE, seed=3)
    item = listened(processor, audio)
    cut = ListenedAudio(audio[:item.head.shape[1] * processor.features.hop_length], item.head)
    assert torch.equal(listened_features(processor.features, cut), item.head)
    with pytest.raises(ValueError, match="do not fit"):
        listened_features(processor.features, ListenedAudio(audio[:1000], item.head))


def test_each_audio_object_is_featurized_once_while_it_lives(processor) -> None:
    a, b = spoken_like(3.0, RATE, seed=1), spoken_like(2.0, RATE, seed=2)
    ids = [processor.audio_token_id]
    memo = processor._memo
    before = len(memo)
    first = processor.process(ids * 2, audios=[a, b])
    assert len(memo) == before + 2
    again = processor.process(ids * 2, audios=[a, b])  # the next turn: the same objects, served from the memo
    assert len(memo) == before + 2
    assert torch.equal(first.mm.input_features, again.mm.input_features)
    copy = a.copy()  # an equal array is another object: computed for itself
    processor.process(ids, audios=[copy])
    assert len(memo) == before + 3
    del a, b, copy
    gc.collect()
    assert len(memo) == before


def test_identity_memo_computes_once_per_living_object() -> None:
    memo: IdentityMemo[np.ndarray, float] = IdentityMemo()
    calls: list[int] = []

    def total(x: np.ndarray) -> float:
        calls.append(len(x))
        return float(x.sum())

    x = np.ones(4)
    assert memo.get(x, total) == 4.0 and memo.get(x, total) == 4.0
    assert calls == [4]
    y = np.ones(4)
    assert memo.get(y, total) == 4.0 and calls == [4, 4]
    del x
    gc.collect()
    assert len(memo) == 1
    assert memo.get([1, 2], lambda v: float(sum(v))) == 3.0  # not weakly referable: computed, not kept
    assert len(memo) == 1
