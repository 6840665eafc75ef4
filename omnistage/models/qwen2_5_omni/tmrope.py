"""TMRoPE: Qwen2.5-Omni's time-aligned M-RoPE position ids of one prompt, as transformers' ``get_rope_index``.

Every token gets three positions (temporal, height, width); text advances all three together. An audio's rows
sit on consecutive positions between its bos and eos; an image's or a video's rows take their grid's height and
width indices, a video's temporal index advancing ``second_per_grid * position_id_per_seconds`` per grid step (an
image's ``position_id_per_seconds`` per step). With ``use_audio_in_video`` a video's placeholder stretch is
``<vision_bos><audio_bos> video/audio rows <audio_eos><vision_eos>``, the video's and the audio's rows interleaved
in chunks of ``position_id_per_seconds * seconds_per_chunk`` temporal positions (video first in each chunk), both
starting at the same position.

A prompt with no image and no video gets plain sequential positions (transformers' quirk: its audio-only branch
never lays out audio; the positions are the same anyway). Ported from transformers 5.24's
``Qwen2_5OmniPreTrainedModelForConditionalGeneration.get_rope_index`` for one unpadded sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from omnistage.models.mrope_tokens import MediaTokens


@dataclass(frozen=True)
class TMRopeTokens(MediaTokens):
    """The ids and settings the layout reads (from the thinker config, or the talker config for the talker)."""

    seconds_per_chunk: float

    @classmethod
    def from_config(cls, config: object, spatial_merge_size: int) -> TMRopeTokens:
        """transformers' thinker/talker configs name the ids ``*_token_index`` (aliased ``*_token_id``)."""
        return cls(config.image_token_index, config.video_token_index, config.audio_token_index,
                   config.vision_start_token_id, config.audio_start_token_id, spatial_merge_size,
                   config.position_id_per_seconds, config.seconds_per_chunk)


@dataclass(frozen=True)
class MediaGrids:
    """What the layout needs of a prompt's items: per audio its valid mel frames, per image/video its grid."""

    audio_frames: tuple[int, ...] = ()
    image_grid_thw: torch.Tensor | None = None  # [I, 3]
    video_grid_thw: torch.Tensor | None = None  # [V, 3]
    video_second_per_grid: torch.Tensor | None = None  # [V]


def audio_output_length(frames: int) -> int:
    """Encoder rows of an audio of ``frames`` valid mel frames (conv stride 2, then pooling by 2)."""
    return ((frames - 1) // 2 + 1 - 2) // 2 + 1


def _run(length: int, start: int) -> torch.Tensor:
    return torch.arange(length).view(1, -1).expand(3, -1) + start


class _Layout:
    """Position runs appended in order; each new run starts after the largest position so far."""

    def __init__(self) -> None:
        self.runs: list[torch.Tensor] = []

    def next(self) -> int:
        return int(self.runs[-1].max()) + 1 if self.runs else 0

    def text(self, length: int) -> None:
        if length:
            self.runs.append(_run(length, self.next()))


def _vision_positions(start: int, grid: torch.Tensor, t_index: torch.Tensor, merge: int) -> torch.Tensor:
    h, w = int(grid[1]) // merge, int(grid[2]) // merge
    steps = len(t_index)
    h_index = torch.arange(h).view(1, -1, 1).expand(steps, -1, w).flatten()
    w_index = torch.arange(w).view(1, 1, -1).expand(steps, h, -1).flatten()
    t = t_index.view(-1, 1).expand(-1, h * w).flatten().long()
    return torch.stack([t, h_index, w_index]) + start


def _chunks(index: torch.Tensor, per_chunk: int, origin: int) -> list[tuple[int, int]]:
    """transformers' ``get_chunked_index``: slices of ``index`` whose values (less ``origin``) fall in successive
    ranges of ``per_chunk``."""
    out, start, chunk = [], 0, 1
    for i in range(len(index)):
        if int(index[i]) - origin >= chunk * per_chunk:
            out.append((start, i))
            start, chunk = i, chunk + 1
    out.append((start, len(index)))
    return out


class _Walker:
    """One pass over the prompt's placeholders, in order, as the reference's loop."""

    def __init__(self, ids: list[int], tokens: TMRopeTokens, media: MediaGrids) -> None:
        self.ids, self.tokens, self.media = ids, tokens, media
        self.layout = _Layout()
        self.st = 0
        self.audio = self.image = self.video = 0

    def _t_index(self, grid: torch.Tensor, seconds: float) -> torch.Tensor:
        return (torch.arange(int(grid[0])) * seconds * self.tokens.position_id_per_seconds).long()

    def audio_item(self, at: int) -> None:
        lay = self.layout
        text_len = at - self.st - 1
        lay.text(text_len)
        lay.text(1)  # bos
        length = audio_output_length(self.media.audio_frames[self.audio])
        lay.text(length)
        lay.text(1)  # eos
        self.st += text_len + length + 2
        self.audio += 1

    def visual_item(self, at: int, grid: torch.Tensor, seconds: float) -> None:
        lay = self.layout
        text_len = at - self.st - 1
        lay.text(text_len)
        lay.text(1)  # vision bos
        merge = self.tokens.spatial_merge_size
        lay.runs.append(_vision_positions(lay.next(), grid, self._t_index(grid, seconds), merge))
        lay.text(1)  # vision eos
        self.st += text_len + int(grid.prod()) // merge**2 + 2

    def video_with_audio(self, at: int) -> None:
        lay, merge = self.layout, self.tokens.spatial_merge_size
        grid = self.media.video_grid_thw[self.video]
        text_len = at - self.st - 2
        lay.text(text_len)
        start = lay.next()
        lay.runs += [_run(1, start), _run(1, start)]  # vision bos, audio bos: one position
        start = lay.next()
        length = audio_output_length(self.media.audio_frames[self.audio])
        audio = _run(length, start)
        seconds = float(self.media.video_second_per_grid[self.video])
        video = _vision_positions(start, grid, self._t_index(grid, seconds), merge)
        per_chunk = int(self.tokens.position_id_per_seconds * self.tokens.seconds_per_chunk)
        v_chunks, a_chunks = _chunks(video[0], per_chunk, start), _chunks(audio[0], per_chunk, start)
        for j in range(max(len(v_chunks), len(a_chunks))):
            for chunks, rows in ((v_chunks, video), (a_chunks, audio)):
                if j < len(chunks):
                    lay.runs.append(rows[:, chunks[j][0]:chunks[j][1]])
        end = lay.next()
        lay.runs += [_run(1, end), _run(1, end)]  # audio eos, vision eos: one position
        self.st += text_len + 4 + length + int(grid.prod()) // merge**2
        self.audio += 1
        self.video += 1


def tmrope_positions(token_ids: torch.Tensor | list[int], tokens: TMRopeTokens, media: MediaGrids,
                     use_audio_in_video: bool = False) -> tuple[torch.Tensor, int]:
    """Positions ``[3, L]`` of a prompt and the delta of its decode positions (token ``L + k`` sits at
    ``L + k + delta``)."""
    ids = token_ids.tolist() if isinstance(token_ids, torch.Tensor) else list(token_ids)
    if media.image_grid_thw is None and media.video_grid_thw is None:
        return _run(len(ids), 0).clone(), 0
    walker = _Walker(ids, tokens, media)
    for kind, at in _placeholders(ids, tokens, media, use_audio_in_video):
        if kind == "audio":
            walker.audio_item(at)
        elif kind == "image":
            walker.visual_item(at, media.image_grid_thw[walker.image], 1.0)
            walker.image += 1
        elif use_audio_in_video:
            walker.video_with_audio(at)
        else:
            seconds = float(media.video_second_per_grid[walker.video])
            walker.visual_item(at, media.video_grid_thw[walker.video], seconds)
            walker.video += 1
    walker.layout.text(len(ids) - walker.st)
    positions = torch.cat(walker.layout.runs, dim=1).reshape(3, -1)
    return positions, int(positions.max()) + 1 - len(ids)


def _placeholders(ids: list[int], tokens: TMRopeTokens, media: MediaGrids,
                  use_audio_in_video: bool) -> list[tuple[str, int]]:
    """Each item's first placeholder row, in prompt order: a run of its pad token right after its opener (an
    audio's ``<audio_bos>``, an image's ``<vision_bos>``, a video's ``<vision_bos>``, or ``<audio_bos>`` when its
    sound track is interleaved with it; the interleaved runs after the first have no opener)."""
    video_opener = tokens.audio_start_token_id if use_audio_in_video else tokens.vision_start_token_id
    found: list[tuple[str, int]] = []
    for kind, token, opener in (("audio", tokens.audio_token_id, tokens.audio_start_token_id),
                                ("image", tokens.image_token_id, tokens.vision_start_token_id),
                                ("video", tokens.video_token_id, video_opener)):
        found += [(kind, i) for i, t in enumerate(ids) if t == token and i > 0 and ids[i - 1] == opener]
    return sorted(found, key=lambda item: item[1])
