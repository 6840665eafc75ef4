"""Audio helpers for the API layer: decode client audio, resample, encode responses."""

from omnistage.audio import pcm16
from omnistage.audio.decode import (
    AudioDecodeError,
    AudioNotFiniteError,
    AudioTooLargeError,
    AudioTooLongError,
    DecodeBound,
    DecodedAudio,
    decode_audio,
    load_audio,
    resample,
    to_mono,
)
from omnistage.audio.encode import StreamingAudioEncoder, encode_audio, float_to_pcm16, streaming_wav_header
from omnistage.audio.formats import INPUT_FORMATS, AudioFormat
from omnistage.audio.time_stretch import TimeStretcher, stretch

__all__ = [
    "INPUT_FORMATS",
    "AudioDecodeError",
    "AudioFormat",
    "AudioNotFiniteError",
    "AudioTooLargeError",
    "AudioTooLongError",
    "DecodeBound",
    "DecodedAudio",
    "StreamingAudioEncoder",
    "TimeStretcher",
    "decode_audio",
    "encode_audio",
    "float_to_pcm16",
    "load_audio",
    "pcm16",
    "resample",
    "streaming_wav_header",
    "stretch",
    "to_mono",
]
