"""Qwen2.5-Omni's token2wav in chunks: the talker → token2wav edge sends a chunk before the talker is done (counted,
not timed), the token2wav worker decodes the edge's chunks, and the joined chunks equal the whole decode (same
seed, so the same noise) within WAV_ATOL; without the vocoder's context the joins are audible (the tolerance can
fail)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from omnistage.config.pipeline import load_pipeline
from omnistage.core import Modality, OmniRequest
from omnistage.families.base import EdgeContext
from omnistage.families.qwen2_5_omni.edges import STREAM_PLAN, TalkerToToken2Wav
from omnistage.families.qwen2_5_omni.family import PRESET
from omnistage.families.qwen2_5_omni.payloads import Token2WavChunk
from omnistage.families.qwen2_5_omni.prompt import Qwen25OmniPrompt
from omnistage.families.qwen2_5_omni.voices import load_speakers
from omnistage.families.qwen2_5_omni.workers import Token2WavWorker
from omnistage.ipc.messages import StageInput
from omnistage.ipc.payloads import AudioChunk, CodecFrames
from omnistage.models.qwen2_5_omni.token2wav_stream import ChunkPlan, NoiseRows
from omnistage.sampling_params import SamplingParams
from omnistage.workers.base import WorkerSpec

SPEC = load_pipeline(PRESET)
# Chunks join where the window's context was cut; the tiny DiT's output near a cut moves by ~3e-8 (measured), the
# vocoder's joins with its context by as little; the waveform's amplitude is ~0.05.
WAV_ATOL = 1e-5
PLAN = ChunkPlan(chunk=24, past=24, future=24, vocoder=24)  # one DiT block each: several chunks from few codes
SEED = 3


def _edge(plan: ChunkPlan) -> TalkerToToken2Wav:
    request = OmniRequest("r", Qwen25OmniPrompt([1]), frozenset({Modality.AUDIO}), SamplingParams(seed=SEED),
                          voice="Ethan")
    return TalkerToToken2Wav(EdgeContext(request, SPEC.stage("token2wav")), plan)


def _stream(codes: torch.Tensor, plan: ChunkPlan) -> tuple[list[Token2WavChunk], int]:
    """The edge fed one code per talker output; the jobs and how many left before the talker's last output."""
    edge, jobs = _edge(plan), []
    for i in range(codes.numel()):
        jobs += edge.on_output(CodecFrames(codes[i:i + 1].view(1, 1)), False)
    early = len(jobs)
    return jobs + edge.on_output(CodecFrames(torch.empty(0, 1, dtype=torch.long)), True), early


def test_edge_sends_chunks_while_the_talker_speaks() -> None:
    codes = torch.arange(40)
    jobs, early = _stream(codes, PLAN)
    assert early == 2 and len(jobs) == 4  # 80 frames: chunks 0, 1 leave before the talker's end
    assert [j.index for j in jobs] == [0, 1, 2, 3] and [j.is_last for j in jobs] == [False] * 3 + [True]
    assert [(j.span.emit_start, j.span.emit_end) for j in jobs] == [(0, 24), (24, 48), (48, 72), (72, 80)]
    assert all(torch.equal(j.codes, codes[j.span.start:j.span.end]) for j in jobs)
    assert (jobs[1].span.start, jobs[1].span.end) == (0, 36)  # one block back, one ahead
    default, early = _stream(codes, STREAM_PLAN)
    assert early == 0 and len(default) == 1 and default[0].is_last  # 0.8 s: shorter than one default chunk


def test_noise_rows_are_one_draw_whatever_the_windows(omni25_dir: Path) -> None:
    from omnistage.models.qwen2_5_omni.token2wav import Token2Wav

    model = Token2Wav.from_checkpoint(omni25_dir)
    rows = NoiseRows(model, SEED)
    first = rows.get(24, 48).clone()
    last = rows.get(40, 300)  # drawn again, larger
    whole = model.noise(150, SEED)
    assert torch.equal(first, whole[:, 24:48]) and torch.equal(last, whole[:, 40:300])


@pytest.fixture(scope="module")
def worker(omni25_dir: Path) -> Token2WavWorker:
    return Token2WavWorker(WorkerSpec(str(omni25_dir), SPEC.stage("token2wav")))


def test_chunked_audio_equals_the_whole_decode(worker: Token2WavWorker, omni25_dir: Path) -> None:
    codes = torch.randint(0, 100, (30,), generator=torch.Generator().manual_seed(1))
    jobs, _ = _stream(codes, PLAN)
    for job in jobs:
        worker.handle(StageInput("r", job))
    outs = []
    while worker.has_work():
        outs += worker.step().outputs
    chunks = [o.payload for o in outs]
    assert all(isinstance(c, AudioChunk) for c in chunks) and [o.finished for o in outs] == [False, False, True]
    assert worker.request_ids() == []  # the noise let go with the last chunk
    voice = load_speakers(omni25_dir)["Ethan"]
    noise = worker.model.noise(codes.numel(), SEED)
    mel = worker.model.mel(codes, voice.cond, voice.ref_mel, noise)
    whole = worker.model.vocode(mel)
    joined = torch.cat([c.wav for c in chunks])
    torch.testing.assert_close(joined, whole, atol=WAV_ATOL, rtol=0)
    cut = torch.cat([worker.model.vocode(mel[:, :, a:a + 24]) for a in range(0, mel.shape[2], 24)])
    assert (cut - whole).abs().max().item() > 100 * WAV_ATOL  # no vocoder context: the joins are heard
