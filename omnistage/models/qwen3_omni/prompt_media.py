"""A thinker prompt's embeddings with each multimodal item encoded only when a step first computes its rows.

At request build the prompt gets its token embeddings for every row; each
audio/image/video keeps its encoder inputs and the rows it fills. Before a
step computes prompt rows ``[start, end)``, :func:`encode_needed` runs the
encoders over the not-yet-encoded items overlapping that range (one call per
modality for the whole step) and writes their features, and the deepstack
features of visual items, into the prompt's buffers. An item whose rows all
lie in a prefix-cache hit is never encoded: in a multi-turn voice session a
turn encodes only its new audio, not every earlier turn's again. An item once
encoded stays written, so a recompute after preemption reuses its rows; one
skipped at admission and needed after a preemption is encoded then.

Encoding items apart (or batched with other items) gives the rows the eager
:meth:`Thinker.embed` gives: an audio's rows depend on its frames alone, an
image's or video's on its own patches and grid (the encoders window their
attention per item). ``tests/models/test_prompt_media.py`` holds them equal.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from omnistage.models.decoder import Deepstack
from omnistage.models.qwen3_omni.mm_spans import placed_items
from omnistage.models.qwen3_omni.inputs import MultimodalInputs

if TYPE_CHECKING:
    from omnistage.models.qwen3_omni.thinker import Thinker


@dataclass
class MediaItem:
    """One audio, image or video of a prompt: the rows it fills and, until encoded, its encoder inputs."""

    kind: str  # "audio", "image" or "video"
    rows: torch.Tensor  # int64 prompt rows, ascending
    inputs: tuple[torch.Tensor, ...] | None  # audio: (mel frames,); visual: (grid_thw, patches); None once encoded

    def overlaps(self, start: int, end: int) -> bool:
        return bool(((self.rows >= start) & (self.rows < end)).any())


@dataclass
class PromptMedia:
    """The prompt's embeddings ``[L, H]`` (the request's ``prompt_embeds``), filled item by item."""

    embeds: torch.Tensor
    items: list[MediaItem]
    encoded: list[int] = field(default_factory=list)  # item indices in the order they were encoded (each once)
    _deepstack_rows: torch.Tensor = field(init=False)  # every visual item's rows, ascending
    _deepstack_features: torch.Tensor | None = field(init=False, default=None)  # [layers, V, H], at first visual

    def __post_init__(self) -> None:
        visual = [item.rows for item in self.items if item.kind != "audio"]
        rows = torch.cat(visual) if visual else torch.empty(0, dtype=torch.long)
        self._deepstack_rows = rows.sort().values

    @classmethod
    @torch.no_grad()
    def build(cls, thinker: Thinker, input_ids: torch.Tensor, mm: MultimodalInputs) -> PromptMedia:
        """Token embeddings of ``input_ids [L]`` and the prompt's items, none encoded yet."""
        placed = placed_items(input_ids.tolist(), mm, thinker.mrope_tokens)
        if placed is None:
            raise ValueError("the prompt's audio/image/video placeholders do not match its media inputs")
        items = [MediaItem(kind, torch.tensor(rows, dtype=torch.long), _encoder_inputs(kind, content))
                 for kind, rows, content in placed]
        return cls(thinker.embed_tokens(input_ids), items)

    def pending(self, start: int, end: int) -> list[int]:
        """Items not yet encoded with rows in ``[start, end)``."""
        return [i for i, item in enumerate(self.items) if item.inputs is not None and item.overlaps(start, end)]

    def fill(self, index: int, features: torch.Tensor, deepstack: Sequence[torch.Tensor] = ()) -> None:
        """Writes item ``index``'s encoder output at its rows and drops its inputs."""
        item = self.items[index]
        if features.shape[0] != item.rows.numel():
            raise ValueError(f"{item.kind} item {index} fills {item.rows.numel()} rows but has "
                             f"{features.shape[0]} features")
        rows = item.rows.to(self.embeds.device)
        self.embeds[rows] = features.to(self.embeds.dtype)
        if deepstack:
            self._fill_deepstack(item.rows, torch.stack(list(deepstack)))
        item.inputs = None
        self.encoded.append(index)

    def _fill_deepstack(self, rows: torch.Tensor, layers: torch.Tensor) -> None:
        if self._deepstack_features is None:
            self._deepstack_features = layers.new_zeros(layers.shape[0], self._deepstack_rows.numel(), layers.shape[-1])
        where = torch.searchsorted(self._deepstack_rows, rows).to(layers.device)
        self._deepstack_features[:, where] = layers.to(self._deepstack_features.dtype)

    def deepstack(self, start: int, end: int) -> Deepstack | None:
        """The deepstack part of prompt rows ``[start, end)``, re-based to 0 (their items must be encoded)."""
        if self._deepstack_features is None:
            return None
        rows = self._deepstack_rows.to(self._deepstack_features.device)
        return Deepstack(rows, self._deepstack_features).select(start, end)


def _encoder_inputs(kind: str, content: Sequence[torch.Tensor | float]) -> tuple[torch.Tensor, ...]:
    tensors = tuple(part for part in content if isinstance(part, torch.Tensor))  # drops seconds per grid
    return tensors if kind == "audio" else tensors[:2]


def encode_needed(thinker: Thinker, needs: Sequence[tuple[PromptMedia, int, int]]) -> None:
    """Encodes every item not yet encoded that overlaps one of the ``(media, start, end)`` prompt ranges a
    step is about to compute: one encoder call per modality over all such items, in request order."""
    todo: dict[str, list[tuple[PromptMedia, int]]] = {"audio": [], "image": [], "video": []}
    for media, start, end in needs:
        for index in media.pending(start, end):
            todo[media.items[index].kind].append((media, index))
    audios = todo["audio"]
    if audios:
        features = thinker.encode_audios([_inputs(m, i)[0] for m, i in audios])
        for (media, index), rows in zip(audios, features):
            media.fill(index, rows)
    for kind in ("image", "video"):
        visual = todo[kind]
        if visual:
            grids, pixels = zip(*(_inputs(m, i) for m, i in visual))
            for (media, index), (rows, layers) in zip(visual, thinker.encode_visuals(list(pixels), list(grids))):
                media.fill(index, rows, layers)


def _inputs(media: PromptMedia, index: int) -> tuple[torch.Tensor, ...]:
    inputs = media.items[index].inputs
    if inputs is None:
        raise RuntimeError(f"item {index} was already encoded")
    return inputs
