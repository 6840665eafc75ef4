"""Which detector ``server_vad`` runs (``--vad``): Silero when its model loads, else the energy detector.

``auto`` (the default) loads Silero VAD once at start-up and falls back to
``EnergyVad`` with a warning when the package or its model is missing;
``silero`` makes that a start-up error; ``energy`` never loads a model.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from omnistage.audio.vad import EnergyVad, VadConfig, VadEvent

logger = logging.getLogger(__name__)
VAD_CHOICES = ("auto", "silero", "energy")


class Vad(Protocol):
    inline: bool  # cheap enough to run in the event loop

    @property
    def in_speech(self) -> bool: ...

    def reset(self) -> None: ...

    def feed(self, samples: np.ndarray) -> list[VadEvent]: ...


@dataclass(frozen=True)
class VadBackend:
    name: str  # "silero" or "energy"
    model: torch.jit.ScriptModule | None = None  # Silero's shared network

    def make(self, config: VadConfig | None, sample_rate: int) -> Vad | None:
        """A detector for one stream (None: turns are committed by the client)."""
        if config is None:
            return None
        if self.model is not None:
            from omnistage.audio.silero import SileroVad

            return SileroVad(config, sample_rate, self.model)
        return EnergyVad(config, sample_rate)


def vad_backend(choice: str = "auto") -> VadBackend:
    if choice not in VAD_CHOICES:
        raise ValueError(f"--vad takes one of {', '.join(VAD_CHOICES)}, got {choice!r}")
    if choice == "energy":
        return VadBackend("energy")
    from omnistage.audio.silero import SileroUnavailable, load_model

    try:
        return VadBackend("silero", load_model())
    except SileroUnavailable as exc:
        if choice == "silero":
            raise
        logger.warning("server_vad falls back to the energy detector: %s", exc)
        return VadBackend("energy")
