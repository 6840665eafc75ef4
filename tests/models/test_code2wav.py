"""Our Code2Wav against transformers' on the tiny checkpoint: full, chunked, batched and padded decoding."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from omnistage.models.codec_transformer import Code2WavConfig
from omnistage.models.qwen3_omni.code2wav import Code2Wav, chunk_spans, load_code2wav
from omnistage.models.qwen3_omni.config import Qwen3OmniConfig

TOL = 1e-5  # fp32 parity bound with transformers
ROW_TOL = 1e-6  # batch size changes CPU kernel blocking, so rows agree to rounding, not bit for bit


@pytest.fixture(scope="module")
def ours(tiny_dir: Path) -> Code2Wav:
    return load_code2wav(tiny_dir, Qwen3OmniConfig.from_folder(tiny_dir).code2wav)


@pytest.fixture(scope="module")
def theirs(tiny_dir: Path) -> torch.nn.Module:
    from transformers import Qwen3OmniMoeForConditionalGeneration

    return Qwen3OmniMoeForConditionalGeneration.from_pretrained(tiny_dir).code2wav.eval()


def _codes(batch: int, frames: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 64, (batch, 4, frames), generator=generator)


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape
    return (a - b).abs().max().item()


@torch.no_grad()
def test_forward_matches_transformers(ours: Code2Wav, theirs: torch.nn.Module) -> None:
    codes = _codes(2, 50)
    wav = ours(codes)
    assert wav.shape == (2, 1, ours.num_samples(50)) == (2, 1, 50 * 1920 - 555)
    assert wav.abs().max() > 1e-2  # the tiny vocoder is audible, so the bound below means something
    assert _max_diff(wav, theirs(codes)) <= TOL


@pytest.mark.parametrize(("chunk_size", "left_context"), [(30, 25), (17, 5), (16, 40)])
@torch.no_grad()
def test_chunks_concatenate_to_transformers_chunked_decode(
    ours: Code2Wav, theirs: torch.nn.Module, chunk_size: int, left_context: int
) -> None:
    codes = _codes(1, 64, seed=1)
    spans = chunk_spans(64, chunk_size, left_context)
    pieces = [ours.decode_chunk(codes[..., lo:hi], ctx) for lo, hi, ctx in spans]
    for piece, (lo, hi, ctx) in zip(pieces, spans):
        assert piece.shape == (1, ours.num_samples(hi - lo - ctx))
    reference = theirs.chunked_decode(codes, chunk_size=chunk_size, left_context_size=left_context)
    assert _max_diff(torch.cat(pieces, dim=-1).unsqueeze(1), reference) <= TOL
    assert _max_diff(ours.chunked_decode(codes, chunk_size, left_context), reference) <= TOL


@torch.no_grad()
def test_chunks_with_enough_context_equal_full_decoding(ours: Code2Wav) -> None:
    """Context covering the receptive field (2 layers x 71 frames + ~6 of convs) reproduces full decoding.

    transformers' cut leaves a ``lookahead_samples`` hole at each boundary (the
    previous chunk's last 555 samples needed this chunk's first frame, and this
    chunk drops them as context); ``seamless`` keeps them and joins gaplessly.
    """
    frames, chunk, context = 260, 80, 160
    codes = _codes(1, frames, seed=2)
    full = ours(codes)[0, 0]
    spans = chunk_spans(frames, chunk, context)
    cut = torch.cat([ours.decode_chunk(codes[..., lo:hi], ctx)[0] for lo, hi, ctx in spans])
    seamless = torch.cat([ours.decode_chunk(codes[..., lo:hi], ctx, seamless=True)[0] for lo, hi, ctx in spans])
    assert _max_diff(seamless, full) <= ROW_TOL
    keep = torch.ones_like(full, dtype=torch.bool)
    for _, hi, _ in spans[:-1]:
        keep[hi * 1920 - ours.lookahead_samples : hi * 1920] = False
    assert _max_diff(cut, full[keep]) <= ROW_TOL


@torch.no_grad()
def test_batch_rows_equal_single_rows(ours: Code2Wav) -> None:
    codes = _codes(3, 30, seed=3)
    batched = ours.decode_chunk(codes, left_context=10)
    for row in range(3):
        assert _max_diff(batched[row], ours.decode_chunk(codes[row : row + 1], left_context=10)[0]) <= ROW_TOL


@torch.no_grad()
def test_right_padded_rows_keep_their_samples(ours: Code2Wav) -> None:
    lengths, contexts = [30, 12, 21], [10, 0, 5]
    real = _codes(3, 30, seed=4)
    padded = real.clone()
    for row, n in enumerate(lengths):
        padded[row, :, n:] = _codes(1, 30 - n, seed=10 + row)[0]  # arbitrary codes in the pad frames
    rows = ours.decode_rows(padded, lengths, contexts, seamless=True)
    for row, (n, ctx) in enumerate(zip(lengths, contexts)):
        alone = ours.decode_chunk(real[row : row + 1, :, :n], ctx, seamless=True)[0]
        assert _max_diff(rows[row], alone) <= ROW_TOL


def test_config_from_dict_and_transformers_object(tiny_dir: Path, theirs: torch.nn.Module) -> None:
    raw = json.loads((tiny_dir / "config.json").read_text())["code2wav_config"]
    config = Code2WavConfig.from_hf(raw)
    assert config == Code2WavConfig.from_hf(theirs.config)
    assert (config.head_dim, config.upsample_rates, config.rope_theta) == (8, (8, 5, 4, 3), 10000.0)
    legacy = {k: v for k, v in raw.items() if k != "rope_parameters"} | {"rope_theta": 5000.0}
    assert Code2WavConfig.from_hf(legacy).rope_theta == 5000.0  # transformers 4.x layout
    with pytest.raises(ValueError, match="rotary"):
        Code2WavConfig.from_hf(raw | {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1.0}})
    with pytest.raises(ValueError, match="KV heads"):
        Code2WavConfig.from_hf(raw | {"num_key_value_heads": 3})


def test_rates_and_input_checks(ours: Code2Wav) -> None:
    assert (ours.samples_per_frame, ours.sample_rate, ours.lookahead_samples) == (1920, 24000, 555)
    with pytest.raises(ValueError, match="codes"):
        ours(torch.zeros(1, 3, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="left_context"):
        ours.decode_chunk(_codes(1, 5), left_context=5)
