"""A streaming codec's padded widths are few, whatever its chunks' lengths.

On a CPU, oneDNN compiles a primitive per conv input shape (batch rows x width) and keeps up to 1,024 of them,
with the reorders around each conv: ~20 primitives per (batch, width) on the tiny code2wav (ONEDNN_VERBOSE). With a
width per chunk length up to 16 frames and eight per octave above, the widths outnumbered that cache, and a codec
process grew for as long as rare lengths kept coming (the soak's code2wav +7% after ten minutes' warm-up; a
pipeline driver's +4.5% from its 1,000th request to its 3,000th, +2.1% with these widths and flat from the
1,500th).
"""

from __future__ import annotations

from omnistage.models.codec_conv_stream import MIN_BUCKET_FRAMES, bucket_frames

ONEDNN_CACHE = 1024  # oneDNN's default primitive cache capacity (ONEDNN_PRIMITIVE_CACHE_CAPACITY)
PRIMITIVES_PER_SHAPE = 20  # convs and reorders per (batch, width) of the tiny code2wav, counted with ONEDNN_VERBOSE
CPU_MAX_BATCH = 2  # a codec stage's chunks a step on a CPU (its preset's default)


def test_widths_are_few_and_pad_by_at_most_a_quarter() -> None:
    widths = {bucket_frames(n) for n in range(1, 1025)}
    assert len(widths) <= 29
    for n in range(1, 1025):
        assert n <= bucket_frames(n) <= max(MIN_BUCKET_FRAMES, n * 5 // 4 + 1)
        assert bucket_frames(bucket_frames(n)) == bucket_frames(n)


def test_the_shapes_of_chunks_up_to_128_frames_fit_onednn_primitive_cache() -> None:
    widths = {bucket_frames(n) for n in range(1, 129)}
    assert len(widths) * CPU_MAX_BATCH * PRIMITIVES_PER_SHAPE <= ONEDNN_CACHE
