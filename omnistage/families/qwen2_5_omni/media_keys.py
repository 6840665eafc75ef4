"""Where each media item of a Qwen2.5-Omni thinker prompt sits, and a digest of its content: its prefix-cache keys.

The placeholder ids of two different audios are equal, so a prompt with media is identified by its ids plus what
fills the placeholders. Each item is keyed over its placeholder rows by the encoder inputs that make its rows and
their TMRoPE positions: an audio one item per conv chunk of its encoder (``2·n_window`` mel frames, 2 s: the
encoder attends within a chunk and pools row pairs inside it, so a chunk's 50 rows are its frames' alone, and a
growing audio keeps its completed chunks' keys), an image its patches and grid, a video its patches, grid and
seconds per grid step. A video with its sound track interleaved (``use_audio_in_video``) lays both out by time, so
such a prompt is keyed as one item over its whole media stretch, its digest every encoder input.

A prompt whose placeholders and items do not pair up exactly (a count mismatch) gets None: it is never shared.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from omnistage.engine.request import MultimodalSpan
from omnistage.models.media_items import MediaItem, item_digest, place_items, visual_items
from omnistage.models.qwen2_5_omni.inputs import OmniInputs
from omnistage.models.qwen2_5_omni.tmrope import audio_output_length

# One item: (modality tag, placeholder rows it fills, the tensors and numbers its content is).


@dataclass(frozen=True)
class MediaLayout:
    """The thinker's placeholder ids and the sizes that turn encoder inputs into rows."""

    audio_token_id: int
    image_token_id: int
    video_token_id: int
    merge_size: int  # the vision merger's side: merge² patches make a row
    audio_chunk_frames: int  # the audio encoder's conv chunk, 2·n_window mel frames

    @classmethod
    def from_config(cls, thinker_config: object) -> MediaLayout:
        c = thinker_config
        return cls(c.audio_token_index, c.image_token_index, c.video_token_index,
                   c.vision_config.spatial_merge_size, 2 * c.audio_config.n_window)

    @property
    def tokens(self) -> tuple[int, int, int]:
        return self.audio_token_id, self.image_token_id, self.video_token_id


def media_spans(token_ids: Sequence[int], mm: OmniInputs, layout: MediaLayout) -> tuple[MultimodalSpan, ...] | None:
    """The prompt's items' spans with their digests; () without media."""
    if not mm.has_media:
        return ()
    if mm.use_audio_in_video:
        rows = [i for i, t in enumerate(token_ids) if t in layout.tokens]
        return (MultimodalSpan(rows[0], rows[-1] + 1, _digest("all", _all_inputs(mm))),) if rows else None
    merge = layout.merge_size
    placed = place_items(token_ids, (
        (layout.audio_token_id, _audio_items(mm, layout.audio_chunk_frames)),
        (layout.image_token_id, visual_items("image", mm.pixel_values, mm.image_grid_thw, None, merge)),
        (layout.video_token_id, visual_items("video", mm.pixel_values_videos, mm.video_grid_thw,
                                             mm.video_second_per_grid, merge))),
        skip_empty=True)  # an audio's last chunk of a frame or two has no row of its own
    if placed is None:
        return None
    return tuple(MultimodalSpan(rows[0], rows[-1] + 1, _digest(tag, content)) for tag, rows, content in placed)


def _audio_items(mm: OmniInputs, chunk: int) -> Iterator[MediaItem]:
    if mm.input_features is None or mm.feature_attention_mask is None:
        return
    for features, mask in zip(mm.input_features, mm.feature_attention_mask.bool()):
        frames = features[:, mask]
        for start in range(0, frames.shape[1], chunk):
            piece = frames[:, start:start + chunk]
            yield "audio", audio_output_length(piece.shape[1]), (piece,)




def _all_inputs(mm: OmniInputs) -> list[torch.Tensor]:
    return [v for name in mm.__struct_fields__ if isinstance(v := getattr(mm, name), torch.Tensor)]


def _digest(tag: str, content: Sequence[torch.Tensor | float]) -> bytes:
    return item_digest(f"qwen2_5_omni.{tag}", content)  # the family's own tags: its keys never meet Qwen3-Omni's
