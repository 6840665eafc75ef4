"""Streamed 12 Hz decoding equals one whole decode, whatever the chunk boundaries."""

from __future__ import annotations

import pytest
import torch

from omnistage.models.qwen3_tts.codec_stream import StreamingCodecDecoder

# Summation order differs between a chunk and the whole utterance (attention over a kept window, convs over a
# shorter input): equal up to float32 rounding.
TOL = {"atol": 1e-5, "rtol": 0.0}


def _stream(decoder: StreamingCodecDecoder, codes: torch.Tensor, sizes: list[int], stream: str = "s") -> torch.Tensor:
    pieces, start = [], 0
    for index, size in enumerate(sizes):
        last = index == len(sizes) - 1
        pieces.append(decoder.decode(stream, index, codes[:, start:start + size], last=last))
        start += size
    assert start == codes.shape[1]
    return torch.cat(pieces)


@pytest.mark.parametrize("sizes", [[90], [1] * 5 + [85], [7, 30, 1, 52], [45, 45], [71, 1, 1, 17]])
def test_joined_chunks_equal_the_whole_decode(tts_models, probe_codes, sizes):
    model = tts_models["custom_voice"].codec_decoder
    whole = model(probe_codes[None])[0, 0]
    streamed = _stream(StreamingCodecDecoder(model), probe_codes, sizes)
    assert streamed.shape == whole.shape == (90 * 1920,)
    torch.testing.assert_close(streamed, whole, **TOL)


def test_streams_batched_in_one_call_equal_each_alone(tts_models, probe_codes):
    model = tts_models["custom_voice"].codec_decoder
    alone = [_stream(StreamingCodecDecoder(model), probe_codes[:, :n], [n // 2, n - n // 2]) for n in (20, 33)]
    decoder = StreamingCodecDecoder(model)
    first = decoder.decode_streams(["a", "b"], [0, 0], [probe_codes[:, :10], probe_codes[:, :16]], [0, 0],
                                   [False, False])
    # Second chunks carry left context frames, as a chunk planner sends them: the state already holds them.
    second = decoder.decode_streams(["a", "b"], [1, 1], [probe_codes[:, 8:20], probe_codes[:, 16:33]], [2, 0],
                                    [True, True])
    for i in range(2):
        torch.testing.assert_close(torch.cat([first[i], second[i]]), alone[i], **TOL)
    assert decoder.streams == {}  # the last chunks freed their streams


def test_chunks_out_of_order_are_refused(tts_models, probe_codes):
    decoder = StreamingCodecDecoder(tts_models["custom_voice"].codec_decoder)
    with pytest.raises(ValueError, match="no state"):
        decoder.decode("s", 1, probe_codes[:, :4])
    decoder.decode("s", 0, probe_codes[:, :4])
    with pytest.raises(ValueError, match="chunk 2 arrived"):
        decoder.decode("s", 2, probe_codes[:, 4:8])


def test_bad_codes_are_refused(tts_models):
    model = tts_models["custom_voice"].codec_decoder
    with pytest.raises(ValueError, match="codes must lie"):
        model(torch.full((1, 4, 3), 64))
    with pytest.raises(ValueError, match="integer"):
        model(torch.zeros(1, 3, 3, dtype=torch.long))
