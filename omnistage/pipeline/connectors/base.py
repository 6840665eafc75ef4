"""How a tensor inside a message crosses a stage boundary.

The serialiser hands every large tensor to the pipeline's connector: ``put``
stores it and returns a short key that travels in the message; ``get`` on the
other side turns the key back into a tensor. A connector that declines a
tensor (``put`` returns None) leaves it to the default out-of-band zmq frame.
Keys are prefixed by a pipeline id so ``cleanup`` can drop whatever was put
but never fetched (a message lost with a dead replica).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch


class TensorConnector(ABC):
    """Moves tensors between the orchestrator and stage replicas of one pipeline."""

    def __init__(self, pipeline_id: str) -> None:
        self.pipeline_id = pipeline_id

    @abstractmethod
    def put(self, tensor: torch.Tensor) -> str | None:
        """Stores a contiguous CPU tensor; returns its key, or None to send it as a frame instead."""

    @abstractmethod
    def get(self, key: str, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        """The tensor stored under ``key`` (each key is fetched exactly once)."""

    def live_segments(self) -> int:
        """Transport buffers of this pipeline written and not yet taken (0 for by-reference transport)."""
        return 0

    @abstractmethod
    def cleanup(self) -> None:
        """Frees everything this pipeline put and nobody fetched (called at shutdown)."""
