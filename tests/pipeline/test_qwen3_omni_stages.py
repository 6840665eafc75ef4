"""The stage glue: chunk jobs, the talker's text feed, and a streamed request equal to the offline one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from omnistage.engine import FinishReason, RequestOutput
from omnistage.engine.generation_engine import GenerationEngineCore
from omnistage.models.qwen3_omni.code2wav import chunk_spans
from omnistage.engine.frame_chunker import ChunkPlan, FrameChunker
from omnistage.families.qwen3_omni.offline import GenerationSettings, StageModels, generate_offline, join_chunks
from omnistage.families.qwen3_omni.stages import (
    TalkerTextFeed,
    build_talker_request,
    build_thinker_request,
    code2wav_runner,
    multimodal_hidden,
)
from omnistage.families.qwen3_omni.thinker_hook import ThinkerStepHook
from omnistage.models.qwen3_omni.inputs import PromptLayout
from omnistage.models.qwen3_omni.talker_prompt import TalkerProjections, TalkerPrompt, TrailingText
from omnistage.models.thinker_embedding import load_thinker_embedding
from omnistage.runner import TalkerRequestData, build_ar_engine
from omnistage.workers.talker import talker_frames

GROUPS = 4


def _frames(n: int, seed: int = 0, codebook: int = 64) -> torch.Tensor:
    return torch.randint(0, codebook, (n, GROUPS), generator=torch.Generator().manual_seed(seed))


def _push_in_pieces(chunker: FrameChunker, frames: torch.Tensor, sizes: list[int]) -> list:
    jobs, at = [], 0
    for size in sizes:
        jobs += chunker.push(frames[at:at + size])
        at += size
    return jobs + chunker.push(frames[at:]) + chunker.finish()


@pytest.mark.parametrize("total", [1, 7, 25, 40, 41])
def test_chunks_cut_as_transformers_chunked_decode(total: int) -> None:
    frames = _frames(total)
    jobs = _push_in_pieces(FrameChunker("r", ChunkPlan(chunk_frames=8, left_context=5), GROUPS), frames,
                           [3, 1, 9, 0, 2])
    spans = chunk_spans(total, 8, 5)
    assert [(j.chunk_index, j.left_context, j.is_last) for j in jobs] == [
        (i, ctx, i == len(spans) - 1) for i, (_, _, ctx) in enumerate(spans)]
    for job, (lo, hi, _) in zip(jobs, spans):
        assert torch.equal(job.codes, frames[lo:hi].T)


def test_smaller_first_chunk_then_full_ones() -> None:
    frames = _frames(23, seed=1)
    jobs = _push_in_pieces(FrameChunker("r", ChunkPlan(chunk_frames=8, left_context=6, first_chunk_frames=3),
                                        GROUPS), frames, [1] * 23)
    new = [j.codes.shape[1] - j.left_context for j in jobs]
    assert new == [3, 8, 8, 4] and [j.left_context for j in jobs] == [0, 3, 6, 6]
    assert torch.equal(torch.cat([j.codes[:, j.left_context:] for j in jobs], dim=1), frames.T)


def _output(frames: torch.Tensor, finished: bool, reason: FinishReason | None = None) -> RequestOutput:
    return RequestOutput("r", frames[:, 0].tolist(), finished, reason, new_frames=frames)


def _add(chunker: FrameChunker, output: RequestOutput) -> list:
    """A talker output's frames into the chunker, as the codec edge takes a talker worker's frames."""
    frames = talker_frames(output)
    jobs = chunker.push(frames) if frames is not None and len(frames) else []
    return jobs + chunker.finish() if output.finished else jobs


def test_talker_frames_drop_the_final_step_and_the_last_chunk_is_marked() -> None:
    frames = _frames(9, seed=2)  # 8 real frames (a whole number of chunks) + the final step's frame
    chunker = FrameChunker("r", ChunkPlan(chunk_frames=4, left_context=2), GROUPS)
    jobs = [job for i in range(9) for job in _add(chunker, _output(frames[i:i + 1], i == 8, FinishReason.STOP))]
    assert [j.is_last for j in jobs] == [False, True]
    assert torch.equal(torch.cat([j.codes[:, j.left_context:] for j in jobs], dim=1), frames[:8].T)


@pytest.fixture(scope="module")
def models(tiny_dir: Path) -> StageModels:
    return StageModels.load(tiny_dir, "cpu", torch.float32)


def _decode(models: StageModels, jobs: list, plan: ChunkPlan) -> torch.Tensor:
    engine = GenerationEngineCore(code2wav_runner(models.code2wav, plan))
    for job in jobs:
        engine.add_job(job)
    return join_chunks(engine.run_until_done())


def test_chunk_jobs_decode_like_chunked_decode_and_seamless_like_full(models: StageModels) -> None:
    frames = _frames(30, seed=3)
    vocoder = models.code2wav
    plan = ChunkPlan(chunk_frames=8, left_context=3)
    cut = _decode(models, _push_in_pieces(FrameChunker("r", plan, GROUPS), frames, [5, 5]), plan)
    torch.testing.assert_close(cut, vocoder.chunked_decode(frames.T[None], 8, 3)[0, 0], atol=1e-6, rtol=0)
    full = vocoder(frames.T[None])[0, 0]
    assert cut.numel() == full.numel() - 3 * vocoder.lookahead_samples  # transformers' hole per boundary
    seamless = ChunkPlan(chunk_frames=7, left_context=30, first_chunk_frames=4, seamless=True)
    joined = _decode(models, _push_in_pieces(FrameChunker("r", seamless, GROUPS), frames, [2] * 15), seamless)
    torch.testing.assert_close(joined, full, atol=1e-6, rtol=0)


def test_text_feed_hands_over_only_decided_rows() -> None:
    hidden = 3
    proj = TalkerProjections(thinker_embed=lambda ids: ids.float()[:, None].expand(-1, hidden),
                             text_projection=lambda x: x, hidden_projection=lambda x: x,
                             codec_embed=lambda ids: ids.float()[:, None].expand(-1, hidden))
    pad, eos = torch.full((hidden,), -1.0), torch.full((hidden,), -2.0)
    prompt = TalkerPrompt(embeds=torch.zeros(9, hidden), input_ids=[0] * 9, tts_pad_embed=pad, tts_eos_embed=eos)
    data = TalkerRequestData(tts_pad_embed=pad)
    feed = TalkerTextFeed(TrailingText(prompt, proj), data)
    feed.extend([10])
    feed.extend([11, 12])
    assert [float(r[0]) for r in data.trailing_text] == [11.0]  # token 12 may be the last: not fed back yet
    assert data.text_at(1) is None  # the talker waits
    feed.extend([13])
    feed.finish()
    assert [float(r[0]) for r in data.trailing_text] == [11.0, 12.0, -2.0]
    assert torch.equal(data.text_at(5), pad)


def test_thinker_embedding_alone_equals_the_thinker_table(models: StageModels, tiny_dir: Path) -> None:
    table = load_thinker_embedding(tiny_dir, "cpu", torch.float32)
    assert torch.equal(table.weight, models.thinker.decoder.embed_tokens.weight)


def _image_prompt(models: StageModels, tiny_dir: Path):  # noqa: ANN202
    from PIL import Image

    from omnistage.families.qwen3_omni.prompt import Qwen3OmniPromptProcessor

    proc = Qwen3OmniPromptProcessor.from_folder(tiny_dir)
    pixels = (np.random.RandomState(0).rand(64, 64, 3) * 255).astype(np.uint8)
    ids = proc.apply_chat_template([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi"}]}])
    return proc.process(ids, images=[Image.fromarray(pixels)])


def test_streamed_request_equals_offline(models: StageModels, tiny_dir: Path) -> None:
    """Thinker and talker stepped in lockstep, text fed token by token, frames chunked as they come."""
    prompt = _image_prompt(models, tiny_dir)
    settings = GenerationSettings(max_new_tokens=6, talker_max_new_tokens=12, talker_min_new_tokens=8)
    offline = generate_offline(models, prompt.token_ids, prompt.mm, settings)
    ctx = models.talker_context()
    thinker_req = build_thinker_request(models.thinker, "s", prompt.token_ids, prompt.mm, settings.thinker_params(),
                                        models.eos_token_id, for_talker=True)
    thinker = build_ar_engine(models.thinker, models.engine_config(200), ThinkerStepHook())
    talker = build_ar_engine(models.talker, models.engine_config(200), ctx.step_hook())
    thinker.add_request(thinker_req)
    chunker = FrameChunker("s", ChunkPlan(4, 2, first_chunk_frames=2), models.talker.num_code_groups)
    jobs, feed, request = [], None, None
    while thinker.has_unfinished_requests() or talker.has_unfinished_requests():
        for out in thinker.step():
            new = out.new_token_ids
            if feed is None:  # the first token: the talker can start
                mm_hidden = multimodal_hidden(thinker_req, ctx.token_ids.multimodal)
                request, feed = build_talker_request(ctx, "s", PromptLayout.of(prompt.token_ids, prompt.mm), mm_hidden, new[0],
                                                     settings.talker_params(), settings.speaker)
                talker.add_request(request)
                new = new[1:]
            feed.extend(new)
            if out.finished:
                feed.finish()
        jobs += [job for out in talker.step() for job in _add(chunker, out)]
    assert request.prompt_positions[:, -1].tolist() != [request.num_prompt_tokens - 1] * 3  # image grid layout
    assert thinker_req.output_token_ids == offline.tokens
    assert torch.equal(torch.cat([j.codes[:, j.left_context:] for j in jobs], dim=1), offline.codes)
    assert jobs[-1].is_last and offline.codes.shape == (models.talker.num_code_groups, 11)
