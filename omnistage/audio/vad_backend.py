"""Which detector ``server_vad`` runs (``--vad``): Silero when its model loads, else the energy detector.

``auto`` (the default) loads Silero VAD once at start-up and falls back to
``EnergyVad`` with a warning when the package or its model is missing;
``silero`` makes that a start-up error; ``energy`` never loads a model.

``semantic_vad`` adds the Smart Turn classifier (``smart_turn.py``), loaded at
start-up when the ``turn`` extra is installed: each of its streams gets a
``TurnJudge`` for its pauses. Without it ``turn`` is None and a session asking for
``semantic_vad`` is told so (``realtime/session.py``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from omnistage.audio.smart_turn import SmartTurn
from omnistage.audio.vad import FRAME_MS, EnergyVad, VadConfig, VadEvent

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
    turn: SmartTurn | None = None  # semantic_vad's classifier (None: the turn extra is not installed)

    def make(self, config: VadConfig | None, sample_rate: int, semantic: bool = False) -> Vad | None:
        """A detector for one stream (None: turns are committed by the client); ``semantic``: its pauses judged by
        the classifier (which must be loaded)."""
        if config is None:
            return None
        if semantic and self.turn is None:
            raise ValueError("semantic_vad needs the Smart Turn classifier, which is not loaded")
        from omnistage.audio.turn_judge import TurnJudge

        if self.model is not None:
            from omnistage.audio.silero import RATE, WINDOW, SileroVad

            return SileroVad(config, sample_rate, self.model, TurnJudge(self.turn, RATE, WINDOW) if semantic else None)
        frame = sample_rate * FRAME_MS // 1000
        return EnergyVad(config, sample_rate, TurnJudge(self.turn, sample_rate, frame) if semantic else None)


def smart_turn() -> SmartTurn | None:
    """The classifier, when the turn extra is installed (else None, said once in the log)."""
    from omnistage.audio.smart_turn import SmartTurnUnavailable, load_smart_turn

    try:
        return load_smart_turn()
    except SmartTurnUnavailable as exc:
        logger.info("semantic_vad is unavailable: %s", exc)
        return None


def vad_backend(choice: str = "auto") -> VadBackend:
    if choice not in VAD_CHOICES:
        raise ValueError(f"--vad takes one of {', '.join(VAD_CHOICES)}, got {choice!r}")
    if choice == "energy":
        return VadBackend("energy", turn=smart_turn())
    from omnistage.audio.silero import SileroUnavailable, load_model

    try:
        return VadBackend("silero", load_model(), smart_turn())
    except SileroUnavailable as exc:
        if choice == "silero":
            raise
        logger.warning("server_vad falls back to the energy detector: %s", exc)
        return VadBackend("energy", turn=smart_turn())
