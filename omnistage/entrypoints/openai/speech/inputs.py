"""How a ``/v1/audio/speech`` body becomes an ``OmniRequest``, for whichever family is served.

A text-to-speech checkpoint (its family gives a :class:`SpeechFrontEnd`) speaks
the input itself: ``voice`` is one of its speakers (OpenAI's voice names map onto
them), ``instructions`` say how to speak (a voice-design checkpoint's voice), and
the talker's frames are bounded from the input's length. Qwen3-Omni has no
text-to-speech entry point: the input goes to the thinker with a system turn
asking it to repeat the text verbatim (``instructions`` replace that turn), and
the talker speaks what it writes; the completion budget is sized from the input
so a model that will not stop cannot run far past it.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from dataclasses import replace
from pathlib import Path

from omnistage.core import Modality, OmniRequest, Prompt, RequestSampling
from omnistage.entrypoints.openai.common.decode_pool import CancelToken, DecodePool
from omnistage.entrypoints.openai.common.errors import bad_request
from omnistage.entrypoints.openai.common.request_checks import completion_budget, make_sampling, resolve_voice
from omnistage.entrypoints.openai.common.served_model import ServedModel
from omnistage.entrypoints.openai.engine_protocol import OmniEngine
from omnistage.entrypoints.openai.speech.protocol import SpeechRequest
from omnistage.entrypoints.openai.speech.voice_store import VoiceStore, VoiceStoreError
from omnistage.families.speech import SpeechAsk, SpeechFrontEnd
from omnistage.processing.prompt import ProcessedPrompt

DEFAULT_INSTRUCTIONS = "Read the user's text aloud exactly as written. Do not add, drop or change any words."
# Room for the thinker's answer: the input re-tokenised plus a margin for its closing tokens.
_BUDGET_FACTOR = 2
_BUDGET_MARGIN = 16


class SpeechInputs(ABC):
    def __init__(self, engine: OmniEngine, served: ServedModel, pool: DecodePool) -> None:
        self.engine, self.served, self.pool = engine, served, pool

    @abstractmethod
    def check_voice(self, body: SpeechRequest) -> str | None:
        """The voice the request names, resolved (a 400 before anything is admitted)."""

    @abstractmethod
    async def request(self, body: SpeechRequest) -> OmniRequest: ...

    async def _prompt(self, job, body: SpeechRequest, *args: object) -> Prompt:  # noqa: ANN001 - a pool job
        try:
            return await self.pool.run(job, body, *args)
        except ValueError as exc:
            raise bad_request(f"could not build the prompt: {exc}", param="input") from exc


def speech_inputs(engine: OmniEngine, served: ServedModel, pool: DecodePool,
                  voices: VoiceStore | None = None) -> SpeechInputs:
    speech = getattr(engine, "speech", None)
    if speech is None:
        return RepeatedByThinker(engine, served, pool)
    return TextToSpeech(engine, served, pool, speech, voices)


class TextToSpeech(SpeechInputs):
    """A text-to-speech checkpoint speaks the input (audio is its only output)."""

    def __init__(self, engine: OmniEngine, served: ServedModel, pool: DecodePool, speech: SpeechFrontEnd,
                 voices: VoiceStore | None = None) -> None:
        super().__init__(engine, served, pool)
        self.speech, self.voices = speech, voices

    def check_voice(self, body: SpeechRequest) -> str | None:
        if self.speech.clones_voices:  # a registered voice
            return self._cloned(body.voice_name).name
        # A checkpoint without named speakers (voice design) takes its voice from the instructions.
        return resolve_voice(self.served.voices, body.voice_name, "voice") if self.speech.speakers else None

    def _cloned(self, name: str) -> Path:
        if self.voices is None:
            raise bad_request("this checkpoint speaks in voices cloned from reference audio: start the server with "
                              "--voices-dir and register one with POST /v1/audio/voices", param="voice",
                              code="invalid_voice")
        try:
            return self.voices.folder(name)
        except VoiceStoreError as exc:
            registered = ", ".join(self.voices.names()) or "none"
            raise bad_request(f"{exc} (registered: {registered})", param="voice", code="invalid_voice") from exc

    async def request(self, body: SpeechRequest) -> OmniRequest:
        voice = self.check_voice(body)
        clone = self._cloned(body.voice_name) if self.speech.clones_voices else None
        ask = SpeechAsk(body.input, voice, body.instructions)
        prompt = await self._prompt(self._make, ask, clone)
        try:
            frames = self.speech.max_frames(prompt, self.engine.max_model_len)
        except ValueError as exc:
            raise bad_request(str(exc), param="input", code="context_length_exceeded") from exc
        defaults = self.engine.default_sampling
        if defaults.max_tokens is not None:
            frames = min(frames, defaults.max_tokens)
        return OmniRequest(request_id=f"speech-{uuid.uuid4().hex}", prompt=prompt,
                           modalities=frozenset({Modality.AUDIO}),
                           sampling=make_sampling(max_tokens=frames, defaults=defaults), voice=voice or "")

    def _make(self, ask: SpeechAsk, clone: Path | None, token: CancelToken) -> Prompt:
        if clone is not None:
            try:
                ask = replace(ask, clone=self.speech.load_voice(clone))
            except OSError as exc:  # deleted since it was checked
                raise ValueError(f"the voice {clone.name!r} is no longer registered") from exc
        return self.speech.prompt(ask)


class RepeatedByThinker(SpeechInputs):
    """Qwen3-Omni: the thinker repeats the input, the talker speaks it."""

    def check_voice(self, body: SpeechRequest) -> str | None:
        return resolve_voice(self.served.voices, body.voice_name, "voice")

    async def request(self, body: SpeechRequest) -> OmniRequest:
        voice = self.check_voice(body)
        prompt = await self._prompt(self._make, body)
        prompt_len = prompt.num_tokens
        room = completion_budget(None, prompt_len, self.engine.max_model_len, "input")
        budget = min(room, _BUDGET_FACTOR * prompt_len + _BUDGET_MARGIN)
        sampling: RequestSampling = make_sampling(max_tokens=budget, defaults=self.engine.default_sampling)
        return OmniRequest(request_id=f"speech-{uuid.uuid4().hex}", prompt=prompt,
                           modalities=frozenset({Modality.TEXT, Modality.AUDIO}), sampling=sampling, voice=voice)

    def _make(self, body: SpeechRequest, token: CancelToken) -> ProcessedPrompt:
        messages: list[dict[str, object]] = [
            {"role": "system", "content": body.instructions or DEFAULT_INSTRUCTIONS},
            {"role": "user", "content": body.input},
        ]
        ids = self.engine.processor.apply_chat_template(messages)
        return self.engine.processor.process(ids)
