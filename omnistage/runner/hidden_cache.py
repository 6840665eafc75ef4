"""A thinker's hidden states kept per KV slot, so prefix-cache hits still feed the talker (both omni families).

A talker reads states of the thinker's prompt rows (Qwen3-Omni: the
``accept_hidden_layer`` states at multimodal rows; Qwen2.5-Omni: the last
layer's at every row). A prompt served partly from the prefix cache never
computes its cached rows, so those states are stored beside the KV cache, one
row per slot, and follow the same block ids: a block's rows are overwritten
exactly when its KV is. Each family's step hook writes them on every step that
computes the rows its talker may read from a cached block (Qwen3-Omni:
multimodal prompt rows, its text rows may hold another prompt's states and are
not read; Qwen2.5-Omni: every prompt row, its generated rows never keyed).
One row of width H per slot costs H / (2·layers·kv_heads·head_dim) of the
KV cache (about 4 % for the 30B-A3B thinker: 2048 / (2·48·4·128); 12.5 % for
Qwen2.5-Omni-7B's: 3584 / (2·28·4·128)).
"""

from __future__ import annotations

import torch

from omnistage.engine.config import EngineConfig
from omnistage.runner.step_hook import StepHook


class HiddenStateCache:
    def __init__(self, num_slots: int, block_size: int) -> None:
        self.num_slots = num_slots
        self.block_size = block_size
        self.rows: torch.Tensor | None = None  # [num_slots, H], made at the first write (H, dtype, device)

    def write(self, slots: torch.Tensor, hidden: torch.Tensor) -> None:
        """Stores ``hidden [T, H]`` at ``slots [T]`` (a step's slot mapping)."""
        if self.rows is None:
            self.rows = hidden.new_zeros(self.num_slots, hidden.shape[-1])
        self.rows.index_copy_(0, slots.to(self.rows.device, torch.int64), hidden.to(self.rows.dtype))

    def read(self, block_table: torch.Tensor, start: int, end: int) -> torch.Tensor:
        """The rows of positions ``[start, end)`` of the sequence with this block table."""
        if self.rows is None:
            raise RuntimeError("hidden states read before any was written")
        pos = torch.arange(start, end, device=block_table.device)
        slots = block_table[pos // self.block_size].to(torch.int64) * self.block_size + pos % self.block_size
        return self.rows[slots.to(self.rows.device)]


class HiddenCacheHook(StepHook):
    """A thinker step hook that keeps hidden rows per KV slot when prefix caching is on: its cache is sized to the
    pool the runner made (``bind_pool``), and its rows are counted in that pool's budget (``slot_bytes``).
    ``hidden_size``: the width of a kept row (0: not counted)."""

    def __init__(self, hidden_size: int = 0) -> None:
        self.hidden_size = hidden_size
        self.hidden_cache: HiddenStateCache | None = None
        self.config: EngineConfig | None = None

    def bind(self, config: EngineConfig) -> None:
        self.config = config

    def slot_bytes(self, config: EngineConfig) -> int:
        return self.hidden_size * config.dtype.itemsize if config.enable_prefix_caching else 0

    def bind_pool(self, num_blocks: int) -> None:
        if self.config is not None and self.config.enable_prefix_caching:  # a slot of the sized pool, a row
            self.hidden_cache = HiddenStateCache(num_blocks * self.config.block_size, self.config.block_size)
