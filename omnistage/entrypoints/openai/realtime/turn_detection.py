"""A realtime session's ``turn_detection``: ``server_vad`` (the VAD's own settings, and ``idle_timeout_ms``) or
``semantic_vad`` (the Smart Turn classifier judges each pause; its eagerness is the longest wait), parsed from the
client's JSON (GA and beta spell it alike) and described back."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from omnistage.audio.turn_judge import EAGERNESS_MAX_MS, SEMANTIC_PAUSE_MS
from omnistage.audio.vad import VadConfig
from omnistage.entrypoints.openai.realtime.event_error import EventError

IDLE_TIMEOUT_MS = (5000, 30000)  # server_vad's idle_timeout_ms: OpenAI's bounds


@dataclass(frozen=True)
class TurnDetection:
    """``server_vad`` (the VAD's own settings) or ``semantic_vad`` (a classifier ends the turn at a pause; its
    eagerness chooses the longest silence it waits when the turn sounds incomplete)."""

    kind: str = "server_vad"
    vad: VadConfig = field(default_factory=VadConfig)
    create_response: bool = True
    interrupt_response: bool = True
    eagerness: str = "auto"
    idle_timeout_ms: int | None = None  # server_vad: silence after a reply's playback that prompts a response

    @property
    def semantic(self) -> bool:
        return self.kind == "semantic_vad"

    def describe(self) -> dict[str, Any]:
        common = {"type": self.kind, "create_response": self.create_response,
                  "interrupt_response": self.interrupt_response}
        if self.kind == "semantic_vad":
            return {**common, "eagerness": self.eagerness}
        return {**common, "threshold": self.vad.threshold, "silence_duration_ms": self.vad.silence_duration_ms,
                "prefix_padding_ms": self.vad.prefix_padding_ms, "idle_timeout_ms": self.idle_timeout_ms}


def parse_turn_detection(value: Any, current: TurnDetection | None, param: str) -> TurnDetection | None:  # noqa: ANN401
    if value is None:
        return None
    kind = value.get("type", "server_vad") if isinstance(value, dict) else None
    if kind not in ("server_vad", "semantic_vad"):
        raise EventError("invalid_value", f"{param} must be null, server_vad or semantic_vad", param)
    base = current if current is not None and current.kind == kind else TurnDetection(kind)
    flags = {k: bool(value[k]) for k in ("create_response", "interrupt_response") if k in value}
    try:
        if kind == "semantic_vad":
            if value.get("idle_timeout_ms") is not None:
                raise ValueError("idle_timeout_ms is server_vad's (as OpenAI's)")
            eagerness = value.get("eagerness", base.eagerness)
            if eagerness not in EAGERNESS_MAX_MS:
                raise ValueError(f"eagerness must be one of {', '.join(EAGERNESS_MAX_MS)}")
            vad = replace(base.vad, silence_duration_ms=EAGERNESS_MAX_MS[eagerness], judge_ms=SEMANTIC_PAUSE_MS)
            return replace(base, vad=vad, eagerness=eagerness, **flags)
        known = {k: value[k] for k in ("threshold", "silence_duration_ms", "prefix_padding_ms") if k in value}
        idle = _idle_timeout(value.get("idle_timeout_ms", base.idle_timeout_ms))
        return replace(base, vad=replace(base.vad, **known), idle_timeout_ms=idle, **flags)
    except (TypeError, ValueError) as exc:
        raise EventError("invalid_value", f"{param}: {exc}", param) from exc


def _idle_timeout(value: Any) -> int | None:  # noqa: ANN401
    low, high = IDLE_TIMEOUT_MS
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high):
        raise ValueError(f"idle_timeout_ms must be null or an integer from {low} to {high}")
    return value
