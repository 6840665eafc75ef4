"""The tiny checkpoint's talker and code2wav under their engines: batching changes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from omnistage.engine import Request
from omnistage.engine.generation_engine import ChunkJob, GenerationEngineCore
from omnistage.runner import GenerationRunner, TalkerRequestData, TalkerStepHook
from omnistage.runner.talker_hook import talker_suppress_mask
from omnistage.sampling_params import SamplingParams
from tests.runner.helpers import config, make_engine


@pytest.fixture(scope="module")
def talker(tiny_dir: Path):
    from omnistage.models.qwen3_omni.talker import Talker

    return Talker.from_checkpoint(tiny_dir, "cpu", torch.float32)


def _talker_request(rid: str, talker, prompt_len: int, text_len: int, params: SamplingParams) -> Request:
    gen = torch.Generator().manual_seed(prompt_len * 100 + text_len)
    hidden = talker.config.text_config.hidden_size
    data = TalkerRequestData(tts_pad_embed=torch.randn(hidden, generator=gen) * 0.1)
    data.add_text(torch.randn(text_len, hidden, generator=gen) * 0.1)
    data.finish_text()
    return Request(rid, None, params, prompt_embeds=torch.randn(prompt_len, hidden, generator=gen) * 0.1,
                   eos_token_id=talker.config.codec_eos_token_id, stage_data=data)


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True),
    SamplingParams(temperature=0.9, top_k=50, repetition_penalty=1.05, seed=11, max_tokens=10, ignore_eos=True),
], ids=["greedy", "seeded"])
def test_talker_frames_batched_equal_alone(talker, params: SamplingParams) -> None:
    vocab = talker.config.text_config.vocab_size
    mask = talker_suppress_mask(vocab, talker.config.codec_eos_token_id)
    shapes = [(8, 4), (3, 0), (12, 9), (6, 2)]

    def frames(reqs: list[Request]) -> dict[str, torch.Tensor]:
        engine = make_engine(talker, config(block_size=8), TalkerStepHook(talker, mask))
        for r in reqs:
            engine.add_request(r)
        out: dict[str, list[torch.Tensor]] = {}
        for o in engine.run_until_done():
            out.setdefault(o.request_id, []).append(o.new_frames)
        return {rid: torch.cat(f) for rid, f in out.items()}

    together = frames([_talker_request(f"t{i}", talker, p, t, params) for i, (p, t) in enumerate(shapes)])
    for i, (p, t) in enumerate(shapes):
        alone = frames([_talker_request("x", talker, p, t, params)])["x"]
        assert alone.shape == (10, talker.num_code_groups)
        assert torch.equal(together[f"t{i}"], alone), f"talker request {i} changed when batched"
        code0 = alone[:, 0]  # codebook-0 codes or codec EOS (ignored here); other specials are suppressed
        assert bool(((code0 < vocab - 1024) | (code0 == talker.config.codec_eos_token_id)).all())


def test_code2wav_engine_batches_mixed_chunks(tiny_dir: Path) -> None:
    from omnistage.models.qwen3_omni.code2wav import load_code2wav
    from omnistage.models.qwen3_omni.config import Qwen3OmniConfig

    vocoder = load_code2wav(tiny_dir, Qwen3OmniConfig.from_folder(tiny_dir).code2wav, "cpu", torch.float32)
    groups, codebook = vocoder.config.num_quantizers, vocoder.config.codebook_size
    gen = torch.Generator().manual_seed(0)
    jobs = [ChunkJob("a", 0, torch.randint(0, codebook, (groups, 6), generator=gen), 0),
            ChunkJob("a", 1, torch.randint(0, codebook, (groups, 8), generator=gen), 3),
            ChunkJob("b", 0, torch.randint(0, codebook, (groups, 4), generator=gen), 0, is_last=True),
            ChunkJob("c", 0, torch.randint(0, codebook, (groups, 6), generator=gen), 0)]
    core = GenerationEngineCore(GenerationRunner(vocoder))
    for job in jobs:
        core.add_job(job)
    first = core.step()
    assert [(o.request_id, o.chunk_index) for o in first] == [("a", 0), ("b", 0), ("c", 0)]
    outputs = first + core.run_until_done()
    for job, out in zip(sorted(jobs, key=lambda j: (j.request_id, j.chunk_index)),
                        sorted(outputs, key=lambda o: (o.request_id, o.chunk_index))):
        alone = vocoder.decode_chunk(job.codes[None], job.left_context)[0]
        torch.testing.assert_close(out.wav, alone, atol=1e-5, rtol=1e-4)


class _ShapeLog:
    """The tiny vocoder, recording each call's code shape (what oneDNN compiles a primitive for)."""

    def __init__(self, vocoder) -> None:
        self.vocoder, self.shapes = vocoder, []
        self.samples_per_frame = vocoder.samples_per_frame

    def decode_chunk(self, codes, left_context):
        self.shapes.append(tuple(codes.shape))
        return self.vocoder.decode_chunk(codes, left_context)

    def decode_rows(self, codes, lengths, left_contexts):
        self.shapes.append(tuple(codes.shape))
        return self.vocoder.decode_rows(codes, lengths, left_contexts)


def test_code2wav_calls_are_bucketed_and_equal_unpadded(tiny_dir: Path) -> None:
    from omnistage.models.qwen3_omni.code2wav import load_code2wav
    from omnistage.models.qwen3_omni.config import Qwen3OmniConfig

    vocoder = load_code2wav(tiny_dir, Qwen3OmniConfig.from_folder(tiny_dir).code2wav, "cpu", torch.float32)
    logged = _ShapeLog(vocoder)
    runner = GenerationRunner(logged)
    groups, codebook = vocoder.config.num_quantizers, vocoder.config.codebook_size
    gen = torch.Generator().manual_seed(1)
    for length, context in [(9, 0), (19, 3), (16, 2), (35, 25)]:
        chunks = [torch.randint(0, codebook, (groups, length), generator=gen) for _ in range(2)]
        wavs = runner.run(chunks, [context, context])
        for chunk, wav in zip(chunks, wavs):  # right-padding a causal decoder leaves each row's samples
            torch.testing.assert_close(wav, vocoder.decode_chunk(chunk[None], context)[0], atol=1e-5, rtol=1e-4)
    assert [shape[-1] for shape in logged.shapes] == [10, 20, 16, 40]
