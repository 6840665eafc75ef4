"""The talker and code predictor equal transformers' on the tiny checkpoint, step by step and in generate."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from omnistage.layers.attention import forward_context
from omnistage.models.qwen3_omni.talker import Talker
from tests.models.test_thinker_parity import PagedKV, fresh, make_variant

ATOL = 1e-4


@pytest.fixture(scope="module")
def models(tiny_dir: Path) -> tuple[Talker, torch.nn.Module]:
    from transformers import Qwen3OmniMoeForConditionalGeneration

    ours = Talker.from_checkpoint(tiny_dir, dtype=torch.float32)
    ref = Qwen3OmniMoeForConditionalGeneration.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    return ours, ref.talker


def _hidden(n: int, size: int, seed: int) -> torch.Tensor:
    return torch.randn(n, size, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("mrope", [False, True])
def test_logits_match_transformers(models, mrope: bool) -> None:  # noqa: ANN001
    ours, ref = models
    embeds = _hidden(13, ref.config.text_config.hidden_size, 0)
    positions = torch.arange(13).expand(3, -1).clone()
    if mrope:  # an image-like 2x2 grid in the middle: rows h/w differ from t
        positions[:, 4:8] = torch.tensor([[4, 4, 4, 4], [4, 4, 5, 5], [4, 5, 4, 5]])
        positions[:, 8:] -= 2
    with torch.no_grad(), forward_context(fresh([13])):
        logits = ours.compute_logits(ours(None, positions, embeds))
        expected = ref(inputs_embeds=embeds[None], position_ids=positions[:, None], use_cache=False).logits[0]
    torch.testing.assert_close(logits, expected, atol=ATOL, rtol=0)


def test_residual_codes_match_transformers_greedy(models) -> None:  # noqa: ANN001
    ours, ref = models
    groups = ref.config.num_code_groups
    hidden = _hidden(3, ref.config.text_config.hidden_size, 1) * 3
    code0 = torch.tensor([5, 17, 60])
    codes = ours.predict_residual_codes(hidden, code0)
    assert codes.shape == (3, groups) and torch.equal(codes[:, 0], code0)
    with torch.no_grad():
        for i in range(3):
            prefix = torch.stack([hidden[i], ref.get_input_embeddings()(code0[i])])[None]
            out = ref.code_predictor.generate(inputs_embeds=prefix, max_new_tokens=groups - 1, do_sample=False)
            assert torch.equal(codes[i, 1:], out[0, -(groups - 1):]), i


def test_sampler_drives_every_residual_step(models) -> None:  # noqa: ANN001
    ours, _ = models
    seen: list[tuple[tuple[int, ...], int]] = []

    class Recording:
        def sample(self, logits: torch.Tensor, step: int) -> torch.Tensor:
            seen.append((tuple(logits.shape), step))
            return torch.full((logits.shape[0],), len(seen))

    codes = ours.predict_residual_codes(_hidden(2, 32, 2), torch.tensor([1, 2]), Recording())
    groups = ours.num_code_groups
    width = ours.code_predictor.lm_head[0].out_features
    assert seen == [((2, width), step) for step in range(groups - 1)]
    assert codes[:, 1:].tolist() == [list(range(1, groups))] * 2


def test_frame_embedding_is_the_sum_transformers_feeds(models) -> None:  # noqa: ANN001
    ours, ref = models
    groups = ref.config.num_code_groups
    hidden, code0 = _hidden(1, 32, 3), torch.tensor([9])
    with torch.no_grad():
        last_id_hidden = ref.get_input_embeddings()(code0[None])
        result = ref.code_predictor.generate(
            inputs_embeds=torch.cat([hidden[None], last_id_hidden], dim=1), max_new_tokens=groups - 1,
            do_sample=False, output_hidden_states=True, return_dict_in_generate=True)
        # transformers' prepare_inputs_for_generation, verbatim in substance:
        mids = [h[0] for h in result.hidden_states[1:]]
        last = ref.code_predictor.get_input_embeddings()[-1](result.sequences[..., -1:])
        expected = torch.cat([last_id_hidden, *mids, last], dim=1).sum(1)
    codes = torch.cat([code0, result.sequences[0, -(groups - 1):]])[None]
    assert torch.equal(ours.frame_embedding(codes), expected)


def test_greedy_steps_match_transformers_generate(models) -> None:  # noqa: ANN001
    """Prefill, then per step: codebook 0, residual codes, next input = frame + trailing text (then tts_pad)."""
    ours, ref = models
    vocab, size, steps = ref.config.text_config.vocab_size, ref.config.text_config.hidden_size, 5
    prompt, trailing, pad = _hidden(9, size, 4), _hidden(2, size, 5), _hidden(1, size, 6)
    suppressed = list(range(vocab - 1024, vocab))
    with torch.no_grad():
        out = ref.generate(
            inputs_embeds=prompt[None], trailing_text_hidden=trailing[None], tts_pad_embed=pad[None],
            attention_mask=torch.ones(1, 9, dtype=torch.long), max_new_tokens=steps, do_sample=False,
            suppress_tokens=suppressed, repetition_penalty=1.0, output_hidden_states=True,
            return_dict_in_generate=True)
    expected_code0 = out.sequences[0, -steps:]
    expected_frames = torch.stack([h[-1][0] for h in out.hidden_states if h[-1] is not None])  # [steps-1, G]

    cache, code0s, frames = PagedKV(ours.kv_cache_spec()), [], []
    with torch.no_grad():
        with forward_context(cache.context([(0, 9)])):
            hidden = ours(None, torch.arange(9).expand(3, -1), prompt)[-1:]
        for step in range(steps):
            logits = ours.compute_logits(hidden)
            logits[:, suppressed] = float("-inf")
            code0s.append(logits.argmax(-1))
            if step == steps - 1:
                break
            codes = ours.predict_residual_codes(hidden, code0s[-1])
            frames.append(codes[0])
            text = trailing[step:step + 1] if step < len(trailing) else pad
            with forward_context(cache.context([(0, 1)])):
                hidden = ours(None, torch.full((3, 1), 9 + step), ours.frame_embedding(codes) + text)
    assert torch.equal(torch.cat(code0s), expected_code0)
    assert torch.equal(torch.stack(frames), expected_frames)


def test_kv_cache_spec_reads_config(models) -> None:  # noqa: ANN001
    ours, ref = models
    text = ref.config.text_config
    assert ours.kv_cache_spec() == (text.num_hidden_layers, text.num_key_value_heads, text.head_dim)


def test_codec_ids_embed_like_transformers(models) -> None:  # noqa: ANN001
    """forward(ids) embeds codec ids with the talker's codec embedding (the runner's id-fed rows)."""
    ours, ref = models
    ids = torch.tensor([3, 70, 164, 165])
    with torch.no_grad(), forward_context(fresh([4])):
        by_ids = ours(ids, torch.arange(4).expand(3, -1))
    with torch.no_grad(), forward_context(fresh([4])):
        by_embeds = ours(None, torch.arange(4).expand(3, -1), ref.get_input_embeddings()(ids))
    assert torch.equal(by_ids, by_embeds)


def test_models_meet_the_runner_contract(models, tiny_dir: Path) -> None:  # noqa: ANN001
    from omnistage.models.qwen3_omni.thinker import Thinker
    from omnistage.runner.base import ARModel, TalkerModel, model_uses_mrope

    ours, _ = models
    thinker = Thinker.from_checkpoint(tiny_dir, dtype=torch.float32)
    assert isinstance(ours, TalkerModel) and isinstance(thinker, ARModel)
    assert model_uses_mrope(ours) and model_uses_mrope(thinker)


def test_other_config_matches_transformers(tiny_dir: Path, tmp_path: Path) -> None:
    from transformers import Qwen3OmniMoeForConditionalGeneration

    folder = make_variant(tiny_dir, tmp_path)
    ours = Talker.from_checkpoint(folder, dtype=torch.float32)
    ref = Qwen3OmniMoeForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval().talker
    embeds = _hidden(6, 40, 7)
    with torch.no_grad(), forward_context(fresh([6])):
        hidden = ours(None, torch.arange(6).expand(3, -1), embeds)
        expected = ref(inputs_embeds=embeds[None], use_cache=False)
    torch.testing.assert_close(ours.compute_logits(hidden), expected.logits[0], atol=ATOL, rtol=0)
    codes = ours.predict_residual_codes(hidden[-2:], torch.tensor([3, 4]))
    assert codes.shape == (2, 5)
    with torch.no_grad():
        for i in range(2):
            prefix = torch.stack([hidden[4 + i], ref.get_input_embeddings()(codes[i, 0])])[None]
            out = ref.code_predictor.generate(inputs_embeds=prefix, max_new_tokens=4, do_sample=False)
            assert torch.equal(codes[i, 1:], out[0, -4:])
