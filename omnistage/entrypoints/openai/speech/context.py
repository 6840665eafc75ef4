"""A conversational speech model's context (CSM): the earlier turns a request's text continues, each a speaker,
its text and its recording, from ``/v1/audio/speech``'s ``context`` or a chat request's earlier messages.

Bounded in three steps, each before the next costs more: the turn count, the speakers and the text before the
request is admitted (:func:`check_turns`); each recording's size and its header's seconds, all turns together,
before a sample is decoded (:func:`fetch_turns`); then the decoded seconds (and finite samples)
(:func:`decode_turns`, in the decode pool). Every breach is a 400 naming the turn.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from omnistage.entrypoints.openai.common.errors import MediaError, bad_request
from omnistage.entrypoints.openai.common.request_budget import over_budget
from omnistage.entrypoints.openai.media.loaders import MediaFetcher
from omnistage.entrypoints.openai.media.probe import probe_audio
from omnistage.entrypoints.openai.server_config import ServerLimits
from omnistage.entrypoints.openai.speech.reference_audio import decode_reference
from omnistage.families.speech import ContextTurn, SpeechFrontEnd


@dataclass(frozen=True)
class TurnAsked:
    """One turn as the request gives it: ``audio`` a media URL (``fetch_turns``) or the recording's bytes already
    (a chat message's ``input_audio``); ``param`` names it in errors."""

    speaker: str
    text: str
    audio: str | bytes
    param: str
    fmt: str | None = None


@dataclass(frozen=True)
class TurnFetched:
    speaker: str
    text: str
    data: bytes
    fmt: str | None
    param: str


def check_turns(turns: Sequence[TurnAsked], speech: SpeechFrontEnd | None, limits: ServerLimits) -> None:
    """What is checked before admission: the model takes context, the turn count, each speaker, the text."""
    if not turns:
        return
    if speech is None or not speech.takes_context:
        raise bad_request("this model does not take earlier turns of a conversation (context): CSM does",
                          param=turns[0].param, code="context_not_supported")
    if len(turns) > limits.max_speech_context_turns:
        raise over_budget("max_speech_context_turns", f"{len(turns)} context turns; the limit is "
                          f"{limits.max_speech_context_turns}", turns[-1].param)
    for turn in turns:
        if turn.speaker not in speech.speakers:
            raise bad_request(f"unknown speaker {turn.speaker!r}; this model's are {', '.join(speech.speakers)}",
                              param=f"{turn.param}.speaker", code="invalid_speaker")
    chars = sum(len(turn.text) for turn in turns)
    if chars > limits.max_speech_input_chars:
        raise over_budget("max_speech_input_chars", f"the context's text is {chars} characters; the limit is "
                          f"{limits.max_speech_input_chars}", turns[-1].param, "input_too_long")


async def fetch_turns(turns: Sequence[TurnAsked], fetcher: MediaFetcher, limits: ServerLimits,
                      ) -> tuple[TurnFetched, ...]:
    """Each turn's recording fetched and its header read: the seconds all turns declare, bounded together."""
    fetched, seconds = [], 0.0
    for turn in turns:
        param = f"{turn.param}.audio"
        data, fmt = turn.audio, turn.fmt
        if isinstance(data, str):
            try:
                media = await fetcher.fetch(data)
            except MediaError as exc:
                raise bad_request(f"{param}: {exc}", param=param, code=exc.code) from exc
            data, fmt = media.data, media.audio_hint
        if len(data) > limits.max_voice_audio_bytes:
            raise over_budget("max_voice_audio_bytes", f"a turn's audio is over {limits.max_voice_audio_bytes} "
                              "bytes", param)
        try:
            seconds += probe_audio(data, fmt).seconds or 0.0
        except MediaError as exc:
            raise bad_request(f"could not read the turn's audio: {exc}", param=param, code=exc.code) from exc
        _check_seconds(seconds, limits, param)
        fetched.append(TurnFetched(turn.speaker, turn.text, data, fmt, param))
    return tuple(fetched)


def decode_turns(turns: Sequence[TurnFetched], limits: ServerLimits,
                 checkpoint: Callable[[], None] | None = None) -> tuple[ContextTurn, ...]:
    """The recordings decoded under the reference-audio bounds (runs in the decode pool); a header that did not
    say its length is counted here."""
    decoded, seconds = [], 0.0
    for turn in turns:
        audio = decode_reference(turn.data, turn.fmt, limits, turn.param, checkpoint)  # refuses NaN and inf
        seconds += len(audio.samples) / audio.sample_rate
        _check_seconds(seconds, limits, turn.param)
        decoded.append(ContextTurn(turn.speaker, turn.text, audio.samples, audio.sample_rate))
    return tuple(decoded)


def _check_seconds(seconds: float, limits: ServerLimits, param: str) -> None:
    if seconds > limits.max_speech_context_seconds:
        raise over_budget("max_speech_context_seconds", f"the context's audio lasts {seconds:.1f} s or more; the "
                          f"limit is {limits.max_speech_context_seconds:g} s", param, "audio_too_long")
