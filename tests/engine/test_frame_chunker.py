"""The frame chunker's generic parts: frames of any width, a delay pattern aligned, look-ahead frames for a decoder
that is not causal, sizes that wait for an order, the stream's voice on its first chunk."""

from __future__ import annotations

import pytest
import torch

from omnistage.audio_spec import AudioSpec, Codebooks, Latent, Streaming
from omnistage.engine.frame_chunker import ChunkPlan, FrameChunker, Undelay
from omnistage.engine.generation_engine import ChunkJob, StreamVoice


def _delayed(frames: torch.Tensor, delays: tuple[int, ...]) -> torch.Tensor:
    """What a talker under a delay pattern emits: codebook k's value for frame t at row t + delays[k] (rows before
    a codebook's first frame, and after its last, hold a pad)."""
    n, width = frames.shape
    rows = torch.full((n + max(delays), width), -1, dtype=frames.dtype)
    for k, d in enumerate(delays):
        rows[d:d + n, k] = frames[:, k]
    return rows


@pytest.mark.parametrize("pieces", [[1] * 14, [5, 9], [14]])
def test_a_delay_pattern_comes_out_aligned_whatever_the_pieces(pieces: list[int]) -> None:
    delays = (1, 2, 3, 4)
    frames = torch.arange(40).reshape(10, 4)
    rows = _delayed(frames, delays)
    undelay, out, at = Undelay(delays), [], 0
    for size in pieces:
        out.append(undelay.push(rows[at:at + size]))
        at += size
    assert torch.equal(torch.cat(out), frames)  # the staircase's tail rows complete the last frames exactly


def test_chunks_of_delayed_frames_hold_whole_frames() -> None:
    delays = (0, 1, 2)
    frames = torch.arange(30).reshape(10, 3)
    chunker = FrameChunker("r", ChunkPlan(chunk_frames=4, left_context=0, first_chunk_frames=2), 3, delays=delays)
    jobs = [job for row in _delayed(frames, delays) for job in chunker.push(row[None])] + chunker.finish()
    decoded = torch.cat([job.codes[:, job.left_context:] for job in jobs], dim=1)
    assert torch.equal(decoded.T, frames) and [j.new_frames for j in jobs] == [2, 4, 4]


def test_look_ahead_frames_are_read_but_not_returned() -> None:
    plan = ChunkPlan(chunk_frames=3, left_context=2, first_chunk_frames=2, lookahead=2)
    chunker = FrameChunker("r", plan, 1)
    frames = torch.arange(12).reshape(12, 1)
    jobs = []
    for k in range(12):
        cut = chunker.push(frames[k:k + 1])
        # A chunk of n new frames is cut only once its look-ahead and one more frame exist.
        assert all(k + 1 > j.left_context + j.new_frames + plan.lookahead for j in cut)
        jobs += cut
    jobs += chunker.finish()
    new = torch.cat([j.codes[0, j.left_context:j.left_context + j.new_frames] for j in jobs])
    assert torch.equal(new, frames[:, 0])
    assert all(j.lookahead == 2 for j in jobs[:-1]) and jobs[-1].lookahead == 0 and jobs[-1].is_last
    assert [j.codes.shape[1] - j.left_context - j.new_frames for j in jobs[:-1]] == [2] * (len(jobs) - 1)


def test_a_streams_voice_goes_with_its_first_chunk() -> None:
    voice = StreamVoice("Ethan", 7)
    chunker = FrameChunker("r", ChunkPlan(chunk_frames=2, left_context=1, first_chunk_frames=2), 1, voice=voice)
    jobs = chunker.push(torch.arange(6).reshape(6, 1)) + chunker.finish()
    assert [j.voice for j in jobs] == [voice, None, None]


def test_a_chunk_waits_for_its_size_and_latents_keep_their_values() -> None:
    class Orders:
        size_of: dict[int, int] = {0: 2}

        def size(self, index: int, pending: int) -> int | None:
            return self.size_of.get(index)

    orders = Orders()
    chunker = FrameChunker("r", ChunkPlan(8, 0), 2, sizer=orders, dtype=torch.float32)
    latents = torch.randn(6, 2)
    assert [j.new_frames for j in chunker.push(latents[:5])] == [2]  # chunk 1 has no size yet
    orders.size_of[1] = 2
    jobs = chunker.cut()
    assert [j.new_frames for j in jobs] == [2] and jobs[0].codes.dtype == torch.float32
    torch.testing.assert_close(jobs[0].codes.T, latents[2:4], rtol=0, atol=0)


def test_a_job_must_keep_a_new_frame() -> None:
    with pytest.raises(ValueError, match="keep a new frame"):
        ChunkJob("r", 0, torch.zeros(2, 4, dtype=torch.long), 1, discard_frames=1, lookahead=2)


def test_an_audio_spec_states_its_timing() -> None:
    spec = AudioSpec(44100, 5880, Codebooks(8, 1024, delays=tuple(range(1, 9))), Streaming.OVERLAP, 4, 2)
    assert spec.frame_rate == 7.5 and spec.frame_s == pytest.approx(1 / 7.5) and spec.frame_width == 8
    assert spec.frames_in(1.0) == 7 and spec.seconds(44100) == 1.0
    assert AudioSpec(24000, 1920, Latent(32)).frame_width == 32
    with pytest.raises(ValueError, match="no context"):
        AudioSpec(24000, 1920, Latent(32), past_frames=2)
    with pytest.raises(ValueError, match="one non-negative delay"):
        Codebooks(4, 1024, delays=(1, 2))
