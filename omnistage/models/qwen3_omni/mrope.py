"""M-RoPE position ids of one multimodal prompt, as transformers' ``get_rope_index`` computes them.

Text and audio tokens advance all three rows (t, h, w) together, one per
token. An image or video placeholder run gets a 3-D grid: row t = frame index
scaled to ``position_id_per_seconds``, rows h/w = the merged patch's row and
column, all offset by the run's start. The text after a multimodal item resumes
at the largest position used so far + 1, so prompts with images have fewer
distinct positions than tokens; ``delta = max + 1 - len`` shifts every
generated token (position of token ``i >= len`` is ``i + delta`` on all rows).

Differences from transformers, by design:
* positions are int64 and the delta an int. transformers keeps float
  positions, which matter only for videos whose ``second_per_grid *
  position_id_per_seconds`` is fractional; those temporal positions are floored
  here (as vLLM does).
* prompts are single sequences without padding (the engine never pads).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from omnistage.models.qwen3_audio_encoder import audio_output_length

from omnistage.models.mrope_tokens import MediaTokens

if TYPE_CHECKING:
    from transformers import PretrainedConfig


@dataclass(frozen=True)
class MRopeTokens(MediaTokens):
    """The token ids and constants that shape M-RoPE positions (from the thinker config)."""

    audio_n_window: int
    # Mel frames per attention window of the audio encoder (AuT): each window's rows depend on its frames alone,
    # so an audio is keyed and encoded window by window (0: one window, the whole audio).
    audio_n_window_infer: int = 0

    @classmethod
    def from_thinker_config(cls, cfg: PretrainedConfig) -> MRopeTokens:
        return cls(
            image_token_id=cfg.image_token_id, video_token_id=cfg.video_token_id,
            audio_token_id=cfg.audio_token_id, vision_start_token_id=cfg.vision_start_token_id,
            audio_start_token_id=cfg.audio_start_token_id,
            spatial_merge_size=cfg.vision_config.spatial_merge_size,
            position_id_per_seconds=cfg.position_id_per_seconds, audio_n_window=cfg.audio_config.n_window,
            audio_n_window_infer=int(getattr(cfg.audio_config, "n_window_infer", 0) or 0),
        )


def mrope_positions(
    input_ids: Sequence[int] | torch.Tensor,
    tokens: MRopeTokens,
    image_grid_thw: torch.Tensor | None = None,
    video_grid_thw: torch.Tensor | None = None,
    audio_lengths: Sequence[int] | torch.Tensor | None = None,
    second_per_grid: Sequence[float] | torch.Tensor | None = None,
) -> tuple[torch.Tensor, int]:
    """Positions ``[3, L]`` (int64) and the decode delta of one prompt.

    audio_lengths: mel frames of each audio in prompt order (the feature
    attention mask's row sums). second_per_grid: seconds per temporal grid step
    of each video. Items are consumed in prompt order; a vision start followed
    directly by an audio start is a video with its audio interleaved
    (``use_audio_in_video``).
    """
    ids = input_ids.tolist() if isinstance(input_ids, torch.Tensor) else list(input_ids)
    has_grid = any(g is not None and len(g) > 0 for g in (image_grid_thw, video_grid_thw))
    if not has_grid:
        # Audio advances positions one per token, like text: nothing to lay out.
        return torch.arange(len(ids), dtype=torch.long).expand(3, -1).clone(), 0
    walker = _Walker(ids, tokens, image_grid_thw, video_grid_thw, audio_lengths, second_per_grid)
    positions = walker.run()
    delta = int(positions.max().floor().item()) + 1 - len(ids)
    return positions.floor().long(), delta


class _Walker:
    """Lays out one prompt as a list of position blocks (float ``[3, n]`` each), item by item."""

    def __init__(
        self,
        ids: list[int],
        tokens: MRopeTokens,
        image_grid_thw: torch.Tensor | None,
        video_grid_thw: torch.Tensor | None,
        audio_lengths: Sequence[int] | torch.Tensor | None,
        second_per_grid: Sequence[float] | torch.Tensor | None,
    ) -> None:
        self.ids, self.tok = ids, tokens
        self.images = [] if image_grid_thw is None else [tuple(int(x) for x in g) for g in image_grid_thw]
        self.videos = [] if video_grid_thw is None else [tuple(int(x) for x in g) for g in video_grid_thw]
        self.audios = [] if audio_lengths is None else [int(n) for n in audio_lengths]
        self.seconds = torch.as_tensor(second_per_grid if second_per_grid is not None else [], dtype=torch.float32)
        self.blocks: list[torch.Tensor] = []
        self.counts = {"image": 0, "video": 0, "audio": 0}

    def run(self) -> torch.Tensor:
        st = 0
        while (start := self._next_item(st)) is not None:
            self._text(start - st)
            st = start + self._item(start)
        self._text(len(self.ids) - st)
        return torch.cat(self.blocks, dim=1)

    def _next_item(self, st: int) -> int | None:
        starts = (self.tok.vision_start_token_id, self.tok.audio_start_token_id)
        return next((i for i in range(st, len(self.ids)) if self.ids[i] in starts), None)

    def _next_pos(self) -> float:
        # The reference resumes after the max of the *last* block, not of all blocks.
        return float(self.blocks[-1].max()) + 1 if self.blocks else 0.0

    def _append_run(self, n: int, start: float | None = None) -> None:
        if n > 0:
            first = self._next_pos() if start is None else start
            self.blocks.append(torch.arange(n).view(1, -1).expand(3, -1).float() + first)

    def _text(self, n: int) -> None:
        self._append_run(n)

    def _item(self, at: int) -> int:
        """Lays out the item whose start token is at ``at``; returns how many tokens it spans."""
        tok, follower = self.tok, self.ids[at + 1] if at + 1 < len(self.ids) else None
        is_vision = self.ids[at] == tok.vision_start_token_id
        audio_in_video = is_vision and follower == tok.audio_start_token_id
        edge = 2 if audio_in_video else 1  # start and end markers (two each for audio in video)
        self._append_run(edge)
        start = self._next_pos()
        if not is_vision:
            length = self._audio(start)
        elif audio_in_video:
            length = self._audio_in_video(start)
        elif follower == tok.image_token_id:
            length = self._vision("image", start)
        elif follower == tok.video_token_id:
            length = self._vision("video", start)
        else:
            raise ValueError(f"vision start at {at} is followed by token {follower}, not an image/video/audio start")
        self._append_run(edge)
        return edge + length + edge

    def _take(self, kind: str) -> int:
        index = self.counts[kind]
        available = {"image": self.images, "video": self.videos, "audio": self.audios}[kind]
        if index >= len(available):
            raise ValueError(f"prompt has more {kind} items than the {len(available)} given")
        self.counts[kind] += 1
        return index

    def _audio_block(self, start: float) -> torch.Tensor:
        n = audio_output_length(self.audios[self._take("audio")], self.tok.audio_n_window)
        return torch.arange(n).view(1, -1).expand(3, -1).float() + start

    def _audio(self, start: float) -> int:
        block = self._audio_block(start)
        self.blocks.append(block)
        return block.shape[1]

    def _vision_block(self, kind: str, start: float) -> torch.Tensor:
        index = self._take(kind)
        t, h, w = (self.images if kind == "image" else self.videos)[index]
        pps = self.tok.position_id_per_seconds
        if kind == "image":
            t_index = (torch.arange(t) * 1 * pps).float()
        else:
            if index >= len(self.seconds):
                raise ValueError(f"video {index} has no second_per_grid")
            t_index = (torch.arange(t) * self.seconds[index] * pps).float()
        gh, gw = h // self.tok.spatial_merge_size, w // self.tok.spatial_merge_size
        h_index = torch.arange(gh).view(1, -1, 1).expand(t, -1, gw).flatten().float()
        w_index = torch.arange(gw).view(1, 1, -1).expand(t, gh, -1).flatten().float()
        t_index = t_index.view(-1, 1).expand(-1, gh * gw).flatten()
        return torch.stack([t_index, h_index, w_index]) + start

    def _vision(self, kind: str, start: float) -> int:
        block = self._vision_block(kind, start)
        self.blocks.append(block)
        return block.shape[1]

    def _audio_in_video(self, start: float) -> int:
        """Video and audio positions merged by temporal position, video first on ties."""
        video = self._vision_block("video", start)
        audio = self._audio_block(start)
        order = torch.argsort(torch.cat([video[0], audio[0]]), stable=True)
        merged = torch.cat([video, audio], dim=1)[:, order]
        source = (order >= video.shape[1])
        # The reference appends the leftover of whichever stream outlasts the
        # other as its last block; the next item resumes after that block's max.
        differs = (source != source[-1]).nonzero()
        tail_start = int(differs[-1]) + 1 if len(differs) else 0
        self.blocks.append(merged[:, :tail_start])
        self.blocks.append(merged[:, tail_start:])
        return merged.shape[1]
