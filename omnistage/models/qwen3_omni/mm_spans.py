"""Where each multimodal item of a thinker prompt sits, and a digest of its content (what prefix-cache keys hash).

The placeholder ids of two different audios are equal, so a prompt with media
is identified by its ids plus what fills the placeholders. Each item (an audio,
an image, a video) is hashed from the encoder inputs that determine its rows
and its M-RoPE positions: an audio window's valid mel frames (an audio is one
item per attention window of its encoder, ``n_window_infer`` frames), the
image's patches and grid, the video's patches, grid and seconds per grid step. An item covers its
placeholder run ``[first, last + 1)`` (a video with interleaved audio: the
whole stretch, so blocks there carry both items' keys).

A prompt whose placeholders and items do not pair up exactly (a literal
``<|audio_pad|>`` in text, a count mismatch) gets None: it is never shared.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from omnistage.models.media_items import MediaItem, PlacedItem, place_items, visual_items
from omnistage.models.qwen3_omni.inputs import MultimodalInputs
from omnistage.models.qwen3_omni.mrope import MRopeTokens, audio_output_length


def placed_items(token_ids: Sequence[int], mm: MultimodalInputs, tokens: MRopeTokens) -> list[PlacedItem] | None:
    """Each item as (modality tag, the prompt rows its features fill, its encoder inputs), in processor order
    (audios, images, videos); None when the items do not exactly fill the placeholders. Audio content is the
    valid mel frames ``[mel, frames]``; visual content is ``(grid_thw [3], patches[, seconds per grid])``."""
    merge = tokens.spatial_merge_size
    return place_items(token_ids, (
        (tokens.audio_token_id, _audio_items(mm, tokens.audio_n_window, audio_window_frames(tokens))),
        (tokens.image_token_id, visual_items("image", mm.pixel_values, mm.image_grid_thw, None, merge)),
        (tokens.video_token_id, visual_items("video", mm.pixel_values_videos, mm.video_grid_thw,
                                             mm.video_second_per_grid, merge))))


def audio_window_frames(tokens: MRopeTokens) -> int:
    """Mel frames per audio item: the encoder's attention window when it is a whole number of conv chunks
    (``2·n_window`` frames, so a window's rows are its own), else 0 (each audio one item)."""
    window, chunk = tokens.audio_n_window_infer, 2 * tokens.audio_n_window
    return window if window > 0 and window % chunk == 0 else 0


def _audio_items(mm: MultimodalInputs, n_window: int, window: int) -> Iterator[MediaItem]:
    """Each audio as one item per encoder attention window (``window`` frames; the last one partial): a window's
    rows depend on its frames alone, so a prompt whose audio grows (a user still speaking) keeps the keys of its
    completed windows, and a prefix-cache hit over them skips their encoding too."""
    if mm.input_features is None or mm.feature_attention_mask is None:
        return
    for features, mask in zip(mm.input_features, mm.feature_attention_mask.bool()):
        frames = features[:, mask]
        step = window or frames.shape[1]
        for start in range(0, frames.shape[1], step):
            piece = frames[:, start:start + step]
            yield "audio", audio_output_length(piece.shape[1], n_window), (piece,)
