"""``use_audio_in_video`` on the tiny checkpoint: a video file with a sound track (made with PyAV) through
omnistage's decoding and processor gives transformers' placeholder layout, audio features, M-RoPE positions,
thinker logits and greedy tokens.

transformers' processor cannot be built here (its video processor needs torchvision, its track loading
torchcodec), so the reference prompt is assembled from its own pieces: the Whisper feature extractor run as the
processor runs it (one batch, padded), its audio token count, and its ``replace_video_with_audio_token`` for the
interleaved layout. The video's pixel rows come from omnistage's processor (the existing video parity test holds
them to transformers' layout); the track is decoded once by omnistage and fed to both sides.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from omnistage.entrypoints.openai.media.loaders import decode_video
from omnistage.entrypoints.openai.server_config import ServerLimits
from omnistage.layers.attention import AttentionMetadata, ForwardContext, forward_context
from omnistage.layers.attention.torch_sdpa import TorchSDPABackend
from omnistage.models.qwen3_omni.prompt_media import PromptMedia, encode_needed
from omnistage.models.qwen3_omni.thinker import Thinker
from omnistage.families.qwen3_omni.prompt import Qwen3OmniPrompt, Qwen3OmniPromptProcessor
from tests.entrypoints.media_samples import mp4_bytes

# Logits of two fp32 implementations of the same model on the same inputs (as the thinker parity tests).
ATOL = 1e-4
PARTS = [{"type": "audio"}, {"type": "video"}, {"type": "text", "text": "what do you hear and see?"}]


@pytest.fixture(scope="module")
def case(tiny_dir: Path) -> tuple[Qwen3OmniPromptProcessor, list[int], np.ndarray, object]:
    """The template ids, a spoken part, and a 2 s video (4 frames kept: 2 fps, 1 s per temporal patch) whose
    AAC track at 44.1 kHz plays a 440 Hz tone."""
    processor = Qwen3OmniPromptProcessor.from_folder(tiny_dir)
    video = decode_video(mp4_bytes(seconds=2.0, fps=10, tone_hz=440), ServerLimits(max_video_frames=4),
                         audio_seconds=10.0)
    assert len(video.frames) == 4 and video.fps == pytest.approx(2.0) and video.audio is not None
    # As long as the track, so the reference's one padded feature batch equals per-item extraction.
    spoken = (np.random.default_rng(0).standard_normal(len(video.audio)) * 0.1).astype(np.float32)
    ids = processor.apply_chat_template([{"role": "user", "content": PARTS}])
    return processor, ids, spoken, video


@pytest.fixture(scope="module")
def prompt(case) -> Qwen3OmniPrompt:  # noqa: ANN001
    processor, ids, spoken, video = case
    return processor.process(ids, audios=[spoken], videos=[video], use_audio_in_video=True)


@pytest.fixture(scope="module")
def reference(case, prompt: Qwen3OmniPrompt) -> tuple[list[int], dict[str, object]]:  # noqa: ANN001
    """transformers' ids and thinker inputs for the same prompt."""
    from transformers.models.qwen3_omni_moe import processing_qwen3_omni_moe as hf

    processor, ids, spoken, video = case
    features = processor.features([spoken, video.audio], sampling_rate=16000, padding=True, truncation=False,
                                  return_attention_mask=True, return_tensors="pt")
    audio_inputs = {"num_audio_tokens": hf._get_feat_extract_output_lengths(features["attention_mask"].sum(-1),
                                                                           processor.n_window)}
    names = SimpleNamespace(audio_bos_token="<|audio_start|>", audio_eos_token="<|audio_end|>",
                            video_token="<|video_pad|>", audio_token="<|audio_pad|>",
                            video_processor=SimpleNamespace(merge_size=processor.merge_size))
    video_inputs = {"video_grid_thw": prompt.mm.video_grid_thw, "video_second_per_grid": [2 / video.fps]}
    layout = hf.Qwen3OmniMoeProcessor.replace_video_with_audio_token(
        names, video_inputs, 0, audio_inputs, 1, position_id_per_seconds=processor.position_id_per_seconds)
    tok = processor.tokenizer
    expanded: list[int] = []
    for t in ids:
        if t == processor.audio_token_id:
            expanded += [t] * int(audio_inputs["num_audio_tokens"][0])
        elif t == processor.video_token_id:
            expanded += tok(layout, add_special_tokens=False).input_ids
        else:
            expanded.append(t)
    inputs = {"input_features": features["input_features"], "feature_attention_mask": features["attention_mask"],
              "pixel_values_videos": prompt.mm.pixel_values_videos, "video_grid_thw": prompt.mm.video_grid_thw,
              "video_second_per_grid": torch.tensor([2 / video.fps]), "use_audio_in_video": True}
    return expanded, inputs


@pytest.fixture(scope="module")
def models(tiny_dir: Path) -> tuple[Thinker, torch.nn.Module]:
    from transformers import Qwen3OmniMoeForConditionalGeneration

    ours = Thinker.from_checkpoint(tiny_dir, dtype=torch.float32)
    ref = Qwen3OmniMoeForConditionalGeneration.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    return ours, ref.thinker


def test_prompt_layout_and_features_match_the_processor(case, prompt: Qwen3OmniPrompt, reference) -> None:  # noqa: ANN001
    processor = case[0]
    ids, inputs = reference
    assert prompt.token_ids == ids
    # The video's stretch alternates runs (steps at 0 and 13 position ids, its audio at 0..25): video, audio,
    # video, audio, not the video then its audio.
    start = ids.index(processor.tokenizer.convert_tokens_to_ids("<|vision_start|>"))
    pads = [t for t in ids[start:] if t in (processor.audio_token_id, processor.video_token_id)]
    runs = [t for i, t in enumerate(pads) if i == 0 or pads[i - 1] != t]
    assert runs == [processor.video_token_id, processor.audio_token_id] * 2
    torch.testing.assert_close(prompt.mm.input_features, inputs["input_features"], atol=1e-6, rtol=0)
    assert torch.equal(prompt.mm.feature_attention_mask, inputs["feature_attention_mask"])


def _ours(thinker: Thinker, ids: torch.Tensor, prompt: Qwen3OmniPrompt, generated: list[int]) -> torch.Tensor:
    embeds = thinker.embed(ids, prompt.mm)
    positions, delta = thinker.positions(ids, prompt.mm)
    tail = torch.tensor(generated, dtype=torch.long)
    all_ids = torch.cat([ids, tail])
    all_embeds = torch.cat([embeds.inputs_embeds, thinker.embed_tokens(tail)])
    all_pos = torch.cat([positions, (torch.arange(len(ids), len(all_ids)) + delta).expand(3, -1)], dim=1)
    meta = ForwardContext(AttentionMetadata.for_fresh_sequences([len(all_ids)]), TorchSDPABackend())
    with torch.no_grad(), forward_context(meta):
        return thinker.compute_logits(thinker(all_ids, all_pos, all_embeds, embeds.deepstack))


def test_positions_logits_and_greedy_tokens_match_transformers(models, prompt, reference) -> None:  # noqa: ANN001
    ours, ref = models
    ref_ids, inputs = reference
    ids = torch.tensor(prompt.token_ids)
    mask = torch.ones(1, len(ids), dtype=torch.long)
    expected_pos, expected_delta = ref.get_rope_index(ids[None], None, prompt.mm.video_grid_thw, mask, True,
                                                      prompt.mm.audio_lengths(), inputs["video_second_per_grid"])
    positions, delta = ours.positions(ids, prompt.mm)
    assert torch.equal(positions, expected_pos[:, 0].long()) and delta == int(expected_delta)
    generated: list[int] = []
    for _ in range(3):
        logits = _ours(ours, ids, prompt, generated)
        full = torch.tensor(ref_ids + generated)[None]
        with torch.no_grad():
            expected = ref(input_ids=full, attention_mask=torch.ones_like(full), **inputs).logits[0]
        torch.testing.assert_close(logits, expected, atol=ATOL, rtol=0)
        assert int(logits[-1].argmax()) == int(expected[-1].argmax())
        generated.append(int(expected[-1].argmax()))


def test_lazy_item_encoding_equals_the_eager_prompt(models, prompt: Qwen3OmniPrompt) -> None:  # noqa: ANN001
    """The engine's path: the video's and its track's rows interleave, each item encoded on its own."""
    ours, _ = models
    ids = torch.tensor(prompt.token_ids)
    media = PromptMedia.build(ours, ids, prompt.mm)
    assert sorted(item.kind for item in media.items) == ["audio", "audio", "video"]
    for start in range(0, len(ids), 50):  # prefill chunks that cut through the interleaved stretch
        encode_needed(ours, [(media, start, start + 50)])
    eager = ours.embed(ids, prompt.mm)
    torch.testing.assert_close(media.embeds, eager.inputs_embeds, atol=1e-6, rtol=1e-5)
