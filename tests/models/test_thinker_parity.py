"""The thinker equals transformers' on the tiny checkpoint: logits, accept-layer hidden, M-RoPE positions,
paged prefill + decode, and batching."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from omnistage.layers.attention import AttentionMetadata, ForwardContext, forward_context
from omnistage.layers.attention.torch_sdpa import TorchSDPABackend
from omnistage.models.decoder import Deepstack, KVCacheSpec
from omnistage.models.qwen3_omni.mrope import audio_output_length
from omnistage.models.qwen3_omni.thinker import MultimodalInputs, Thinker, ThinkerEmbeds

ATOL = 1e-4


class PagedKV:
    """A minimal paged KV cache for tests: blocks handed out in shuffled order, one table per sequence."""

    def __init__(self, spec: KVCacheSpec, num_blocks: int = 64, block_size: int = 4) -> None:
        self.caches = [torch.zeros(2, num_blocks, block_size, spec.num_kv_heads, spec.head_dim)
                       for _ in range(spec.num_layers)]
        self.block_size = block_size
        self.free = list(range(num_blocks))
        random.Random(0).shuffle(self.free)
        self.tables: dict[int, list[int]] = {}
        self.lens: dict[int, int] = {}

    def context(self, steps: list[tuple[int, int]]) -> ForwardContext:
        """Metadata for one step adding ``n`` tokens to each ``(sequence id, n)``."""
        slots: list[int] = []
        context_lens: list[int] = []
        for seq, n in steps:
            table = self.tables.setdefault(seq, [])
            start = self.lens.get(seq, 0)
            while len(table) * self.block_size < start + n:
                table.append(self.free.pop())
            size = self.block_size
            slots += [table[p // size] * size + p % size for p in range(start, start + n)]
            self.lens[seq] = start + n
            context_lens.append(start + n)
        width = max(len(self.tables[s]) for s, _ in steps)
        tables = [self.tables[s] + [0] * (width - len(self.tables[s])) for s, _ in steps]
        query_lens = [n for _, n in steps]
        meta = AttentionMetadata(
            query_start_loc=torch.tensor(np.cumsum([0] + query_lens), dtype=torch.int32),
            context_lens=torch.tensor(context_lens, dtype=torch.int32),
            slot_mapping=torch.tensor(slots, dtype=torch.int64),
            block_tables=torch.tensor(tables, dtype=torch.int32),
            query_lens=query_lens, context_lens_cpu=context_lens,
        )
        return ForwardContext(meta, TorchSDPABackend(), self.caches)


def fresh(lengths: list[int]) -> ForwardContext:
    return ForwardContext(AttentionMetadata.for_fresh_sequences(lengths), TorchSDPABackend())


@dataclass
class Prompt:
    ids: torch.Tensor
    mm: MultimodalInputs
    hf_kwargs: dict[str, torch.Tensor]


@pytest.fixture(scope="module")
def models(tiny_dir: Path) -> tuple[Thinker, torch.nn.Module]:
    from transformers import Qwen3OmniMoeForConditionalGeneration

    ours = Thinker.from_checkpoint(tiny_dir, dtype=torch.float32)
    ref = Qwen3OmniMoeForConditionalGeneration.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    return ours, ref.thinker


@pytest.fixture(scope="module")
def prompts(tiny_dir: Path) -> dict[str, Prompt]:
    from PIL import Image
    from transformers import AutoImageProcessor, AutoTokenizer, WhisperFeatureExtractor

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    special = tok.convert_tokens_to_ids
    rng = np.random.default_rng(0)
    audio = WhisperFeatureExtractor.from_pretrained(tiny_dir)(
        (rng.standard_normal(20800) * 0.1).astype(np.float32), sampling_rate=16000, return_attention_mask=True,
        padding="longest", return_tensors="pt")
    n_audio = audio_output_length(int(audio["attention_mask"].sum()), 50)
    image = AutoImageProcessor.from_pretrained(tiny_dir)(
        images=[Image.fromarray((rng.random((64, 64, 3)) * 255).astype(np.uint8))], return_tensors="pt")
    n_image = int(image["image_grid_thw"].prod()) // 4
    audio_part = [special("<|audio_start|>")] + [special("<|audio_pad|>")] * n_audio + [special("<|audio_end|>")]
    image_part = [special("<|vision_start|>")] + [special("<|image_pad|>")] * n_image + [special("<|vision_end|>")]

    def build(middle: list[int]) -> torch.Tensor:
        head = [special("<|im_start|>")] + tok("user\n").input_ids
        tail = tok("what is this?").input_ids + [special("<|im_end|>")] + tok("\n").input_ids
        return torch.tensor(head + middle + tail + [special("<|im_start|>")] + tok("assistant\n").input_ids)

    # A "video" of one temporal patch: the image's patches under the video placeholder (no torchvision needed).
    video_part = [special("<|vision_start|>")] + [special("<|video_pad|>")] * n_image + [special("<|vision_end|>")]
    audio_mm = dict(input_features=audio["input_features"], feature_attention_mask=audio["attention_mask"])
    image_mm = dict(pixel_values=image["pixel_values"], image_grid_thw=image["image_grid_thw"])
    video_mm = dict(pixel_values_videos=image["pixel_values"].flip(0), video_grid_thw=image["image_grid_thw"],
                    video_second_per_grid=torch.tensor([2.0]))
    return {
        "video": _processed_video_prompt(tiny_dir, build([special("<|vision_start|>"), special("<|video_pad|>"),
                                                          special("<|vision_end|>")]), rng),
        "image_video": Prompt(build(video_part + tok("and").input_ids + image_part),
                              MultimodalInputs(**image_mm, **video_mm), {**image_mm, **video_mm}),
        "text": Prompt(build(tok("hello there").input_ids), MultimodalInputs(), {}),
        "audio": Prompt(build(audio_part), MultimodalInputs(**audio_mm), audio_mm),
        "image": Prompt(build(image_part), MultimodalInputs(**image_mm), image_mm),
        "image_audio": Prompt(build(image_part + audio_part), MultimodalInputs(**audio_mm, **image_mm),
                              {**audio_mm, **image_mm}),
    }


def _processed_video_prompt(tiny_dir: Path, ids: torch.Tensor, rng: np.random.Generator) -> Prompt:
    """Three distinct frames at 2 fps through omnistage's processor: two temporal patches (the last padded),
    one second per patch, so transformers' positions are whole numbers too."""
    from omnistage.families.qwen3_omni.prompt import Qwen3OmniPromptProcessor
    from omnistage.processing.video import Video

    frames = [(rng.random((48, 64, 3)) * 255).astype(np.uint8) for _ in range(3)]
    processed = Qwen3OmniPromptProcessor.from_folder(tiny_dir).process(ids.tolist(), videos=[Video(frames, fps=2.0)])
    mm = processed.mm
    assert mm.video_grid_thw[0, 0] == 2 and mm.video_second_per_grid.tolist() == [1.0]
    names = ("pixel_values_videos", "video_grid_thw", "video_second_per_grid")
    return Prompt(torch.tensor(processed.token_ids), mm, {n: getattr(mm, n) for n in names})


def _reference(ref: torch.nn.Module, prompt: Prompt, ids: torch.Tensor | None = None):  # noqa: ANN202
    ids = prompt.ids if ids is None else ids
    with torch.no_grad():
        return ref(input_ids=ids[None], attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                   output_hidden_states=True, **prompt.hf_kwargs)


def _prefill_fresh(ours: Thinker, prompt: Prompt) -> tuple[torch.Tensor, torch.Tensor, ThinkerEmbeds, int]:
    embeds = ours.embed(prompt.ids, prompt.mm)
    positions, delta = ours.positions(prompt.ids, prompt.mm)
    with torch.no_grad(), forward_context(fresh([len(prompt.ids)])):
        hidden, accept = ours.forward_with_accept_hidden(prompt.ids, positions, embeds.inputs_embeds, embeds.deepstack)
    return ours.compute_logits(hidden), accept, embeds, delta


@pytest.mark.parametrize("name", ["text", "audio", "image", "image_audio", "image_video", "video"])
def test_logits_and_accept_hidden_match_transformers(models, prompts, name: str) -> None:  # noqa: ANN001
    ours, ref = models
    prompt = prompts[name]
    logits, accept, embeds, _ = _prefill_fresh(ours, prompt)
    expected = _reference(ref, prompt)
    torch.testing.assert_close(logits, expected.logits[0], atol=ATOL, rtol=0)
    torch.testing.assert_close(accept, expected.hidden_states[ours.accept_hidden_layer][0], atol=ATOL, rtol=0)
    torch.testing.assert_close(embeds.inputs_embeds, expected.hidden_states[0][0], atol=ATOL, rtol=0)
    if name != "text" and name != "audio":
        assert embeds.deepstack is not None and embeds.deepstack.features.shape[0] == 2
        visual = (prompt.ids == ref.config.image_token_id) | (prompt.ids == ref.config.video_token_id)
        assert torch.equal(embeds.deepstack.rows, visual.nonzero().squeeze(1))


@pytest.mark.parametrize("second_per_grid", [2.0, 0.5])
def test_mrope_audio_in_video_matches_transformers(models, second_per_grid: float) -> None:  # noqa: ANN001
    """Video frames and audio interleaved by time; fractional temporal positions are floored."""
    ours, ref = models
    c = ref.config
    grid, frames = torch.tensor([[2, 4, 8]]), 250
    n_video, n_audio = 2 * 4 * 8 // 4, audio_output_length(frames, c.audio_config.n_window)
    ids = torch.tensor([1, 2, c.vision_start_token_id, c.audio_start_token_id] + [c.video_token_id] * n_video
                       + [c.audio_token_id] * n_audio + [3, 4, 5, 6])
    mm = MultimodalInputs(video_grid_thw=grid, video_second_per_grid=torch.tensor([second_per_grid]),
                          feature_attention_mask=torch.ones(1, frames, dtype=torch.long))
    positions, delta = ours.positions(ids, mm)
    expected, expected_delta = ref.get_rope_index(ids[None], None, grid, torch.ones(1, len(ids), dtype=torch.long),
                                                  True, torch.tensor([frames]), mm.video_second_per_grid)
    assert torch.equal(positions, expected[:, 0].floor().long())
    assert delta == int(expected[:, 0].max().floor()) + 1 - len(ids)
    if second_per_grid == 2.0:
        assert delta == int(expected_delta)


@pytest.mark.parametrize("name", ["text", "audio", "image", "image_audio", "image_video", "video"])
def test_mrope_positions_match_transformers(models, prompts, name: str) -> None:  # noqa: ANN001
    ours, ref = models
    prompt = prompts[name]
    positions, delta = ours.positions(prompt.ids, prompt.mm)
    mask = torch.ones(1, len(prompt.ids), dtype=torch.long)
    mm = prompt.mm
    expected, expected_delta = ref.get_rope_index(prompt.ids[None], mm.image_grid_thw, mm.video_grid_thw, mask, False,
                                                  mm.audio_lengths(), mm.video_second_per_grid)
    assert torch.equal(positions, expected[:, 0].long())
    assert delta == int(expected_delta)
    if name.startswith("image"):
        assert delta < 0  # a 4x4 grid covers 4 tokens with 2x2 positions


@pytest.mark.parametrize("name", ["image", "video"])
def test_paged_prefill_then_decode_equals_full_forward(models, prompts, name: str) -> None:  # noqa: ANN001
    """Chunked prefill through the paged cache, then decode steps, give the no-cache logits (and transformers'):
    the same greedy tokens."""
    ours, ref = models
    prompt = prompts[name]
    embeds = ours.embed(prompt.ids, prompt.mm)
    positions, delta = ours.positions(prompt.ids, prompt.mm)
    # Two prefill chunks, split inside the image/video: each chunk carries its own part of the deepstack rows.
    cache, length, split = PagedKV(ours.kv_cache_spec(), num_blocks=128), len(prompt.ids), int(embeds.deepstack.rows[2])
    with torch.no_grad():
        for start, end in ((0, split), (split, length)):
            with forward_context(cache.context([(0, end - start)])):
                hidden = ours(prompt.ids[start:end], positions[:, start:end], embeds.inputs_embeds[start:end],
                              embeds.deepstack.select(start, end))
        step_logits = [ours.compute_logits(hidden[-1:])]
        generated: list[int] = []
        for step in range(3):
            generated.append(int(step_logits[-1].argmax()))
            pos = torch.full((3, 1), length + step + delta)
            with forward_context(cache.context([(0, 1)])):
                hidden = ours(torch.tensor(generated[-1:]), pos)
            step_logits.append(ours.compute_logits(hidden))
    full_ids = torch.cat([prompt.ids, torch.tensor(generated)])
    full_embeds = torch.cat([embeds.inputs_embeds, ours.embed_tokens(torch.tensor(generated))])
    full_pos = torch.cat([positions, (torch.arange(length, length + 3) + delta).expand(3, -1)], dim=1)
    with torch.no_grad(), forward_context(fresh([len(full_ids)])):
        full_logits = ours.compute_logits(ours(full_ids, full_pos, full_embeds, embeds.deepstack))
    cached = torch.cat(step_logits)
    torch.testing.assert_close(cached, full_logits[length - 1:], atol=1e-5, rtol=0)
    expected = _reference(ref, prompt, full_ids).logits[0, length - 1:]
    torch.testing.assert_close(cached, expected, atol=ATOL, rtol=0)
    assert expected[:3].argmax(-1).tolist() == generated  # transformers' greedy tokens


def test_two_sequences_batched_equal_each_alone(models, prompts) -> None:  # noqa: ANN001
    ours, _ = models
    parts = [prompts["text"], prompts["image"]]
    alone = [_prefill_fresh(ours, p)[0] for p in parts]
    embeds = [ours.embed(p.ids, p.mm) for p in parts]
    positions = [ours.positions(p.ids, p.mm) for p in parts]
    lengths = [len(p.ids) for p in parts]
    cache = PagedKV(ours.kv_cache_spec())
    deepstack = Deepstack.concat([(0, embeds[0].deepstack), (lengths[0], embeds[1].deepstack)])
    with torch.no_grad():
        with forward_context(cache.context([(0, lengths[0]), (1, lengths[1])])):
            hidden = ours(torch.cat([p.ids for p in parts]), torch.cat([pos for pos, _ in positions], dim=1),
                          torch.cat([e.inputs_embeds for e in embeds]), deepstack)
        batched = ours.compute_logits(hidden)
        torch.testing.assert_close(batched, torch.cat(alone), atol=1e-5, rtol=0)
        # One decode step for both (the decode-only attention path, contexts of different lengths).
        next_ids = torch.stack([a[-1].argmax() for a in alone])
        pos = torch.tensor([lengths[i] + positions[i][1] for i in range(2)]).expand(3, -1)
        with forward_context(cache.context([(0, 1), (1, 1)])):
            decoded = ours.compute_logits(ours(next_ids, pos))
    for i, p in enumerate(parts):
        single = PagedKV(ours.kv_cache_spec())
        e = embeds[i]
        with torch.no_grad():
            with forward_context(single.context([(0, lengths[i])])):
                ours(p.ids, positions[i][0], e.inputs_embeds, e.deepstack)
            with forward_context(single.context([(0, 1)])):
                own = ours.compute_logits(ours(next_ids[i:i + 1], pos[:, i:i + 1]))
        torch.testing.assert_close(decoded[i:i + 1], own, atol=1e-5, rtol=0)


def test_kv_cache_spec_reads_config(models) -> None:  # noqa: ANN001
    ours, ref = models
    text = ref.config.text_config
    assert ours.kv_cache_spec() == (text.num_hidden_layers, text.num_key_value_heads, text.head_dim)


def make_variant(tiny_dir: Path, out: Path) -> Path:
    """A random checkpoint shaped unlike the tiny one: other sizes, dense and MoE thinker layers mixed
    (decoder_sparse_step 2, mlp_only_layers), attention biases, 5 code groups, accept layer = last layer."""
    import json

    from transformers import Qwen3OmniMoeConfig, Qwen3OmniMoeForConditionalGeneration

    cfg = json.loads((tiny_dir / "config.json").read_text())
    thinker, talker = cfg["thinker_config"], cfg["talker_config"]
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1], "interleaved": True}
    thinker["text_config"].update(hidden_size=48, num_hidden_layers=4, num_attention_heads=6, num_key_value_heads=3,
                                  head_dim=8, decoder_sparse_step=2, mlp_only_layers=[3], attention_bias=True,
                                  num_experts=6, num_experts_per_tok=3, rope_parameters=rope)
    thinker["audio_config"]["output_dim"] = thinker["vision_config"]["out_hidden_size"] = 48
    talker["text_config"].update(hidden_size=40, num_hidden_layers=3, num_experts=3, num_experts_per_tok=1,
                                 rope_parameters=rope, num_attention_heads=5, num_key_value_heads=5, head_dim=8)
    talker["code_predictor_config"].update(hidden_size=40, num_code_groups=5, num_hidden_layers=2)
    talker.update(thinker_hidden_size=48, num_code_groups=5, accept_hidden_layer=4)
    cfg["code2wav_config"]["num_quantizers"] = 5
    torch.manual_seed(0)
    model = Qwen3OmniMoeForConditionalGeneration(Qwen3OmniMoeConfig(**cfg)).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("experts.gate_up_proj", "experts.down_proj")) or "bias" in name:
                param.normal_(0.0, 0.05)  # the talker's experts are left uninitialised; biases zero
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def variant_dir(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_variant(tiny_dir, tmp_path_factory.mktemp("variant"))


def test_other_config_matches_transformers(variant_dir: Path) -> None:
    from transformers import Qwen3OmniMoeForConditionalGeneration

    ours = Thinker.from_checkpoint(variant_dir, dtype=torch.float32)
    ref = Qwen3OmniMoeForConditionalGeneration.from_pretrained(variant_dir, dtype=torch.float32).eval().thinker
    kinds = [type(layer.mlp).__name__ for layer in ours.decoder.layers]
    assert kinds == ["GatedMLP", "SparseMoeBlock", "GatedMLP", "GatedMLP"]
    assert ours.decoder.layers[0].self_attn.q_proj.bias is not None
    ids = torch.randint(0, 500, (12,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), forward_context(fresh([12])):
        hidden, accept = ours.forward_with_accept_hidden(ids, torch.arange(12).expand(3, -1))
    expected = _reference(ref, Prompt(ids, MultimodalInputs(), {}))
    torch.testing.assert_close(ours.compute_logits(hidden), expected.logits[0], atol=ATOL, rtol=0)
    assert ours.accept_hidden_layer == 4  # the last layer: the normed output
    torch.testing.assert_close(accept, expected.hidden_states[4][0], atol=ATOL, rtol=0)


def test_hub_layout_with_a_missing_expert_tensor_is_named(variant_dir: Path, tmp_path: Path) -> None:
    import shutil

    from safetensors.torch import load_file, save_file

    tensors = load_file(str(variant_dir / "model.safetensors"))
    del tensors["thinker.model.layers.1.mlp.experts.2.up_proj.weight"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    shutil.copy(variant_dir / "config.json", tmp_path / "config.json")
    with pytest.raises(ValueError, match=r"thinker\.model\.layers\.1\.mlp\.experts\."):
        Thinker.from_checkpoint(tmp_path, dtype=torch.float32)
