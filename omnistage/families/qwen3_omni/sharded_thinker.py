"""A Qwen3-Omni stage model loaded as rank 0 of a tensor-parallel group, the other ranks started beside it.

Only the thinker is sharded: it is nine tenths of the model's bytes (the talker, code predictor and vocoder of
Qwen3-Omni-30B-A3B fit one device; ``omnistage plan`` shows the figures). Stage configs that ask for
``tensor_parallel_size`` on another stage are refused when parsed.
"""

from __future__ import annotations

from pathlib import Path

import torch

from omnistage.models.qwen3_omni.config import Qwen3OmniConfig
from omnistage.models.qwen3_omni.thinker import Thinker
from omnistage.runner.tp_executor import TPExecutor

THINKER_SHARD_LOADER = "omnistage.models.qwen3_omni.thinker:load_decoder_shard"


def load_thinker(folder: str | Path, device: str | torch.device, dtype: torch.dtype, tensor_parallel_size: int = 1,
                 quantization: str = "none", config: Qwen3OmniConfig | None = None,
                 ) -> tuple[Thinker, TPExecutor | None]:
    """The thinker, and its tensor-parallel group when ``tensor_parallel_size > 1`` (close it when done)."""
    if tensor_parallel_size == 1:
        return Thinker.from_checkpoint(folder, device, dtype, quantization=quantization, config=config), None
    executor = TPExecutor(tensor_parallel_size, THINKER_SHARD_LOADER, str(folder), torch.device(device), dtype,
                          quantization)
    try:
        model = Thinker.from_checkpoint(folder, device, dtype, executor.tp, quantization, config=config)
    except BaseException:
        executor.close()
        raise
    model.decoder.leader = executor
    return model, executor
