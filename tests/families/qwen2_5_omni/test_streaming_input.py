"""Streaming input on Qwen2.5-Omni's thinker: a turn prefilled chunk by chunk while it is spoken (the audio
encoder's 2 s conv chunks, frozen by the processor's listener) serves the turn's spoken reply from the prefix
cache, with the same greedy tokens, log-probabilities and captured rows for the talker as the same prompt
prefilled whole without a cache; and a next turn's prompt finds the whole earlier turn cached.

On the tiny thinker behind its stage worker (the preset's engine, prefix caching on; the uncached worker the
same with it off). Cached rows are computed in other chunks, so float sums run in another order: 1e-4.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from omnistage.config.pipeline import parse_pipeline
from omnistage.entrypoints.openai.realtime.conversation import PromptSpec, render_prompt
from omnistage.entrypoints.openai.realtime.items import Item
from omnistage.families.qwen2_5_omni.family import FAMILY, PRESET
from omnistage.families.qwen2_5_omni.payloads import ReplyHidden, ThinkerPrompt
from omnistage.families.qwen2_5_omni.prompt import Qwen25OmniPrompt, Qwen25OmniPromptProcessor
from omnistage.families.qwen2_5_omni.voices import SYSTEM_PROMPT
from omnistage.families.qwen2_5_omni.workers import ThinkerWorker
from omnistage.ipc.messages import StageInput
from omnistage.ipc.payloads import TokenDelta
from omnistage.processing.listened_audio import ListenedAudio
from omnistage.sampling_params import SamplingParams
from omnistage.workers.base import WorkerSpec
from tests.entrypoints.speech_sample import speech
from tests.entrypoints.test_realtime import spoken_like

RATE = 16000
CHUNK_ROWS = 50  # a 2 s conv chunk's thinker rows
ATOL = 1e-4


@dataclass
class Run:
    tokens: list[int] = field(default_factory=list)
    top: list[tuple[tuple[int, float], ...]] = field(default_factory=list)
    rows: list[torch.Tensor] = field(default_factory=list)
    num_cached: int = -1


class Worker:
    def __init__(self, folder: Path, caching: bool, **engine: object) -> None:
        data = yaml.safe_load(PRESET.read_text())
        data["stages"][0]["engine"].update({"num_kv_blocks": 64, "enable_prefix_caching": caching, **engine})
        self.worker = ThinkerWorker(WorkerSpec(str(folder), parse_pipeline(data).stage("thinker")))
        self.count = 0

    def run(self, prompt: Qwen25OmniPrompt, max_tokens: int = 4, capture: bool = True) -> Run:
        self.count += 1
        rid = f"r{self.count}"
        sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens, min_tokens=max_tokens, logprobs=5)
        self.worker.handle(StageInput(rid, ThinkerPrompt(list(prompt.token_ids), sampling, prompt.mm,
                                                         capture_hidden=capture)))
        run = Run()
        while True:
            for msg in self.worker.step().outputs:
                if isinstance(msg.payload, ReplyHidden):
                    run.rows.append(msg.payload.rows)
                    continue
                assert isinstance(msg.payload, TokenDelta)
                run.tokens += msg.payload.token_ids
                run.top += [lp.top for lp in msg.payload.logprobs or ()]
                run.num_cached = msg.payload.num_cached_tokens
                if msg.finished:
                    return run


@pytest.fixture(scope="module")
def setup(omni25_dir: Path) -> tuple[Qwen25OmniPromptProcessor, Worker, Worker]:
    processor = FAMILY.front_end(omni25_dir, FAMILY.load_config(omni25_dir)).processor
    return processor, Worker(omni25_dir, True), Worker(omni25_dir, False)


@pytest.fixture(scope="module")
def spoken() -> np.ndarray:
    """A little over 5 s of espeak-ng speech: two whole chunks and a tail."""
    samples, _ = speech("The weather today is sunny with a light breeze, and tomorrow it will rain.", RATE)
    n = int(5.3 * RATE)
    return samples[:n] if len(samples) >= n else np.pad(samples, (0, n - len(samples)))


def listen(processor: Qwen25OmniPromptProcessor, audio: np.ndarray) -> list[ListenedAudio]:
    """The audio fed in 100 ms pieces as a microphone would; its cut at each chunk as the chunk completed."""
    mel = processor.listener()
    assert mel is not None and mel.window_samples == 2 * RATE
    cuts = []
    for end in range(1600, len(audio) + 1600, 1600):
        if mel.advance(audio[:end]):
            head = mel.head()
            cuts.append(ListenedAudio(audio[:head.shape[1] * 160], head))
    return cuts


def prompt_of(processor: Qwen25OmniPromptProcessor, earlier: tuple[Item, ...],
              audio: np.ndarray | ListenedAudio) -> Qwen25OmniPrompt:
    samples = audio.samples if isinstance(audio, ListenedAudio) else audio
    live = Item("live", "message", role="user", audio=samples,
                listened=audio if isinstance(audio, ListenedAudio) else None)
    return render_prompt(processor, PromptSpec(SYSTEM_PROMPT, (*earlier, live)))


def same_run(cached: Run, whole: Run) -> None:
    assert cached.tokens == whole.tokens
    for a, b in zip(cached.top, whole.top, strict=True):
        assert [t for t, _ in a] == [t for t, _ in b]
        torch.testing.assert_close(torch.tensor([p for _, p in a]), torch.tensor([p for _, p in b]),
                                   rtol=0, atol=ATOL)
    torch.testing.assert_close(torch.cat(cached.rows), torch.cat(whole.rows), rtol=0, atol=ATOL)


def test_a_turn_prefilled_while_spoken_serves_its_spoken_reply(setup, spoken: np.ndarray) -> None:
    processor, cached, uncached = setup
    cuts = listen(processor, spoken)
    assert len(cuts) == 2
    for cut in cuts:  # what the session sends while the user speaks: one token each, no rows for a talker
        cached.run(prompt_of(processor, (), cut), max_tokens=1, capture=False)
    prompt = prompt_of(processor, (), ListenedAudio(spoken, cuts[-1].head))
    streamed, whole = cached.run(prompt), uncached.run(prompt)
    same_run(streamed, whole)
    assert torch.cat(streamed.rows).shape[0] == prompt.num_tokens + 3  # every prompt row, then the fed replies
    pads = [i for i, t in enumerate(prompt.token_ids) if t == processor.audio_token_id]
    assert streamed.num_cached >= (pads[0] + 2 * CHUNK_ROWS) // 16 * 16 > pads[0]  # both chunks came cached


def test_the_next_turn_finds_the_spoken_turn_cached(setup, spoken: np.ndarray) -> None:
    processor, cached, uncached = setup
    first_audio = spoken[:int(2.5 * RATE)] * 0.9  # samples no other test prefilled
    first = prompt_of(processor, (), first_audio)
    reply = processor.tokenizer.decode(cached.run(first).tokens, skip_special_tokens=True)
    earlier = (Item("u1", "message", role="user", audio=first_audio),
               Item("a1", "message", role="assistant", text=reply))
    second = prompt_of(processor, earlier, spoken[int(2.5 * RATE):])
    two, whole = cached.run(second), uncached.run(second)
    same_run(two, whole)
    assert two.num_cached >= len(first.token_ids) // 16 * 16 > 0


def test_the_kept_rows_cover_a_pool_sized_from_a_memory_budget(omni25_dir: Path, setup, spoken: np.ndarray) -> None:
    """``kv_cache_memory`` sizes the pool past the configured blocks (hundreds of tiny blocks in 2 MiB, not 8),
    counting each slot's kept row in the budget: every slot of it keeps its row, and a prompt over the configured
    blocks is served from the cache whole."""
    processor = setup[0]
    worker = Worker(omni25_dir, True, num_kv_blocks=8, kv_cache_memory="2MiB")
    runner = worker.worker.engine.runner
    row_bytes = worker.worker.model.config.text_config.hidden_size * 4  # fp32 on a CPU
    assert runner.num_blocks == (2 << 20) // (runner.kv_block_bytes + 16 * row_bytes)
    prompt = prompt_of(processor, (), spoken * 0.8)
    assert prompt.num_tokens > 8 * 16
    first, again = worker.run(prompt), worker.run(prompt)
    same_run(again, first)
    assert again.num_cached == (prompt.num_tokens - 1) // 16 * 16


def test_a_listened_audio_keeps_its_frozen_frames(setup) -> None:
    """The frozen chunks go in front of the extractor's own frames for the rest: the same rows, and the chunks'
    values (so their keys) the ones the prefills had."""
    processor = setup[0]
    audio = spoken_like(9.0, RATE, seed=4)
    audio[int(4.2 * RATE):5 * RATE] *= 3.0  # louder after the chunks froze: the whole pass floors them higher
    cuts = listen(processor, audio)
    assert [c.head.shape[1] for c in cuts] == [200, 400, 600, 800]
    listened = processor.process([processor.audio_token_id], audios=[ListenedAudio(audio[:5 * RATE], cuts[1].head)])
    plain = processor.process([processor.audio_token_id], audios=[audio[:5 * RATE]])
    assert torch.equal(listened.mm.input_features[0, :, :400], cuts[1].head)
    assert not torch.equal(plain.mm.input_features[0, :, :400], cuts[1].head)  # what the keys would have missed
    assert torch.equal(listened.mm.input_features[0, :, 400:], plain.mm.input_features[0, :, 400:])
    assert listened.token_ids == plain.token_ids
    whole = processor.process([processor.audio_token_id], audios=[ListenedAudio(audio, cuts[-1].head)])
    assert torch.equal(whole.mm.input_features[0, :, :800], cuts[-1].head)
