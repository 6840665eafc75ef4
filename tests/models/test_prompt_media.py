"""Lazy per-item encoding (``PromptMedia``) gives exactly the rows of the eager, batched-per-prompt ``Thinker.embed``.

A prompt with three audios, two images and two videos on the tiny thinker is
encoded whole, item by item, and in chunk-sized ranges; the embeddings and the
deepstack features must equal the eager path's every time. Rows are compared exactly (integers); features within
a tolerance: encoding one item alone runs other matmul shapes than the batch, and BLAS picks a kernel per shape
(on AMD EPYC the two differ by ~3e-8), while a misplaced or missing row differs by ~1e-2.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from omnistage.models.qwen3_omni.prompt_media import PromptMedia, encode_needed
from omnistage.models.qwen3_omni.thinker import Thinker
from omnistage.families.qwen3_omni.prompt import Qwen3OmniPrompt, Qwen3OmniPromptProcessor
from omnistage.processing.video import Video
from tests.entrypoints.test_realtime import spoken_like


@pytest.fixture(scope="module")
def thinker(tiny_dir: Path) -> Thinker:
    return Thinker.from_checkpoint(tiny_dir, "cpu", torch.float32)


@pytest.fixture(scope="module")
def prompt(tiny_dir: Path) -> Qwen3OmniPrompt:
    processor = Qwen3OmniPromptProcessor.from_folder(tiny_dir)
    rng = np.random.default_rng(3)

    def frame(h: int, w: int) -> Image.Image:
        return Image.fromarray((rng.random((h, w, 3)) * 255).astype(np.uint8))

    audios = [spoken_like(s, 16000, seed=i) for i, s in enumerate((1.0, 0.4, 2.7))]
    images = [frame(128, 160), frame(64, 96)]
    videos = [Video([frame(64, 64) for _ in range(4)], fps=2.0), Video([frame(96, 64) for _ in range(2)], fps=1.0)]
    parts = ([{"type": "audio"}, {"type": "image"}, {"type": "text", "text": "and"}, {"type": "video"},
              {"type": "audio"}, {"type": "image"}, {"type": "video"}, {"type": "audio"},
              {"type": "text", "text": "what now?"}])
    ids = processor.apply_chat_template([{"role": "user", "content": parts}])
    return processor.process(ids, audios=audios, images=images, videos=videos)


# fp32 features of magnitude ~0.05: 1e-6 absolute is 30x the cross-kernel noise and 1e4x below a wrong row.
TOLERANCE = {"atol": 1e-6, "rtol": 1e-5}


def _check(media: PromptMedia, thinker: Thinker, prompt: Qwen3OmniPrompt) -> None:
    eager = thinker.embed(torch.tensor(prompt.token_ids), prompt.mm)
    torch.testing.assert_close(media.embeds, eager.inputs_embeds, **TOLERANCE)
    lazy = media.deepstack(0, len(prompt.token_ids))
    assert lazy is not None and eager.deepstack is not None
    assert torch.equal(lazy.rows, eager.deepstack.rows)
    torch.testing.assert_close(lazy.features, eager.deepstack.features, **TOLERANCE)


def test_items_encoded_in_any_grouping_equal_the_eager_prompt(thinker: Thinker, prompt: Qwen3OmniPrompt) -> None:
    ids = torch.tensor(prompt.token_ids)
    kinds = [item.kind for item in PromptMedia.build(thinker, ids, prompt.mm).items]
    assert sorted(kinds) == ["audio"] * 3 + ["image"] * 2 + ["video"] * 2

    whole = PromptMedia.build(thinker, ids, prompt.mm)
    encode_needed(thinker, [(whole, 0, len(ids))])  # one call per modality, as the eager path
    _check(whole, thinker, prompt)

    alone = PromptMedia.build(thinker, ids, prompt.mm)
    for item in reversed(alone.items):  # one item per call, last first
        encode_needed(thinker, [(alone, int(item.rows[0]), int(item.rows[0]) + 1)])
    _check(alone, thinker, prompt)

    chunked = PromptMedia.build(thinker, ids, prompt.mm)
    for start in range(0, len(ids), 13):  # prefill chunks: an item is encoded at the first chunk it reaches
        encode_needed(thinker, [(chunked, start, start + 13)])
    _check(chunked, thinker, prompt)
    assert sorted(chunked.encoded) == list(range(len(kinds)))  # each item encoded exactly once


def test_only_items_overlapping_the_range_are_encoded(thinker: Thinker, prompt: Qwen3OmniPrompt) -> None:
    ids = torch.tensor(prompt.token_ids)
    media = PromptMedia.build(thinker, ids, prompt.mm)
    second = media.items[1]
    start = int(second.rows[0])
    encode_needed(thinker, [(media, start, start + 1)])
    assert media.encoded == [1]
    assert media.pending(0, len(ids)) == [i for i in range(len(media.items)) if i != 1]
    encode_needed(thinker, [(media, start, start + 1)])  # already there: nothing runs again
    assert media.encoded == [1]
