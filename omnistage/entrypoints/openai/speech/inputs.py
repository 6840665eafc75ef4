"""How a ``/v1/audio/speech`` body becomes an ``OmniRequest``, for whichever family is served.

A text-to-speech checkpoint (its family gives a :class:`SpeechFrontEnd`) speaks
the input itself: ``voice`` is one of its speakers (OpenAI's voice names map onto
them), ``instructions`` say how to speak (a voice-design checkpoint's voice), and
the talker's frames are bounded from the input's length (and by ``max_new_tokens``).
vLLM-Omni's fields: ``language`` picks the codec's language, ``task_type`` must
name the served checkpoint's type, and ``ref_audio`` (with ``ref_text``, unless
``x_vector_only_mode``) clones a voice for this request alone on a Base checkpoint. Qwen3-Omni has no
text-to-speech entry point: the input goes to the thinker with a system turn
asking it to repeat the text verbatim (``instructions`` replace that turn), and
the talker speaks what it writes; the completion budget is sized from the input
so a model that will not stop cannot run far past it.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

from omnistage.core import Modality, OmniRequest, Prompt
from omnistage.entrypoints.openai.common.decode_pool import CancelToken, DecodePool
from omnistage.entrypoints.openai.common.errors import MediaError, bad_request
from omnistage.entrypoints.openai.common.request_budget import over_budget
from omnistage.entrypoints.openai.common.request_checks import completion_budget, make_sampling, resolve_voice
from omnistage.entrypoints.openai.common.served_model import ServedModel
from omnistage.entrypoints.openai.common.voice_names import UnknownVoice
from omnistage.entrypoints.openai.engine_protocol import OmniEngine
from omnistage.entrypoints.openai.media.loaders import MediaFetcher
from omnistage.entrypoints.openai.server_config import MediaPolicy, ServerLimits
from omnistage.entrypoints.openai.speech.context import TurnAsked, TurnFetched, decode_turns, fetch_turns
from omnistage.entrypoints.openai.speech.protocol import SpeechRequest
from omnistage.entrypoints.openai.speech.reference_audio import decode_reference
from omnistage.entrypoints.openai.speech.task_type import check_task_type
from omnistage.entrypoints.openai.speech.voice_store import VoiceStore, VoiceStoreError
from omnistage.families.speech import SpeechAsk, SpeechFrontEnd, SpokenText
from omnistage.processing.prompt import ProcessedPrompt
from omnistage.sampling_params import SamplingParams

T = TypeVar("T")
DEFAULT_INSTRUCTIONS = "Read the user's text aloud exactly as written. Do not add, drop or change any words."
# Room for the thinker's answer: the input re-tokenised plus a margin for its closing tokens.
_BUDGET_FACTOR = 2
_BUDGET_MARGIN = 16


@dataclass(frozen=True)
class RefAudio:
    """vLLM-Omni's one-off clone (``ref_audio``): the recording's bytes, its format hint, and what it says (None:
    cloned from the speaker embedding alone, ``x_vector_only_mode``)."""

    data: bytes
    fmt: str | None
    transcript: str | None


class SpeechInputs(ABC):
    def __init__(self, engine: OmniEngine, served: ServedModel, pool: DecodePool,
                 limits: ServerLimits | None = None) -> None:
        self.engine, self.served, self.pool = engine, served, pool
        self.limits = limits or ServerLimits()

    @abstractmethod
    def check_voice(self, body: SpeechRequest) -> str | None:
        """The voice the request names, resolved (a 400 before anything is admitted)."""

    @abstractmethod
    async def request(self, body: SpeechRequest) -> OmniRequest: ...

    async def _prompt(self, job: Callable[..., T], body: object, *args: object) -> T:
        try:
            return await self.pool.run(job, body, *args)
        except ValueError as exc:
            raise bad_request(f"could not build the prompt: {exc}", param="input") from exc


def speech_inputs(engine: OmniEngine, served: ServedModel, pool: DecodePool, voices: VoiceStore | None = None,
                  limits: ServerLimits | None = None, fetcher: MediaFetcher | None = None) -> SpeechInputs:
    speech = engine.front_end.speech
    if speech is None:
        return RepeatedByThinker(engine, served, pool, limits)
    return TextToSpeech(engine, served, pool, speech, voices, limits, fetcher)


class TextToSpeech(SpeechInputs):
    """A text-to-speech checkpoint speaks the input (audio is its only output)."""

    def __init__(self, engine: OmniEngine, served: ServedModel, pool: DecodePool, speech: SpeechFrontEnd,
                 voices: VoiceStore | None = None, limits: ServerLimits | None = None,
                 fetcher: MediaFetcher | None = None) -> None:
        super().__init__(engine, served, pool, limits)
        self.speech, self.voices = speech, voices
        # Without the server's media policy, only data: URLs (the default policy refuses files and the network).
        self.fetcher = fetcher or MediaFetcher(MediaPolicy(), self.limits)

    def check_voice(self, body: SpeechRequest) -> str | None:
        check_task_type(self.speech, body.task_type)
        if body.ref_audio is not None:
            if not self.speech.clones_voices:
                raise bad_request("ref_audio clones a voice: that needs a Qwen3-TTS Base checkpoint",
                                  param="ref_audio", code="voice_cloning_not_supported")
            return None
        if self.speech.clones_voices and not self._is_speaker(body.voice_name):  # a registered voice
            if body.voice_name is None:
                raise bad_request("this Base checkpoint speaks in a cloned voice: give ref_audio, or name a voice "
                                  "registered with POST /v1/audio/voices", param="voice", code="invalid_voice")
            return self._cloned(body.voice_name).name
        # A checkpoint without named speakers (voice design) takes its voice from the instructions.
        return resolve_voice(self.served.voices, body.voice_name, "voice") if self.speech.speakers else None

    def _is_speaker(self, name: str | None) -> bool:
        """Whether ``name`` is a built-in speaker (None: the default one): a checkpoint may both ship voices and
        clone others (Pocket TTS), and its speakers win over a registered voice of the same name."""
        if not self.speech.speakers:
            return False
        try:
            self.served.voices.resolve(name)
        except UnknownVoice:
            return False
        return True

    def _cloned(self, name: str) -> Path:
        if self.voices is None:
            raise bad_request("this checkpoint speaks in voices cloned from reference audio: start the server with "
                              "--voices-dir and register one with POST /v1/audio/voices", param="voice",
                              code="invalid_voice")
        try:
            return self.voices.folder(name)
        except VoiceStoreError as exc:  # never a list of the voices others registered
            raise bad_request(str(exc), param="voice", code="invalid_voice") from exc

    async def request(self, body: SpeechRequest, context: Sequence[TurnAsked] | None = None) -> OmniRequest:
        """``context``: the earlier turns, when they come from elsewhere than the body (a chat's messages)."""
        voice = self.check_voice(body)
        source = await self._voice_source(body, voice)
        turns = await fetch_turns(context_turns(body) if context is None else context, self.fetcher, self.limits)
        ask = SpeechAsk(body.input, voice, body.instructions, language=body.language or "auto")
        prompt = await self._prompt(self._make, ask, source, turns)
        try:
            frames = self.speech.max_frames(prompt, self.engine.max_model_len)
        except ValueError as exc:
            raise bad_request(str(exc), param="input", code="context_length_exceeded") from exc
        return self.speak(body, prompt, frames, voice)

    async def spoken_text(self, body: SpeechRequest) -> tuple[SpokenText, str | None]:
        """An utterance spoken as its text is written (a family that takes text deltas), its voice and settings
        checked now (400s as for a whole input); with the voice it resolved to."""
        voice = self.check_voice(body)
        source = await self._voice_source(body, voice)
        turns = await fetch_turns(context_turns(body), self.fetcher, self.limits)
        ask = SpeechAsk("", voice, body.instructions, language=body.language or "auto")
        return await self._prompt(self._spoken, ask, source, turns), voice

    def speak(self, body: SpeechRequest, prompt: Prompt, frames: int, voice: str | None,
              first_chunk_frames: int | None = None, open_input: bool = False) -> OmniRequest:
        """The request speaking ``prompt`` in at most ``frames`` frames (and the caps the server and the body set);
        ``open_input``: the rest of its text is fed to it as it is written."""
        defaults = self.engine.default_sampling
        for cap in (defaults.max_tokens, body.max_new_tokens):
            frames = min(frames, cap) if cap is not None else frames
        return OmniRequest(request_id=f"speech-{uuid.uuid4().hex}", prompt=prompt,
                           modalities=frozenset({Modality.AUDIO}),
                           sampling=make_sampling(max_tokens=frames, defaults=defaults), voice=voice or "",
                           initial_codec_chunk_frames=first_chunk_frames, open_input=open_input)

    async def _voice_source(self, body: SpeechRequest, voice: str | None) -> Path | RefAudio | None:
        """Where a cloned voice comes from: a registered voice's folder, or the request's own recording."""
        if body.ref_audio is None:
            cloned = self.speech.clones_voices and voice and not self._is_speaker(voice)
            return self._cloned(voice) if cloned else None
        try:
            fetched = await self.fetcher.fetch(body.ref_audio)
        except MediaError as exc:
            raise bad_request(f"ref_audio: {exc}", param="ref_audio", code=exc.code) from exc
        if len(fetched.data) > self.limits.max_voice_audio_bytes:
            raise over_budget("max_voice_audio_bytes", f"the reference audio is over "
                              f"{self.limits.max_voice_audio_bytes} bytes", "ref_audio")
        transcript = None if body.x_vector_only_mode else (body.ref_text or None)
        return RefAudio(fetched.data, fetched.audio_hint, transcript)

    def _make(self, ask: SpeechAsk, source: Path | RefAudio | None, turns: tuple[TurnFetched, ...],
              token: CancelToken) -> Prompt:
        return self.speech.prompt(self._voiced(ask, source, turns, token))

    def _spoken(self, ask: SpeechAsk, source: Path | RefAudio | None, turns: tuple[TurnFetched, ...],
                token: CancelToken) -> SpokenText:
        return self.speech.spoken_text(self._voiced(ask, source, turns, token), self.engine.max_model_len)

    def _voiced(self, ask: SpeechAsk, source: Path | RefAudio | None, turns: tuple[TurnFetched, ...],
                token: CancelToken) -> SpeechAsk:
        """``ask`` with its cloned voice (a registered voice's, or one cloned from the request's recording) and
        the conversation it continues."""
        if turns:
            ask = replace(ask, context=decode_turns(turns, self.limits, token.check))
        if isinstance(source, Path):
            try:
                ask = replace(ask, clone=self.speech.load_voice(source))
            except OSError as exc:  # deleted since it was checked
                raise ValueError(f"the voice {source.name!r} is no longer registered") from exc
        elif isinstance(source, RefAudio):
            audio = decode_reference(source.data, source.fmt, self.limits, "ref_audio", token.check)
            ask = replace(ask, clone=self.speech.clone_voice(audio.samples, audio.sample_rate, source.transcript))
        return ask


def context_turns(body: SpeechRequest) -> list[TurnAsked]:
    """The body's ``context``, as the context checks take it."""
    return [TurnAsked(turn.speaker_name, turn.text, turn.audio, f"context[{i}]")
            for i, turn in enumerate(body.context or ())]


class RepeatedByThinker(SpeechInputs):
    """An omni checkpoint (Qwen3-Omni, Qwen2.5-Omni): the thinker repeats the input, the talker speaks it."""

    def check_voice(self, body: SpeechRequest) -> str | None:
        if body.task_type is not None or body.ref_audio is not None:
            raise bad_request("task_type and ref_audio are Qwen3-TTS fields; this model is not a TTS checkpoint",
                              param="task_type" if body.task_type is not None else "ref_audio")
        return resolve_voice(self.served.voices, body.voice_name, "voice")

    async def request(self, body: SpeechRequest) -> OmniRequest:
        voice = self.check_voice(body)
        prompt = await self._prompt(self._make, body)
        prompt_len = prompt.num_tokens
        room = completion_budget(None, prompt_len, self.engine.max_model_len, "input")
        budget = min(room, _BUDGET_FACTOR * prompt_len + _BUDGET_MARGIN)
        sampling: SamplingParams = make_sampling(max_tokens=budget, defaults=self.engine.default_sampling)
        return OmniRequest(request_id=f"speech-{uuid.uuid4().hex}", prompt=prompt,
                           modalities=frozenset({Modality.TEXT, Modality.AUDIO}), sampling=sampling, voice=voice)

    def _make(self, body: SpeechRequest, token: CancelToken) -> ProcessedPrompt:
        front_end = self.engine.front_end
        # A talker trained under one system prompt (Qwen2.5-Omni's) hears it first; the ask to repeat comes after.
        opening = front_end.spoken_system_prompt
        messages: list[dict[str, object]] = [
            *([{"role": "system", "content": opening}] if opening else []),
            {"role": "system", "content": body.instructions or DEFAULT_INSTRUCTIONS},
            {"role": "user", "content": body.input},
        ]
        ids = front_end.processor.apply_chat_template(messages)
        return front_end.processor.process(ids)
