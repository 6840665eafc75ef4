"""CSM against transformers on random checkpoints make-tiny writes, and the backbone stage's own behaviour."""

import pytest
import torch

from omnistage.families.csm.checkpoint import load_codec, load_model
from omnistage.families.csm.config import CsmConfig, Rope
from omnistage.families.csm.prompt import CsmTokenizer, Segment
from omnistage.families.csm.runner import CsmRunner
from omnistage.families.csm.verify import greedy_frames, run_csm_verify
from omnistage.sampling_params import SamplingParams

transformers = pytest.importorskip("transformers")


def test_verify_cases_hold(csm_tiny):
    """Context codes and 10 greedy frames identical to transformers', the waveform within 1e-4, the streamed
    decode within 1e-5 of the whole."""
    results = run_csm_verify(csm_tiny, frames=10)
    assert [r.name for r in results] == ["context", "codes", "waveform", "streamed"]
    for r in results:
        assert r.ok, r


def test_llama3_rope_is_transformers():
    raw = {"rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}
    config = transformers.LlamaConfig(head_dim=64, hidden_size=256, num_attention_heads=4, **raw)
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    expected, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    ours = Rope.from_dict(raw).inv_freq(64)
    torch.testing.assert_close(ours, expected, atol=0, rtol=1e-6)
    assert not torch.allclose(ours, Rope.from_dict({"rope_theta": 500000.0}).inv_freq(64))


def test_prompt_is_the_chat_template_layout(csm_tiny):
    """``<bos>[1]text<eos>`` + one audio position per context frame + ``<audio_eos>``, then ``<bos>[0]text<eos>``."""
    cfg = CsmConfig.from_folder(csm_tiny)
    tok = CsmTokenizer(csm_tiny, cfg)
    codes = torch.zeros(4, 32, dtype=torch.long)
    prompt = tok.prompt("  hi   you ", 0, (Segment(1, "before", codes),))
    text = tok.tokenizer.encode("[1]before", add_special_tokens=False).ids
    last = tok.tokenizer.encode("[0]hi you", add_special_tokens=False).ids
    assert prompt.input_ids == [cfg.bos_token_id, *text, cfg.eos_token_id, *[cfg.audio_token_id] * 4,
                                cfg.audio_eos_token_id, cfg.bos_token_id, *last, cfg.eos_token_id]
    assert torch.equal(prompt.context, codes) and prompt.text_tokens == len(last)
    with pytest.raises(ValueError):
        tok.prompt(" ")


def test_sampling_is_seeded_and_noisy(csm_tiny):
    cfg = CsmConfig.from_folder(csm_tiny)
    runner = CsmRunner(load_model(csm_tiny, cfg))
    prompt = CsmTokenizer(csm_tiny, cfg).prompt("good morning")

    def sample(seed: int) -> torch.Tensor:
        runner.add(str(seed), prompt, SamplingParams(temperature=1.0, top_k=20, seed=seed, max_tokens=4))
        made = []
        while runner.running:
            made += [f.codes for f in runner.step() if f.codes is not None]
        return torch.stack(made)

    a, b, c = sample(1), sample(1), sample(2)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert not torch.equal(a, greedy_frames(runner, prompt, 4))


def test_an_eos_frame_ends_the_utterance_without_audio(csm_tiny):
    """Heads of all-equal logits: greedy picks the first id, the EOS code 0, in every codebook: the first frame
    is EOS, no audio."""
    cfg = CsmConfig.from_folder(csm_tiny)
    assert cfg.codebook_eos_token_id == 0
    model = load_model(csm_tiny, cfg)
    with torch.no_grad():
        model.lm_head.weight.zero_()
        model.depth_decoder.codebooks_head.weight.zero_()
    runner = CsmRunner(model)
    runner.add("r", CsmTokenizer(csm_tiny, cfg).prompt("stop"), SamplingParams(temperature=0.0, max_tokens=5))
    frames = runner.step()
    assert [(f.codes, f.finished, f.by_length) for f in frames] == [(None, True, False)] and not runner.running


def test_the_frame_budget_ends_by_length(csm_tiny):
    cfg = CsmConfig.from_folder(csm_tiny)
    runner = CsmRunner(load_model(csm_tiny, cfg))
    runner.add("r", CsmTokenizer(csm_tiny, cfg).prompt("go on"), SamplingParams(temperature=0.0, max_tokens=3))
    frames = [runner.step()[0] for _ in range(3)]
    assert [f.finished for f in frames] == [False, False, True] and frames[-1].by_length


def test_codes_past_the_codec_decode_clamped(csm_tiny):
    """A vocabulary id no codec entry has (the full model's 2048..2050) does not end the stream."""
    from omnistage.models.mimi_stream import MimiStreams

    cfg = CsmConfig.from_folder(csm_tiny)
    streams = MimiStreams(load_codec(csm_tiny, cfg, encoder=False))
    codes = torch.full((32, 2), cfg.codec.codebook_size + 2)
    out = streams.decode_streams(["s"], [0], [codes], [0], [True])
    assert out[0].shape == (2 * 1920,) and torch.isfinite(out[0]).all()


def test_verify_holds_on_transformers_own_init(tmp_path):
    """Weights this project did not shape (transformers' init: narrow heads, zero codebooks) verify as well."""
    from omnistage.families.csm.make_tiny import make_tiny_csm

    for r in run_csm_verify(make_tiny_csm(tmp_path, plain=True), frames=6):
        assert r.ok, r


def test_int8_backbone_stays_near_fp32(csm_tiny):
    """Weight-only int8 on both Llama stacks: every linear is quantized (the embeddings and heads are not), and the
    prompt's codebook-0 logits stay within 5% of their spread of fp32's (one scale per row, 127 levels), the
    greedy pick the same; random weights amplify rounding over frames, so whole frames are not compared."""
    from omnistage.models.sequence_cache import SequenceCache

    cfg = CsmConfig.from_folder(csm_tiny)
    prompt = CsmTokenizer(csm_tiny, cfg).prompt("hello there, how are you")
    int8, fp32 = load_model(csm_tiny, cfg, quantization="int8"), load_model(csm_tiny, cfg)
    quantized = [n for n, p in int8.named_parameters() if p.dtype == torch.int8]
    layers = cfg.backbone.num_hidden_layers + cfg.depth.num_hidden_layers
    assert len(quantized) == 7 * layers and not any("embed" in n or "head" in n for n in quantized)

    def logits(model) -> torch.Tensor:  # noqa: ANN001
        embeds = model.prompt_embeds(torch.tensor(prompt.input_ids), prompt.context)
        with torch.no_grad():
            return model.first_codebook(model.backbone_model(embeds, SequenceCache())[:, -1])[0]

    ours, theirs = logits(int8), logits(fp32)
    assert not torch.equal(ours, theirs)
    torch.testing.assert_close(ours, theirs, atol=0.05 * float(theirs.std()), rtol=0)
    assert int(ours.argmax()) == int(theirs.argmax())
