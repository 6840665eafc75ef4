"""Streamed decoding keeps each stream's transformer window and last outputs, so chunks join into the whole
decode whatever their boundaries (the tiny checkpoint's pre-transformer has a 72-frame window, far past the
few frames of context a chunk carries)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from omnistage.models.codec_conv_stream import StreamedConvs
from omnistage.models.qwen3_omni.code2wav import Code2Wav, load_code2wav
from omnistage.models.qwen3_omni.code2wav_stream import StreamingCode2Wav
from omnistage.models.qwen3_omni.config import Qwen3OmniConfig

# fp32 samples of order 0.1: whole vs chunked run other shapes (rounding only); a chunk decoded without the
# stream's history differs by ~1e-2 (tested below), four orders above this.
TOL = {"atol": 1e-5, "rtol": 1e-4}


@pytest.fixture(scope="module")
def model(tiny_dir: Path) -> Code2Wav:
    return load_code2wav(tiny_dir, Qwen3OmniConfig.from_folder(tiny_dir).code2wav)


def _codes(frames: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 64, (4, frames), generator=torch.Generator().manual_seed(seed))


def _stream(vocoder: StreamingCode2Wav, sid: str, codes: torch.Tensor, sizes: list[int], context: int) -> torch.Tensor:
    """Cuts ``codes`` into chunks of ``sizes`` new frames, each with up to ``context`` frames of left context."""
    pieces, start = [], 0
    for index, size in enumerate(sizes):
        ctx = min(context, start)
        end = start + size
        (wav,) = vocoder.decode_streams([sid], [index], [codes[:, start - ctx:end]], [ctx], [end == codes.shape[1]])
        pieces.append(wav)
        start = end
    return torch.cat(pieces)


@pytest.mark.parametrize("sizes", [[90], [4, 25, 25, 25, 11], [1, 2, 3, 84], [30, 30, 30], [10, 13, 7, 60]])
def test_any_chunk_boundaries_join_into_the_whole_decode(model: Code2Wav, sizes: list[int]) -> None:
    codes = _codes(sum(sizes), seed=len(sizes))
    whole = model(codes[None])[0, 0]
    streamed = _stream(StreamingCode2Wav(model), "s", codes, sizes, context=4)
    assert streamed.shape == whole.shape
    torch.testing.assert_close(streamed, whole, **TOL)


def test_stateless_chunks_differ_where_the_stream_keeps_history(model: Code2Wav) -> None:
    """The case the state exists for: seamless stateless chunks with 4 frames of context are approximate."""
    codes = _codes(90, seed=7)
    whole = model(codes[None])[0, 0]
    spf, la = model.samples_per_frame, model.lookahead_samples
    second = model.decode_chunk(codes[None, :, 26:60], 4, seamless=True)[0]
    assert (second - whole[30 * spf - la:60 * spf - la]).abs().max() > 1e-3


def test_streams_are_independent_and_batched_rows_equal_alone(model: Code2Wav) -> None:
    a, b = _codes(40, seed=1), _codes(30, seed=2)
    alone = {sid: _stream(StreamingCode2Wav(model), sid, c, [10, 30 if sid == "a" else 20], 4)
             for sid, c in (("a", a), ("b", b))}
    vocoder = StreamingCode2Wav(model)
    first = vocoder.decode_streams(["a", "b"], [0, 0], [a[:, :10], b[:, :10]], [0, 0], [False, False])
    second = vocoder.decode_streams(["b", "a"], [1, 1], [b[:, 6:30], a[:, 6:40]], [4, 4], [True, True])
    torch.testing.assert_close(torch.cat([first[0], second[1]]), alone["a"], **TOL)
    torch.testing.assert_close(torch.cat([first[1], second[0]]), alone["b"], **TOL)
    assert vocoder.streams == {}  # both ended: nothing kept


def test_out_of_order_or_unknown_chunks_are_errors_and_drop_frees(model: Code2Wav) -> None:
    vocoder = StreamingCode2Wav(model)
    with pytest.raises(ValueError, match="no state"):
        vocoder.decode_streams(["x"], [1], [_codes(5, 0)], [0], [False])
    vocoder.decode_streams(["x"], [0], [_codes(5, 0)], [0], [False])
    with pytest.raises(ValueError, match="was due"):
        vocoder.decode_streams(["x"], [2], [_codes(5, 0)], [0], [False])
    vocoder.drop("x")
    assert "x" not in vocoder.streams


def test_a_stream_keeps_a_bounded_state_and_convs_read_only_new_frames(model: Code2Wav) -> None:
    """Each conv keeps its kernel's reach, not the stream: the kept inputs stay the same size from chunk to chunk,
    and one-frame chunks (shorter than several convs' reach at their rate) still join into the whole decode."""
    codes = _codes(24, seed=5)
    vocoder = StreamingCode2Wav(model)
    sizes = []
    for i in range(24):
        vocoder.decode_streams(["s"], [i], [codes[:, i:i + 1]], [0], [False])
        sizes.append(sum(t.numel() for t in vocoder.streams["s"].convs.tensors))
    assert len(set(sizes)) == 1 and sizes[0] > 0
    whole = model(codes[None])[0, 0]
    torch.testing.assert_close(_stream(StreamingCode2Wav(model), "t", codes, [1] * 24, context=4), whole, **TOL)


def test_a_decoder_with_a_layer_it_cannot_stream_is_refused_up_front() -> None:
    with pytest.raises(TypeError, match="no streamed form for Conv1d"):
        StreamedConvs([], [nn.Conv1d(2, 2, 3)])


class _WidthLog(StreamedConvs):
    def __init__(self, model: Code2Wav) -> None:
        super().__init__(model.upsample, model.decoder)
        self.widths: list[int] = []

    def run(self, hidden, lengths, tails):
        self.widths.append(hidden.shape[-1])
        return super().run(hidden, lengths, tails)


def test_conv_batches_are_bucketed_widths_and_still_join(model: Code2Wav) -> None:
    """Chunks of 19, 35 and 9 new frames are convolved 20, 40 and 10 wide (oneDNN keeps a primitive per width), and
    the padding changes no sample."""
    codes = _codes(19 + 35 + 9, seed=3)
    vocoder = StreamingCode2Wav(model)
    vocoder.convs = _WidthLog(model)
    streamed = _stream(vocoder, "s", codes, [19, 35, 9], context=4)
    assert vocoder.convs.widths == [20, 40, 10]
    torch.testing.assert_close(streamed, model(codes[None])[0, 0], **TOL)
