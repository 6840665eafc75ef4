"""Streaming input: a turn prefilled window by window while it is spoken equals the whole-utterance prefill.

On the tiny thinker behind its stage worker (prefix caching on, as the preset
has it), the prefill requests a realtime session sends while the user speaks
(one per completed 8 s encoder window, one token each) are run first, then the
turn's response prompt: it must be served from the cache up to the last
completed window and give the same greedy tokens and the same log-probabilities
(atol 1e-4: a cached prefix is computed in other chunks, so float sums run in
another order) and the same accept-layer states for the talker as the same prompt
prefilled whole on a worker without a cache. Cases: shorter than one window,
exactly one window (no lookahead past it yet: nothing streamed), one window and
a 2-frame tail, several windows and a tail. An aborted prefill frees every block;
a second turn prefills only what is new, and a short one finds its history cached
by the prefill sent at its speech start.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from omnistage.config.pipeline import parse_pipeline
from omnistage.entrypoints.openai.realtime.conversation import PromptSpec, render_prompt
from omnistage.entrypoints.openai.realtime.items import Item
from omnistage.families.qwen3_omni.payloads import PromptHidden, ThinkerPrompt
from omnistage.families.qwen3_omni.prompt import Qwen3OmniPrompt, Qwen3OmniPromptProcessor
from omnistage.families.qwen3_omni.workers import ThinkerWorker
from omnistage.ipc.messages import StageInput
from omnistage.ipc.payloads import TokenDelta
from omnistage.processing.listened_audio import ListenedAudio, WindowedLogMel, log_mel
from omnistage.sampling_params import SamplingParams
from omnistage.workers.base import WorkerSpec
from tests.entrypoints.test_realtime import spoken_like
from tests.pipeline.specs import small_dict

RATE = 16000
WINDOW = 128000  # 800 mel frames of 160 samples: the tiny and real AuT's attention window (n_window_infer)
LOGPROB_ATOL = 1e-4


@dataclass
class Run:
    tokens: list[int]
    top: list[tuple[tuple[int, float], ...]]
    mm_hidden: torch.Tensor | None
    num_cached: int


class Worker:
    def __init__(self, folder: Path, caching: bool, chunk: int | None = None) -> None:
        data = small_dict()
        data["stages"][0]["engine"]["enable_prefix_caching"] = caching
        if chunk is not None:  # prefill in chunks of this many tokens
            data["stages"][0]["engine"]["max_num_batched_tokens"] = chunk
        self.worker = ThinkerWorker(WorkerSpec(str(folder), parse_pipeline(data).stage("thinker")))
        self.count = 0

    @property
    def kv(self):  # noqa: ANN201 - KVCacheManager
        return self.worker.engine.scheduler.kv

    def submit(self, prompt: Qwen3OmniPrompt, max_tokens: int, for_talker: bool) -> str:
        self.count += 1
        rid = f"r{self.count}"
        sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens, min_tokens=max_tokens, logprobs=5)
        self.worker.handle(StageInput(rid, ThinkerPrompt(list(prompt.token_ids), sampling, prompt.mm,
                                                         capture_hidden=for_talker)))
        return rid

    def run(self, prompt: Qwen3OmniPrompt, max_tokens: int = 6, for_talker: bool = True) -> Run:
        self.submit(prompt, max_tokens, for_talker)
        run = Run([], [], None, -1)
        while True:
            for msg in self.worker.step().outputs:
                if isinstance(msg.payload, PromptHidden):
                    run.mm_hidden = msg.payload.mm_hidden
                    continue
                assert isinstance(msg.payload, TokenDelta)
                run.tokens += msg.payload.token_ids
                run.top += [lp.top for lp in msg.payload.logprobs or ()]
                run.num_cached = msg.payload.num_cached_tokens
                if msg.finished:
                    return run


@pytest.fixture(scope="module")
def setup(tiny_dir: Path) -> tuple[Qwen3OmniPromptProcessor, Worker, Worker]:
    return Qwen3OmniPromptProcessor.from_folder(tiny_dir), Worker(tiny_dir, True), Worker(tiny_dir, False)


def listen(processor: Qwen3OmniPromptProcessor, audio: np.ndarray) -> tuple[WindowedLogMel, list[ListenedAudio]]:
    """Feeds the audio in 100 ms pieces as a microphone would; the cut audio of each window as it completed."""
    mel = processor.listener()
    assert mel is not None and mel.window_samples == WINDOW
    cuts = []
    for end in range(1600, len(audio) + 1600, 1600):
        if mel.advance(audio[:end]):
            head = mel.head()
            cuts.append(ListenedAudio(audio[:head.shape[1] * 160], head))
    return mel, cuts


def prompt_of(processor: Qwen3OmniPromptProcessor, earlier: tuple[Item, ...],
              audio: np.ndarray | ListenedAudio) -> Qwen3OmniPrompt:
    samples = audio.samples if isinstance(audio, ListenedAudio) else audio
    live = Item("live", "message", role="user", audio=samples,
                listened=audio if isinstance(audio, ListenedAudio) else None)
    return render_prompt(processor, PromptSpec("You are a voice assistant.", (*earlier, live)))


def same_run(streamed: Run, whole: Run) -> None:
    assert streamed.tokens == whole.tokens
    for a, b in zip(streamed.top, whole.top, strict=True):
        assert [t for t, _ in a] == [t for t, _ in b]
        torch.testing.assert_close(torch.tensor([lp for _, lp in a]), torch.tensor([lp for _, lp in b]),
                                   rtol=0, atol=LOGPROB_ATOL)
    assert streamed.mm_hidden is not None and whole.mm_hidden is not None
    torch.testing.assert_close(streamed.mm_hidden, whole.mm_hidden, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("seconds", "windows"), [(5.0, 0), (8.0, 0), (8.025, 1), (17.3, 2)],
                         ids=["under-one-window", "exactly-one-window", "one-window-and-a-tail", "windows-and-tail"])
def test_streamed_window_prefill_equals_the_whole_utterance(setup, seconds: float, windows: int) -> None:
    processor, cached, uncached = setup
    audio = spoken_like(seconds, RATE, seed=int(seconds * 10))
    mel, cuts = listen(processor, audio)
    assert len(cuts) == windows
    for cut in cuts:  # what the session sends while the user speaks: one token each, text only
        cached.run(prompt_of(processor, (), cut), max_tokens=1, for_talker=False)
    final = ListenedAudio(audio, mel.head()) if windows else audio
    prompt = prompt_of(processor, (), final)
    streamed, whole = cached.run(prompt), uncached.run(prompt)
    same_run(streamed, whole)
    if windows:  # the cache served the conversation and every completed window: only the tail was prefilled
        pads = [i for i, t in enumerate(prompt.token_ids) if t == processor.audio_token_id]
        last_window_row = pads[0] + 104 * windows
        assert streamed.num_cached >= last_window_row // 16 * 16 > pads[0]


def test_frozen_windows_match_the_whole_clip_within_the_floor_bound(setup) -> None:
    """Whisper's floor (clip max - 8) is non-causal: a window frozen before a louder moment keeps a lower floor.
    Values above the whole clip's floor are the whole pass's (1e-5); below it they differ by at most
    (peak - the running peak when their window froze) / 4: the first window's own peak is the lowest."""
    processor = setup[0]
    audio = spoken_like(17.3, RATE, seed=5)
    audio[-3 * RATE:] *= 3.0  # the loudest moment comes after the frozen windows
    mel, _ = listen(processor, audio)
    head = mel.head()
    whole = processor.process([processor.audio_token_id], audios=[audio]).mm.input_features[0][:, :head.shape[1]]
    raw = log_mel(processor.features, audio)
    peak = float(raw.max())
    assert peak > mel.peak  # the case that matters: the floor moved after the windows froze
    above = raw[:, :head.shape[1]] >= peak - 8.0
    torch.testing.assert_close(head[above], whole[above], rtol=0, atol=1e-5)
    first_peak = float(raw[:, :800].max())
    assert 0 < float((head - whole).abs().max()) <= (peak - first_peak) / 4 + 1e-5


def test_an_aborted_prefill_frees_every_block(setup, tiny_dir: Path) -> None:
    """A cleared buffer or a VAD false start cancels the prefill in flight: every block it took is free again."""
    processor = setup[0]
    cached = Worker(tiny_dir, True, chunk=32)
    _, cuts = listen(processor, spoken_like(8.1, RATE, seed=7))
    free = cached.kv.num_free_blocks
    rid = cached.submit(prompt_of(processor, (), cuts[0]), 1, for_talker=False)
    cached.worker.step()  # one 32-token chunk of its prefill computed (its blocks cached as they fill)
    assert 0 < len(cached.kv.block_ids(rid)) < len(cuts[0].samples) // 160 // 8 // 16
    assert cached.kv.num_free_blocks < free
    cached.worker.abort([rid])
    assert cached.kv.block_ids(rid) == [] and cached.kv.num_free_blocks == free


def test_turn_two_prefills_only_what_is_new(setup) -> None:
    """Turn 1 (streamed, one window) and its reply stay cached: turn 2 prefills its own audio and little else."""
    processor, cached, uncached = setup
    audio = spoken_like(8.5, RATE, seed=11)
    mel, cuts = listen(processor, audio)
    for cut in cuts:
        cached.run(prompt_of(processor, (), cut), max_tokens=1, for_talker=False)
    one_audio = ListenedAudio(audio, mel.head())
    first = prompt_of(processor, (), one_audio)
    one = cached.run(first)
    reply = processor.tokenizer.decode(one.tokens, skip_special_tokens=True)
    earlier = (Item("u1", "message", role="user", audio=audio, listened=one_audio),
               Item("a1", "message", role="assistant", text=reply))
    second = prompt_of(processor, earlier, spoken_like(1.2, RATE, seed=12))
    two, two_whole = cached.run(second), uncached.run(second)
    same_run(two, two_whole)
    new = len(second.token_ids) - len(first.token_ids)
    assert two.num_cached >= len(first.token_ids) // 16 * 16  # turn 1 (its audio and its prompt) was not redone
    assert len(second.token_ids) - two.num_cached <= new + 16


def test_the_speech_start_prefill_caches_the_history(tiny_dir: Path, setup) -> None:
    """A short turn 2 (no window completes): the prefill sent at its speech start (the conversation and the new
    turn's header, its message text-only) leaves turn 1's reply in the cache, so turn 2's response prefills
    little more than its own audio, with the same tokens and log-probabilities as the whole prefill."""
    processor, _, uncached = setup
    cached = Worker(tiny_dir, True)  # its own cache: nothing another test left there
    audio = spoken_like(1.5, RATE, seed=31)
    first = prompt_of(processor, (), audio)
    reply = processor.tokenizer.decode(cached.run(first, max_tokens=24).tokens, skip_special_tokens=True)
    earlier = (Item("u1", "message", role="user", audio=audio), Item("a1", "message", role="assistant", text=reply))
    header = render_prompt(processor, PromptSpec("You are a voice assistant.",
                                                 (*earlier, Item("live", "message", role="user"))))
    cached.run(header, max_tokens=1, for_talker=False)
    second = prompt_of(processor, earlier, spoken_like(1.2, RATE, seed=32))
    pads = [i for i, t in enumerate(second.token_ids) if t == processor.audio_token_id]
    turn_two = next(p for p, q in zip(pads[1:], pads) if p != q + 1)
    assert turn_two // 16 > len(first.token_ids) // 16  # the reply fills blocks turn 1's prompt did not
    two, whole = cached.run(second), uncached.run(second)
    same_run(two, whole)
    assert two.num_cached >= (turn_two - 1) // 16 * 16  # everything before the new turn's audio, block by block
