"""Qwen2.5-Omni's token2wav on the generic codec stage: the generic chunker cuts a reply's codes into windows of
overlapping context (chunk 0 before the talker is done, sizes off the DiT's blocks), the token2wav worker decodes
chunks of two streams in one batch, each in its own voice and noise, and each stream's joined chunks equal its whole
decode (what verify holds exact against transformers) within WAV_ATOL; without the vocoder's context the joins are
audible (the tolerance can fail)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from omnistage.audio_spec import Streaming
from omnistage.config.pipeline import load_pipeline
from omnistage.engine.frame_chunker import ChunkPlan, FrameChunker
from omnistage.engine.generation_engine import ChunkJob, StreamVoice
from omnistage.families.qwen2_5_omni.family import FAMILY, PRESET
from omnistage.families.qwen2_5_omni.voices import load_speakers
from omnistage.families.qwen2_5_omni.workers import Token2WavWorker
from omnistage.ipc.messages import StageInput
from omnistage.ipc.payloads import AudioChunk
from omnistage.models.qwen2_5_omni.token2wav_stream import NoiseRows
from omnistage.workers.base import WorkerSpec

SPEC = load_pipeline(PRESET)
# Chunks join where the window's context was cut; the tiny DiT's output near a cut moves by ~4e-8 (measured), the
# vocoder's joins with its context by as little; the waveform's amplitude is ~0.05.
WAV_ATOL = 1e-5
STREAMS = {"a": ("Ethan", 3, 70), "b": ("Chelsie", 5, 53)}  # voice, seed, codes


def test_noise_rows_are_one_draw_whatever_the_windows(omni25_dir: Path) -> None:
    from omnistage.models.qwen2_5_omni.token2wav import Token2Wav

    model = Token2Wav.from_checkpoint(omni25_dir)
    rows = NoiseRows(model, 3)
    first = rows.get(24, 48).clone()
    last = rows.get(40, 300)  # drawn again, larger
    whole = model.noise(150, 3)
    assert torch.equal(first, whole[0, 24:48]) and torch.equal(last, whole[0, 40:300])


@pytest.fixture(scope="module")
def worker(omni25_dir: Path) -> Token2WavWorker:
    return Token2WavWorker(WorkerSpec(str(omni25_dir), SPEC.stage("token2wav")))


def _jobs(rid: str, codes: torch.Tensor, plan: ChunkPlan, voice: StreamVoice) -> tuple[list[ChunkJob], int]:
    """The talker's codes pushed one at a time; the jobs, and how many were cut before the talker's end."""
    chunker, jobs = FrameChunker(rid, plan, 1, voice=voice), []
    for code in codes:
        jobs += chunker.push(code.view(1, 1))
    return jobs + chunker.finish(), len(jobs)


def test_chunked_audio_equals_the_whole_decode(worker: Token2WavWorker, omni25_dir: Path) -> None:
    audio = FAMILY.front_end(omni25_dir, FAMILY.load_config(omni25_dir)).audio
    assert audio is not None and audio.streaming is Streaming.OVERLAP
    # 10 then 17 codes a chunk: windows whose cuts are not on the DiT's 12-code blocks
    plan = ChunkPlan(17, audio.past_frames, first_chunk_frames=10, lookahead=audio.lookahead_frames)
    codes, jobs = {}, {}
    for rid, (voice, seed, n) in STREAMS.items():
        codes[rid] = torch.randint(0, 100, (n,), generator=torch.Generator().manual_seed(seed))
        jobs[rid], early = _jobs(rid, codes[rid], plan, StreamVoice(voice, seed))
        assert early >= 1 and jobs[rid][0].voice == StreamVoice(voice, seed) and jobs[rid][1].voice is None
    assert [j.left_context for j in jobs["a"]] == [0, 10, 27, audio.past_frames]
    assert [j.lookahead for j in jobs["a"]] == [12, 12, 12, 0] and len(jobs["b"]) == 3
    for rid, job in sorted(((j.request_id, j) for js in jobs.values() for j in js), key=lambda p: p[1].chunk_index):
        worker.handle(StageInput(rid, job))
    wavs: dict[str, list[torch.Tensor]] = {"a": [], "b": []}
    batches = []
    while worker.has_work():
        outputs = worker.step().outputs
        batches.append(sorted(o.request_id for o in outputs))
        for out in outputs:
            assert isinstance(out.payload, AudioChunk)
            wavs[out.request_id].append(out.payload.wav)
    assert batches == [["a", "b"]] * 3 + [["a"]]  # both streams' chunks in one batch
    assert worker.request_ids() == [] and not worker.engine.runner.model.streams  # each stream let go
    speakers = load_speakers(omni25_dir)
    model = worker.engine.runner.model.model
    for rid, (voice, seed, n) in STREAMS.items():
        whole = model(codes[rid], speakers[voice].cond, speakers[voice].ref_mel, seed)
        joined = torch.cat(wavs[rid])
        assert joined.shape == whole.shape == (n * 480,)
        torch.testing.assert_close(joined, whole, atol=WAV_ATOL, rtol=0)


def test_without_vocoder_context_the_joins_are_heard(worker: Token2WavWorker, omni25_dir: Path) -> None:
    speaker = load_speakers(omni25_dir)["Ethan"]
    model = worker.engine.runner.model.model
    codes = torch.randint(0, 100, (30,), generator=torch.Generator().manual_seed(1))
    mel = model.mel(codes, speaker.cond, speaker.ref_mel, model.noise(30, 3))
    whole = model.vocode(mel)
    cut = torch.cat([model.vocode(mel[:, :, a:a + 24]) for a in range(0, mel.shape[2], 24)])
    assert (cut - whole).abs().max().item() > 100 * WAV_ATOL
