"""Qwen2.5-Omni's prefix-cache keys of a prompt's media: one per item over its placeholder rows (an audio one per
2 s encoder chunk), so prompts share blocks up to their first differing item, and never past it."""

from __future__ import annotations

from pathlib import Path

from PIL import Image

from omnistage.families.qwen2_5_omni.family import FAMILY
from omnistage.families.qwen2_5_omni.media_keys import MediaLayout, media_spans
from tests.entrypoints.test_realtime import spoken_like


def _image(color: tuple[int, int, int]) -> Image.Image:
    return Image.new("RGB", (56, 56), color)


def test_each_item_and_audio_chunk_has_its_own_key(omni25_dir: Path) -> None:
    config = FAMILY.load_config(omni25_dir)
    processor = FAMILY.front_end(omni25_dir, config).processor
    layout = MediaLayout.from_config(config.hf.thinker_config)
    ids = [processor.image_token_id, 7, processor.audio_token_id, 8, processor.image_token_id]
    audio = spoken_like(5.0, 16000, seed=2)  # 500 mel frames: chunks of 200, 200 and 100 (50, 50, 25 rows)
    one = processor.process(ids, audios=[audio], images=[_image((200, 0, 0)), _image((0, 200, 0))])
    two = processor.process(ids, audios=[audio], images=[_image((200, 0, 0)), _image((0, 0, 200))])
    a, b = media_spans(one.token_ids, one.mm, layout), media_spans(two.token_ids, two.mm, layout)
    assert [s.end - s.start for s in a] == [50, 50, 25, 4, 4]  # audios first, then images (56 px: 4 rows)
    pads = {t: [i for i, x in enumerate(one.token_ids) if x == t] for t in layout.tokens}
    assert a[0].start == pads[processor.audio_token_id][0] and a[2].end == pads[processor.audio_token_id][-1] + 1
    assert (a[3].start, a[4].end) == (pads[processor.image_token_id][0], pads[processor.image_token_id][-1] + 1)
    assert [x.content_hash == y.content_hash for x, y in zip(a, b, strict=True)] == [True] * 4 + [False]
    assert media_spans(one.token_ids[:-1], one.mm, layout) is None  # an item without its placeholders: unkeyed
