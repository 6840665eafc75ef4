"""Prefix caching of prompts with audio and images, on the tiny thinker behind its stage worker.

Each case runs the same prompts on a worker with prefix caching and on one
without: the cached run must skip the shared blocks (``num_cached_tokens``)
and still produce the same greedy tokens and the same accept-layer states at
multimodal rows (what the talker is fed), including a prompt whose cached
prefix ends inside an image (its uncached rows still get their deepstack part).
Items served whole from the cache are never encoded (``PromptMedia.encoded``),
also across a preemption that needs a skipped item again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch

from omnistage.config.pipeline import parse_pipeline
from omnistage.entrypoints.openai.realtime.conversation import PromptSpec
from omnistage.entrypoints.openai.realtime.conversation import render_prompt as render_spec
from omnistage.entrypoints.openai.realtime.items import Item
from omnistage.families.qwen3_omni.mm_spans import multimodal_spans
from omnistage.engine.request import MultimodalSpan
from omnistage.families.qwen3_omni.payloads import PromptHidden, ThinkerPrompt
from omnistage.families.qwen3_omni.stages import build_thinker_request
from omnistage.families.qwen3_omni.thinker_hook import ThinkerRequestData, ThinkerStepHook
from omnistage.families.qwen3_omni.workers import ThinkerWorker
from omnistage.ipc.messages import StageInput
from omnistage.ipc.payloads import TokenDelta
from omnistage.families.qwen3_omni.prompt import Qwen3OmniPrompt, Qwen3OmniPromptProcessor
from omnistage.sampling_params import SamplingParams
from omnistage.workers.base import WorkerSpec
from tests.entrypoints.test_realtime import spoken_like
from tests.runner.helpers import collect, config, make_engine
from tests.pipeline.specs import small_dict

INSTRUCTIONS = "You are a voice assistant."


@dataclass
class Run:
    tokens: list[int]
    mm_hidden: torch.Tensor | None
    num_cached: int
    encoded: list[int] = field(default_factory=list)  # the prompt's items the encoders ran on, in order
    items: tuple[MultimodalSpan, ...] = ()  # what PromptHidden passed on: the talker's cache keys


class Thinkers:
    """The tiny thinker twice: with prefix caching (the preset's) and without."""

    def __init__(self, tiny_dir: Path) -> None:
        self.processor = Qwen3OmniPromptProcessor.from_folder(tiny_dir)
        self.cached, self.uncached = (self._worker(tiny_dir, on) for on in (True, False))
        self.block_size = self.cached.engine.config.block_size
        self.count = 0

    @staticmethod
    def _worker(tiny_dir: Path, caching: bool) -> ThinkerWorker:
        data = small_dict()
        data["stages"][0]["engine"]["enable_prefix_caching"] = caching
        return ThinkerWorker(WorkerSpec(str(tiny_dir), parse_pipeline(data).stage("thinker")))

    def both(self, prompt: Qwen3OmniPrompt, for_talker: bool = True) -> tuple[Run, Run]:
        """The prompt on each worker, greedy; ``for_talker`` captures the states the talker reads."""
        self.count += 1
        return self._run(self.cached, prompt, for_talker), self._run(self.uncached, prompt, for_talker)

    def _run(self, worker: ThinkerWorker, prompt: Qwen3OmniPrompt, for_talker: bool) -> Run:
        rid = f"r{self.count}"
        sampling = SamplingParams(temperature=0.0, max_tokens=8, min_tokens=8)
        worker.handle(StageInput(rid, ThinkerPrompt(list(prompt.token_ids), sampling, prompt.mm,
                                                    capture_hidden=for_talker)))
        data = worker.requests[rid].stage_data
        assert isinstance(data, ThinkerRequestData) and data.media is not None
        run = Run([], None, -1, data.media.encoded)
        while True:
            for msg in worker.step().outputs:
                if isinstance(msg.payload, PromptHidden):
                    run.mm_hidden, run.items = msg.payload.mm_hidden, msg.payload.items
                    continue
                assert isinstance(msg.payload, TokenDelta)
                run.tokens += msg.payload.token_ids
                run.num_cached = msg.payload.num_cached_tokens
                if msg.finished:
                    return run


@pytest.fixture(scope="module")
def thinkers(tiny_dir: Path) -> Thinkers:
    return Thinkers(tiny_dir)


def _same(cached: Run, uncached: Run) -> None:
    assert uncached.num_cached == 0
    assert cached.tokens == uncached.tokens
    assert cached.mm_hidden is not None and uncached.mm_hidden is not None
    torch.testing.assert_close(cached.mm_hidden, uncached.mm_hidden, rtol=1e-5, atol=1e-5)
    # The thinker's items go on to the talker (its prefix-cache keys), one per multimodal row group, hit or not.
    assert cached.items == uncached.items and sum(s.end - s.start for s in cached.items) == len(cached.mm_hidden)


def test_spoken_turn_two_reuses_turn_one_with_the_same_output(thinkers: Thinkers) -> None:
    block = thinkers.block_size
    turns = [Turn("u1", "user", audio=spoken_like(1.0, 16000, seed=21))]
    first = render_prompt(thinkers.processor, INSTRUCTIONS, turns)
    one, one_off = thinkers.both(first)
    _same(one, one_off)
    reply = thinkers.processor.tokenizer.decode(one.tokens, skip_special_tokens=True)
    turns += [Turn("a1", "assistant", text=reply), Turn("u2", "user", audio=spoken_like(1.3, 16000, seed=22))]
    second = render_prompt(thinkers.processor, INSTRUCTIONS, turns)
    assert second.token_ids[:len(first.token_ids)] == first.token_ids
    two, two_off = thinkers.both(second)
    _same(two, two_off)
    audio_one = multimodal_spans(first.token_ids, first.mm, thinkers.cached.model.mrope_tokens)[0]
    assert two.num_cached >= len(first.token_ids) // block * block >= audio_one.end  # turn 1's audio skipped
    assert two.encoded == [1] and two_off.encoded == [0, 1]  # ... and never encoded


def test_a_spoken_prompt_aborted_before_its_first_output_leaves_nothing_behind(thinkers: Thinkers) -> None:
    worker = thinkers.cached
    prompt = render_prompt(thinkers.processor, INSTRUCTIONS, [Turn("u1", "user", text="hello")])
    worker.handle(StageInput("gone", ThinkerPrompt(list(prompt.token_ids), SamplingParams(max_tokens=4), prompt.mm,
                                                   capture_hidden=True)))
    assert "gone" in worker.awaiting_hidden
    worker.abort(["gone"])
    assert "gone" not in worker.awaiting_hidden and "gone" not in worker.requests


def test_blocks_of_a_text_reply_turn_still_feed_a_spoken_reply(thinkers: Thinkers) -> None:
    """Turn 1 answered in text only (no states captured), turn 2 with speech: the talker's rows for turn 1's
    audio come from the hidden-state cache, and equal a run that prefilled everything."""
    turns = [Turn("u1", "user", audio=spoken_like(1.2, 16000, seed=41))]
    first = render_prompt(thinkers.processor, INSTRUCTIONS, turns)
    text_only, _ = thinkers.both(first, for_talker=False)
    assert text_only.mm_hidden is None
    turns += [Turn("a1", "assistant", text="Sure."), Turn("u2", "user", text="Say it aloud.")]
    spoken, spoken_off = thinkers.both(render_prompt(thinkers.processor, INSTRUCTIONS, turns))
    _same(spoken, spoken_off)
    assert spoken.num_cached >= len(first.token_ids) // thinkers.block_size * thinkers.block_size


def test_a_different_audio_with_the_same_ids_is_not_a_hit(thinkers: Thinkers) -> None:
    block = thinkers.block_size
    prompts = [render_prompt(thinkers.processor, INSTRUCTIONS, [Turn("u", "user", audio=spoken_like(1.0, 16000, s))])
               for s in (31, 32)]
    assert prompts[0].token_ids == prompts[1].token_ids
    span = multimodal_spans(prompts[0].token_ids, prompts[0].mm, thinkers.cached.model.mrope_tokens)[0]
    thinkers.both(prompts[0])
    again, again_off = thinkers.both(prompts[1])
    _same(again, again_off)
    assert again.num_cached == span.start // block * block  # only the text before the audio


def test_a_prefix_that_ends_inside_an_image_resumes_with_its_deepstack_rows(thinkers: Thinkers) -> None:
    from PIL import Image

    block = thinkers.block_size
    pixels = (np.random.default_rng(5).random((128, 160, 3)) * 255).astype(np.uint8)
    image = Image.fromarray(pixels)

    def prompt(question: str) -> Qwen3OmniPrompt:
        messages = [{"role": "system", "content": INSTRUCTIONS},
                    {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
        return thinkers.processor.process(thinkers.processor.apply_chat_template(messages), images=[image])

    first, second = prompt("What is in this picture?"), prompt("Which colours do you see?")
    span = multimodal_spans(second.token_ids, second.mm, thinkers.cached.model.mrope_tokens)[0]
    thinkers.both(first)
    hit, hit_off = thinkers.both(second)
    _same(hit, hit_off)
    # The questions differ right after the image: the hit stops at the last block boundary inside it.
    assert hit.num_cached == (span.end + 1) // block * block and span.start < hit.num_cached < span.end


def test_a_session_encodes_only_audios_not_served_by_the_cache(thinkers: Thinkers) -> None:
    """Three spoken turns: with prefix caching a turn encodes exactly the audios with a row past its cache hit
    (its new one, and the previous turn's when that audio's last block holds reply tokens that do not re-tokenise
    the same); turn 1's audio is never encoded again. Without, every turn encodes every audio."""
    turns: list[Turn] = []
    for i in range(3):
        turns.append(Turn(f"u{i}", "user", audio=spoken_like(0.8 + 0.3 * i, 16000, seed=60 + i)))
        prompt = render_prompt(thinkers.processor, INSTRUCTIONS, turns)
        cached, uncached = thinkers.both(prompt)
        _same(cached, uncached)
        spans = multimodal_spans(prompt.token_ids, prompt.mm, thinkers.cached.model.mrope_tokens)
        assert sorted(cached.encoded) == [j for j, span in enumerate(spans) if span.end > cached.num_cached]
        assert i in cached.encoded and (i < 2 or 0 not in cached.encoded)
        assert sorted(uncached.encoded) == list(range(i + 1))
        reply = thinkers.processor.tokenizer.decode(cached.tokens, skip_special_tokens=True)
        turns.append(Turn(f"a{i}", "assistant", text=reply))


def test_an_item_skipped_by_a_hit_is_encoded_when_a_preemption_needs_it(thinkers: Thinkers) -> None:
    """Turn 2 hits turn 1's blocks (its audio is not encoded), is preempted by two long requests that take the
    blocks, and recomputes from a shorter hit: turn 1's audio is encoded then, and the tokens are unchanged."""
    thinker, processor = thinkers.cached.model, thinkers.processor
    turns = [Turn("u1", "user", audio=spoken_like(1.0, 16000, seed=21))]
    first = render_prompt(processor, INSTRUCTIONS, turns)
    turns += [Turn("a1", "assistant", text="Fine."), Turn("u2", "user", audio=spoken_like(1.3, 16000, seed=22))]
    second = render_prompt(processor, INSTRUCTIONS, turns)
    others = [render_prompt(processor, "Other.", [Turn("u", "user", audio=spoken_like(2.0, 16000, seed=s))])
              for s in (51, 52)]
    short, long = (SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in (8, 40))

    def requests() -> list:
        return [build_thinker_request(thinker, rid, prompt.token_ids, prompt.mm, params, None)
                for rid, prompt, params in (("c", others[0], long), ("d", others[1], long), ("b", second, short))]

    alone = {}
    for request in requests():
        engine = make_engine(thinker, config(num_blocks=64, enable_prefix_caching=False), ThinkerStepHook())
        engine.add_request(request)
        alone.update(collect(engine.run_until_done()))

    engine = make_engine(thinker, config(num_blocks=44, max_num_batched_tokens=16, max_num_seqs=4),
                         ThinkerStepHook())
    engine.add_request(build_thinker_request(thinker, "a", first.token_ids, first.mm, short, None))
    engine.run_until_done()
    c, d, b = requests()
    engine.add_request(c)
    engine.add_request(d)
    outputs = [out for _ in range(6) for out in engine.step()]  # c and d admitted first: b is the one preempted
    engine.add_request(b)
    outputs += engine.run_until_done()
    assert collect(outputs) == alone
    audio_one = multimodal_spans(first.token_ids, first.mm, thinker.mrope_tokens)[0]
    assert b.num_cached_tokens >= audio_one.end and b.num_preemptions > 0
    assert isinstance(b.stage_data, ThinkerRequestData) and b.stage_data.media is not None
    assert b.stage_data.media.encoded == [1, 0]  # turn 2's audio at admission, turn 1's after the preemption


def Turn(item_id: str, role: str, text: str = "", audio=None) -> Item:  # noqa: ANN001, N802 - a user turn's shape
    return Item(item_id, "message", role=role, text=text, audio=audio)


def render_prompt(processor, instructions: str, turns: list[Item]):  # noqa: ANN001, ANN201
    return render_spec(processor, PromptSpec(instructions, tuple(turns)))
