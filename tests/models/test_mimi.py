"""The shared Mimi codec against transformers' ``MimiModel`` on the same random weights, and its streams.

The tiny codec's attention window is 6 SEANet frames (3 codec frames), so every chunked case below crosses it.
"""

import copy

import pytest
import torch
from safetensors.torch import save_file

from omnistage.models.mimi import MimiCodec, load_mimi
from omnistage.models.mimi_config import MimiConfig
from omnistage.models.weights import Checkpoint

transformers = pytest.importorskip("transformers")
FRAME = 1920


def _reference():
    cfg = transformers.MimiConfig(
        hidden_size=32, num_filters=4, codebook_size=64, codebook_dim=16, num_quantizers=8,
        vector_quantization_hidden_dimension=16, upsample_groups=32, num_hidden_layers=2, intermediate_size=64,
        num_attention_heads=4, num_key_value_heads=4, sliding_window=6)
    torch.manual_seed(0)
    model = transformers.MimiModel(cfg).eval()
    with torch.no_grad():  # transformers' init leaves codebooks at zero and layer scales at 0.01: liven both
        for name, tensor in [*model.named_buffers(), *model.named_parameters()]:
            if name.endswith("embed_sum"):
                tensor.normal_()
            elif name.endswith("cluster_usage"):
                tensor.uniform_(0.5, 2.0)
            elif name.endswith("scale"):
                tensor.normal_(0.0, 0.3)
        last = model.decoder.decoder_seanet.layers[-1].conv  # audio within [-1, 1], as a trained codec's
        last.weight /= 20.0
        last.bias /= 20.0
    return model


@pytest.fixture(scope="module")
def mimi(tmp_path_factory):
    model = _reference()
    folder = tmp_path_factory.mktemp("mimi")
    model.save_pretrained(folder)
    codec, result = load_mimi(Checkpoint(folder), MimiConfig.from_dict(model.config.to_dict()))
    assert result.unused == ()
    return model, codec


def test_config_reads_transformers_fields():
    cfg = MimiConfig.from_dict(transformers.MimiConfig().to_dict())
    assert (cfg.frame_size, cfg.frame_rate, cfg.latent_stride, cfg.num_quantizers) == (1920, 12.5, 2, 32)
    with pytest.raises(ValueError, match="use_conv_shortcut"):
        MimiConfig.from_dict({"use_conv_shortcut": True})


def test_encode_and_decode_match_transformers(mimi):
    """Codes identical for a length that is no whole number of frames; the waveform within 1e-5."""
    model, codec = mimi
    audio = torch.randn(2, 7 * FRAME + 333, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        reference = model.encode(audio[:, None]).audio_codes
        wave = model.decode(reference).audio_values[:, 0]
    codes = codec.encode(audio)
    assert codes.shape == (2, 8, 8)
    assert torch.equal(codes, reference)
    torch.testing.assert_close(codec.decode(reference), wave, atol=1e-5, rtol=0)


@pytest.mark.parametrize("size", [1, 2, 5, 13])
def test_chunked_decode_equals_whole(mimi, size):
    """The issue's bar: chunks of any size, conv tails and KV windows carried, within 1e-5 of one pass."""
    _, codec = mimi
    codes = torch.randint(0, 64, (1, 8, 30), generator=torch.Generator().manual_seed(2))
    whole = codec.decode(codes)
    assert whole.shape == (1, 30 * FRAME)
    state = codec.decoder.new_stream()
    parts = [codec.decode(codes[..., i:i + size], state) for i in range(0, 30, size)]
    assert whole.abs().max() < 2.0
    torch.testing.assert_close(torch.cat(parts, dim=-1), whole, atol=1e-5, rtol=0)


def test_chunked_decode_is_exact_in_float64(mimi):
    """Streaming changes only the float rounding: in float64 the joined chunks equal one pass to 1e-12."""
    codec = copy.deepcopy(mimi[1]).double()
    codes = torch.randint(0, 64, (1, 8, 20), generator=torch.Generator().manual_seed(5))
    state = codec.decoder.new_stream()
    parts = [codec.decode(codes[..., i:i + 3], state) for i in range(0, 20, 3)]
    torch.testing.assert_close(torch.cat(parts, dim=-1), codec.decode(codes), atol=1e-12, rtol=0)


def test_chunked_encode_equals_whole(mimi):
    """Whole frames per chunk, the stream's last chunk marked final (it may end mid-frame)."""
    _, codec = mimi
    audio = torch.randn(1, 11 * FRAME + 700, generator=torch.Generator().manual_seed(3))
    whole = codec.encode(audio)
    state = codec.encoder.new_stream()
    bounds = [0, FRAME, 4 * FRAME, 9 * FRAME, audio.shape[-1]]
    parts = [codec.encode(audio[:, a:b], state, final=b == bounds[-1]) for a, b in zip(bounds, bounds[1:])]
    assert torch.equal(torch.cat(parts, dim=-1), whole)


def test_nested_layout_loads_the_same(mimi, tmp_path):
    """transformers' module names (``encoder.encoder_seanet.layers``...) read as well as the published flat ones."""
    _, codec = mimi
    save_file({k: v.contiguous() for k, v in codec.state_dict().items()}, tmp_path / "model.safetensors")
    again, result = load_mimi(Checkpoint(tmp_path), codec.cfg, decoder=False)
    assert again.decoder is None and any(n.startswith("decoder.decoder_seanet.") for n in result.unused)
    audio = torch.randn(1, 3 * FRAME, generator=torch.Generator().manual_seed(4))
    assert torch.equal(again.encode(audio), codec.encode(audio))
    with pytest.raises(ValueError, match="without its decoder"):
        again.decode(torch.zeros(1, 8, 2, dtype=torch.long))


def test_a_half_alone_holds_no_other_half():
    half = MimiCodec(MimiConfig(hidden_size=32, num_filters=4, codebook_dim=16, vector_quantization_hidden_dimension=16,
                                upsample_groups=32, num_hidden_layers=1, intermediate_size=64, num_attention_heads=4),
                     encoder=False)
    assert half.encoder is None and not any(n.startswith("encoder.") for n in half.state_dict())
