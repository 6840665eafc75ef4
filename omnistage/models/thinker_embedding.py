"""An omni thinker's token embedding table alone, for a talker process that holds no thinker.

Both omni families' talkers build their text rows from the thinker's embeddings; the table sits under either
name depending on the checkpoint's layout (transformers 5's ``language_model`` level, or the older flat one).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from omnistage.models.weights import Checkpoint

THINKER_EMBEDDING_NAMES = ("thinker.model.language_model.embed_tokens.weight", "thinker.model.embed_tokens.weight")


def load_thinker_embedding(folder: str | Path, device: torch.device | str, dtype: torch.dtype) -> nn.Embedding:
    with Checkpoint(folder) as ckpt:
        name = next((n for n in THINKER_EMBEDDING_NAMES if ckpt.has(n)), None)
        if name is None:
            raise KeyError(f"{folder} holds no thinker embedding table ({' or '.join(THINKER_EMBEDDING_NAMES)})")
        weight = ckpt.get(name)
    return nn.Embedding.from_pretrained(weight.to(device, dtype), freeze=True)
