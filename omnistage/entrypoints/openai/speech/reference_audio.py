"""A voice's reference recording (a voice upload, a speech request's ``ref_audio``): checked from its header, then
decoded under the same bounds.

The same bounds as chat audio (sample rate range, seconds x rate x channels) plus ``--max-voice-seconds``,
before a sample is decoded: a recording declaring 5,000,011 Hz once decoded for 42 s into 4.6 GB. A header
that gives no length (a streaming FLAC or Ogg) or lies about it is stopped while decoding, as soon as the
decoded samples pass ``--max-audio-samples`` or the seconds pass ``--max-voice-seconds``.
"""

from __future__ import annotations

from collections.abc import Callable

from omnistage.audio.decode import AudioDecodeError, AudioTooLargeError, AudioTooLongError, DecodedAudio, decode_audio
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


def decode_reference(data: bytes, fmt: str | None, limits: ServerLimits, param: str,
                     checkpoint: Callable[[], None] | None = None) -> DecodedAudio:
    """The recording's header checked, then its samples decoded in bounded pieces (a 400 naming the bound hit)."""
    check_reference_header(data, fmt, limits, param)
    try:
        return decode_audio(data, fmt, limits.max_voice_seconds, checkpoint, limits.max_audio_samples)
    except AudioTooLargeError as exc:
        raise over_budget("max_audio_samples", f"the reference audio: {exc}", param, "audio_too_large") from exc
    except AudioTooLongError as exc:
        raise over_budget("max_voice_seconds", f"the reference audio: {exc}", param, "audio_too_long") from exc
    except AudioDecodeError as exc:
        raise bad_request(f"could not decode the reference audio: {exc}", param=param, code="invalid_audio") from exc
