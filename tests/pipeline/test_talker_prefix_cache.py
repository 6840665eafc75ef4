"""The talker's prefix cache: rows keyed by the thinker prefix they come from, reused across turns, equal to a
recompute."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch

from omnistage.engine import EngineConfig, Request
from omnistage.engine.request import MultimodalSpan
from omnistage.families.qwen3_omni.offline import StageModels
from omnistage.families.qwen3_omni.prompt import Qwen3OmniPrompt, Qwen3OmniPromptProcessor
from omnistage.families.qwen3_omni.stages import TalkerTextFeed, build_talker_request, build_thinker_request, \
    multimodal_hidden
from omnistage.families.qwen3_omni.talker_cache_keys import talker_row_keys
from omnistage.families.qwen3_omni.thinker_hook import ThinkerStepHook
from omnistage.models.qwen3_omni.inputs import PromptLayout
from omnistage.runner import build_ar_engine
from omnistage.sampling_params import SamplingParams

BLOCK = 16
MM = frozenset({7})


def _digest(tag: bytes) -> bytes:
    return hashlib.sha256(tag).digest()


# Keys alone -------------------------------------------------------------------------------------------------------

def _keys(ids: list[int], items: list[MultimodalSpan], user: list[int], head: tuple[int, ...] = (1, 2)):
    return talker_row_keys(ids, user, len(user) + 3, items, MM, head)


def test_rows_share_keys_exactly_while_the_thinker_prefix_behind_them_agrees() -> None:
    # thinker: 0 1 [7 7 7] 2 | 3 4 [7 7] 5 ; the talker reads positions 1..5 and 7..10
    ids = [0, 1, 7, 7, 7, 2, 3, 4, 7, 7, 5]
    items = [MultimodalSpan(2, 5, _digest(b"a")), MultimodalSpan(8, 10, _digest(b"b"))]
    user = [1, 2, 3, 4, 5, 7, 8, 9, 10]
    keys = _keys(ids, items, user)
    assert keys is not None and (keys[0].start, keys[-1].end) == (0, len(user) + 3)
    assert all(a.end == b.start for a, b in zip(keys, keys[1:]))  # every row in exactly one span
    # The assistant-side text between the turns (position 6) changes: the second turn's rows change, not the first's.
    other = _keys([0, 1, 7, 7, 7, 2, 9, 4, 7, 7, 5], items, user)
    assert other[:3] == keys[:3] and all(a != b for a, b in zip(other[3:], keys[3:]))
    # The second audio changes: only its rows and what follows.
    changed = _keys(ids, [items[0], MultimodalSpan(8, 10, _digest(b"c"))], user)
    assert changed[:4] == keys[:4] and all(a != b for a, b in zip(changed[4:], keys[4:]))
    # Another first reply token or voice: only the assistant head.
    voice = _keys(ids, items, user, head=(1, 3))
    assert voice[:-1] == keys[:-1] and voice[-1] != keys[-1]


def test_the_same_prefix_cut_shorter_keys_its_rows_alike() -> None:
    """A streaming-input prefill (the turn cut at a window) keys the rows it shares with the whole turn alike."""
    whole_ids, cut_ids = [0, 7, 7, 7, 7, 2, 3], [0, 7, 7, 2, 3]
    first = MultimodalSpan(1, 3, _digest(b"w1"))
    whole = _keys(whole_ids, [first, MultimodalSpan(3, 5, _digest(b"w2"))], [0, 1, 2, 3, 4, 5])
    cut = _keys(cut_ids, [first], [0, 1, 2, 3])
    assert cut[:2] == whole[:2] and cut[2] != whole[2]


def test_interleaved_items_key_each_row_by_a_prefix_reaching_past_every_item_it_lies_in() -> None:
    # audio in video: the video's rows (1-2, 5) around the audio's (3-4), both items spanning their rows' range
    ids = [0, 7, 7, 7, 7, 7, 1]
    items = [MultimodalSpan(1, 6, _digest(b"video")), MultimodalSpan(3, 5, _digest(b"audio"))]
    keys = _keys(ids, items, list(range(7)))
    assert keys is not None and sum(k.end - k.start for k in keys) == 7 + 3
    changed = _keys(ids, [items[0], MultimodalSpan(3, 5, _digest(b"other"))], list(range(7)))
    assert changed[0] == keys[0] and all(a != b for a, b in zip(changed[1:], keys[1:]))


def test_multimodal_rows_outside_every_item_get_no_keys() -> None:
    assert _keys([0, 7, 7, 1], [MultimodalSpan(1, 2, _digest(b"a"))], [0, 1, 2, 3]) is None


def test_an_embedding_prompt_without_ids_needs_spans_over_every_row() -> None:
    embeds = torch.zeros(4, 2)
    with pytest.raises(ValueError, match="cover all 4 rows"):
        Request("r", None, SamplingParams(), prompt_embeds=embeds, mm_spans=(MultimodalSpan(0, 3, _digest(b"a")),))
    request = Request("r", None, SamplingParams(), prompt_embeds=embeds,
                      mm_spans=(MultimodalSpan(0, 2, _digest(b"a")), MultimodalSpan(2, 4, _digest(b"b"))))
    assert request.prefix_cacheable and request.num_keyed_tokens == 4
    request.output_token_ids.append(5)
    assert request.num_keyed_tokens == 4  # its generated rows are whole frames: never keyed by their ids


# Engines -------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def models(tiny_dir: Path) -> StageModels:
    return StageModels.load(tiny_dir, "cpu", torch.float32)


@pytest.fixture(scope="module")
def processor(tiny_dir: Path) -> Qwen3OmniPromptProcessor:
    return Qwen3OmniPromptProcessor.from_folder(tiny_dir)


def _audio(seed: int, seconds: float = 1.5) -> np.ndarray:
    return (np.random.RandomState(seed).randn(int(16000 * seconds)) * 0.1).astype(np.float32)


def _conversation(processor: Qwen3OmniPromptProcessor, audios: list[np.ndarray], replies: list[str]) -> Qwen3OmniPrompt:
    messages: list[dict[str, object]] = []
    for i, _ in enumerate(audios):
        messages.append({"role": "user", "content": [{"type": "audio"}]})
        if i < len(replies):
            messages.append({"role": "assistant", "content": replies[i]})
    return processor.process(processor.apply_chat_template(messages), audios=audios)


def _config(models: StageModels, caching: bool) -> EngineConfig:
    return EngineConfig(block_size=BLOCK, num_blocks=96, max_num_seqs=2, max_num_batched_tokens=1024,
                        max_model_len=1024, device="cpu", dtype=models.dtype, enforce_eager=True,
                        enable_prefix_caching=caching)


class _Talker:
    """One talker engine, and the thinker engine that gives it its starts."""

    def __init__(self, models: StageModels, caching: bool) -> None:
        self.models, self.ctx = models, models.talker_context()
        self.thinker = build_ar_engine(models.thinker, _config(models, True), ThinkerStepHook())
        self.engine = build_ar_engine(models.talker, _config(models, caching), self.ctx.step_hook())

    def start(self, rid: str, prompt: Qwen3OmniPrompt, keyed: bool = True) -> tuple[Request, TalkerTextFeed]:
        thinker_req = build_thinker_request(self.models.thinker, rid, prompt.token_ids, prompt.mm,
                                            SamplingParams(temperature=0.0, max_tokens=1), None, for_talker=True)
        self.thinker.add_request(thinker_req)
        self.thinker.run_until_done()
        hidden = multimodal_hidden(thinker_req, self.ctx.token_ids.multimodal)
        items = (thinker_req.mm_spans or ()) if keyed else ()
        return build_talker_request(self.ctx, rid, PromptLayout.of(prompt.token_ids, prompt.mm), hidden,
                                    thinker_req.output_token_ids[0], SamplingParams(temperature=0.0, max_tokens=1,
                                                                                    logprobs=5), "ethan", items)

    def first_step(self, rid: str, prompt: Qwen3OmniPrompt, keyed: bool = True) -> tuple[Request, tuple]:
        request, feed = self.start(rid, prompt, keyed)
        feed.finish()
        self.engine.add_request(request)
        outputs = [o for o in self.engine.run_until_done() if o.request_id == rid]
        return request, tuple(lp for o in outputs for lp in (o.logprobs or ()))


def test_a_later_turn_reuses_the_earlier_turns_rows_and_equals_a_recompute(models: StageModels,
                                                                           processor: Qwen3OmniPromptProcessor) -> None:
    turn1 = _conversation(processor, [_audio(1)], [])
    turn2 = _conversation(processor, [_audio(1), _audio(2)], ["Sure, here it is."])
    cached = _Talker(models, caching=True)
    first, _ = cached.first_step("t1", turn1)
    assert first.num_cached_tokens == 0
    second, logprobs = cached.first_step("t2", turn2)
    user_rows_of_turn1 = first.num_prompt_tokens - 9  # the 9 rows of the assistant head
    assert second.num_cached_tokens == user_rows_of_turn1 // BLOCK * BLOCK > 0
    alone, expected = _Talker(models, caching=False).first_step("t2", turn2)
    assert alone.num_cached_tokens <= 0 and len(logprobs) == len(expected) == 1
    (got,), (want,) = logprobs, expected
    assert got.token_id == want.token_id and [t for t, _ in got.top] == [t for t, _ in want.top]
    torch.testing.assert_close(torch.tensor([p for _, p in got.top]), torch.tensor([p for _, p in want.top]),
                               atol=1e-4, rtol=0)  # fp32, the same rows prefilled in two chunks instead of one


def test_another_first_audio_or_no_items_shares_nothing(models: StageModels,
                                                        processor: Qwen3OmniPromptProcessor) -> None:
    talker = _Talker(models, caching=True)
    talker.first_step("a", _conversation(processor, [_audio(1)], []))
    other, _ = talker.first_step("b", _conversation(processor, [_audio(3), _audio(2)], ["Sure, here it is."]))
    assert other.num_cached_tokens == 0
    unkeyed, _ = talker.first_step("c", _conversation(processor, [_audio(1), _audio(2)], ["Sure, here it is."]),
                                   keyed=False)
    assert not unkeyed.prefix_cacheable and unkeyed.num_cached_tokens <= 0
