"""What both omni families' prefix-cache keys are made of: a prompt's visual items (each image or video with the
rows it fills) and a digest of an item's content.

An item is ``(tag, rows, content)``: its kind, how many placeholder rows it fills, and what its encoder reads
(tensors, and numbers such as a video's seconds per grid). Two items with the same digest encode to the same rows.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Sequence

import torch

MediaItem = tuple[str, int, Sequence[torch.Tensor | float]]
# An item placed in a prompt: its tag, the prompt rows its features fill, its content.
PlacedItem = tuple[str, list[int], Sequence[torch.Tensor | float]]


def place_items(token_ids: Sequence[int], groups: Iterable[tuple[int, Iterable[MediaItem]]],
                skip_empty: bool = False) -> list[PlacedItem] | None:
    """Each group's items (``(placeholder id, items)``, in processor order) on that placeholder's rows of the
    prompt, one after another; None when they do not fill the rows exactly. An item of no rows is refused, or
    skipped with ``skip_empty`` (a family whose last audio chunk of a frame or two has no row of its own)."""
    placed: list[PlacedItem] = []
    for pad, items in groups:
        rows = [i for i, tok in enumerate(token_ids) if tok == pad]
        taken = 0
        for tag, count, content in items:
            if taken + count > len(rows) or (count <= 0 and not skip_empty):
                return None
            if count > 0:
                placed.append((tag, rows[taken:taken + count], content))
            taken += count
        if taken != len(rows):
            return None
    return placed


def visual_items(tag: str, pixels: torch.Tensor | None, grid: torch.Tensor | None,
                 second_per_grid: torch.Tensor | None, merge: int) -> Iterator[MediaItem]:
    """Each image (or video) of a batch of patches ``pixels`` laid out by ``grid`` (``[n, 3]``: t, h, w), its rows
    the patches over ``merge``² (the encoder's spatial merge)."""
    if pixels is None or grid is None:
        return
    start = 0
    for i, thw in enumerate(grid):
        patches = int(thw.prod())
        extra = [float(second_per_grid[i])] if second_per_grid is not None else []
        yield tag, patches // merge**2, (thw, pixels[start:start + patches], *extra)
        start += patches


def item_digest(tag: str, content: Sequence[torch.Tensor | float]) -> bytes:
    """SHA-256 over the tag and each part (a tensor's dtype, shape and bytes; a number's repr)."""
    h = hashlib.sha256(tag.encode())
    for part in content:
        if isinstance(part, torch.Tensor):
            t = part.detach().contiguous().cpu()
            h.update(f"{t.dtype}{tuple(t.shape)}".encode())
            h.update(t.view(-1).view(torch.uint8).numpy().tobytes())
        else:
            h.update(repr(float(part)).encode())
    return h.digest()
