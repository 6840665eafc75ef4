"""A voice's reference recording (a voice upload, a speech request's ``ref_audio``), checked from its header.

The same bounds as chat audio (sample rate range, seconds x rate x channels) plus ``--max-voice-seconds``,
before a sample is decoded: a recording declaring 5,000,011 Hz once decoded for 42 s into 4.6 GB.
"""

from __future__ import annotations

from omnistage.entrypoints.openai.common.errors import MediaError, bad_request
from omnistage.entrypoints.openai.common.request_budget import MediaBudget, over_budget
from omnistage.entrypoints.openai.media.probe import probe_audio
from omnistage.entrypoints.openai.server_config import ServerLimits


def check_reference_header(data: bytes, fmt: str | None, limits: ServerLimits, param: str) -> None:
    try:
        info = probe_audio(data, fmt)
    except MediaError as exc:
        raise bad_request(f"could not read the reference audio: {exc}", param=param, code=exc.code) from exc
    if info.seconds is not None and info.seconds > limits.max_voice_seconds:
        raise over_budget("max_voice_seconds", f"the reference audio lasts {info.seconds:.1f} s; the limit is "
                                               f"{limits.max_voice_seconds:g} s", param, "audio_too_long")
    MediaBudget(limits).add_audio(info.sample_rate, info.seconds, param, info.channels)
