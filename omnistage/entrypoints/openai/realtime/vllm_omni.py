"""vLLM-Omni's realtime protocol (its ``openai_realtime_client.py``), translated to and from this server's GA events.

Its client sends ``session.update`` with a top-level ``model`` (no ``session`` object), an
``input_audio_buffer.commit`` with ``final: false`` to start, PCM16 at 16 kHz in ``input_audio_buffer.append``,
and ``input_audio_buffer.commit`` with ``final: true`` to end its turn; it reads ``response.output_audio.delta``
with the PCM in ``audio`` (and ``sample_rate_hz``), the answer's text as ``transcription.delta``/``.done``, and
stops at ``response.output_audio.done``. A session is this dialect when its first such event says so
(:func:`detect`); the session then runs as for any GA client: one turn, no server VAD (the client says when its
turn ends), audio out.
"""

from __future__ import annotations

from typing import Any

from omnistage.entrypoints.openai.common.errors import no_such_model
from omnistage.entrypoints.openai.common.served_model import ServedModel
from omnistage.entrypoints.openai.realtime.protocol import OUTPUT_RATE, EventError, server_event

INPUT_RATE = 16000  # what its client sends (and checks its WAV for)


def detect(event: dict[str, Any], served: ServedModel) -> VllmOmniDialect | None:
    """The dialect, when ``event`` is written in it: a session.update without ``session``, or a commit with
    ``final``."""
    kind = event.get("type")
    if (kind == "session.update" and "session" not in event) or (kind == "input_audio_buffer.commit"
                                                                  and "final" in event):
        return VllmOmniDialect(served)
    return None


class VllmOmniDialect:
    def __init__(self, served: ServedModel) -> None:
        self.served = served
        self.text: list[str] = []  # the answer's text so far, for transcription.done

    def incoming(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        """The GA client events ``event`` stands for (none for its non-final commit, which only starts)."""
        kind = event["type"]
        if kind == "session.update" and "session" not in event:
            model = event.get("model")
            if model is not None and model not in self.served.names:
                raise EventError("model_not_found", no_such_model(model), "model")
            audio = {"input": {"format": {"type": "audio/pcm", "rate": INPUT_RATE}, "turn_detection": None}}
            return [{"type": "session.update", "session": {"type": "realtime", "output_modalities": ["audio"],
                                                           "audio": audio}}]
        if kind == "input_audio_buffer.commit" and "final" in event:
            return [{"type": "input_audio_buffer.commit"}, {"type": "response.create"}] if event["final"] else []
        return [event]

    def outgoing(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        """What its client reads for one of our server events. Our transcript ends after the audio, its client
        stops at the audio's end: the text it has gathered goes out first."""
        kind = event["type"]
        if kind == "response.output_audio.delta":
            return [{**event, "audio": event.get("delta", ""), "sample_rate_hz": OUTPUT_RATE}]
        if kind == "response.output_audio_transcript.delta":
            self.text.append(str(event.get("delta") or ""))
            return [server_event("transcription.delta", delta=event.get("delta", ""))]
        if kind == "response.output_audio.done":
            text, self.text = "".join(self.text), []
            return [server_event("transcription.done", text=text), event]
        return [event]
