"""``POST/GET /v1/audio/voices``, ``DELETE /v1/audio/voices/{name}``: voices cloned from uploaded reference audio.

Only a checkpoint whose speech front end clones voices (a Qwen3-TTS Base checkpoint) takes them, and only when
the operator named a folder for them (``--voices-dir``). A registration is bounded before any decoding (the
encoded size, ``--max-voice-audio-bytes``; the declared length, ``--max-voice-seconds``), holds a place under
the server's admission bound while it runs, and runs in the decode pool (the speaker and codec encoders).
A speech request then names the voice in ``voice``. On a checkpoint with built-in speakers (CustomVoice), the
listing gives them in ``voices``, as vLLM-Omni lists them.
"""

from __future__ import annotations

import base64
import binascii

from omnistage.entrypoints.openai.common.admission import Admission
from omnistage.entrypoints.openai.common.decode_pool import CancelToken, DecodePool
from omnistage.entrypoints.openai.common.errors import APIError, bad_request
from omnistage.entrypoints.openai.common.request_budget import over_budget
from omnistage.entrypoints.openai.engine_protocol import OmniEngine
from omnistage.entrypoints.openai.server_config import ServerLimits
from omnistage.entrypoints.openai.speech.protocol import (
    UploadedVoice,
    VoiceCreateRequest,
    VoiceDeleted,
    VoiceList,
    VoiceObject,
)
from omnistage.entrypoints.openai.speech.reference_audio import decode_reference
from omnistage.entrypoints.openai.speech.voice_store import StoredVoice, VoiceStore, VoiceStoreError
from omnistage.families.speech import SpeechFrontEnd

_STATUS = {"voice_not_found": 404, "voice_exists": 409}


def store_error(exc: VoiceStoreError, param: str = "name") -> APIError:
    return APIError(_STATUS.get(exc.code, 400), str(exc), param=param, code=exc.code)


def _object(voice: StoredVoice) -> VoiceObject:
    return VoiceObject(id=voice.name, created_at=voice.created_at, mode=voice.mode)


class VoiceService:
    def __init__(self, engine: OmniEngine, limits: ServerLimits, store: VoiceStore | None, admission: Admission,
                 pool: DecodePool) -> None:
        self.engine, self.limits, self.store, self.admission, self.pool = engine, limits, store, admission, pool

    def _ready(self) -> tuple[SpeechFrontEnd, VoiceStore]:
        speech = self.engine.front_end.speech
        if speech is None or not speech.clones_voices:
            raise bad_request("this model does not clone voices (a Qwen3-TTS Base checkpoint does)",
                              param="model", code="voice_cloning_not_supported")
        if self.store is None:
            raise bad_request("voice registration is off: start the server with --voices-dir DIR",
                              code="voices_disabled")
        return speech, self.store

    async def create(self, body: VoiceCreateRequest) -> VoiceObject:
        speech, store = self._ready()
        try:
            store.check_name(body.name)
        except VoiceStoreError as exc:
            raise store_error(exc) from exc
        limit = self.limits.max_voice_audio_bytes
        if len(body.audio.data) > 4 * (limit + 2) // 3:  # base64 of more than the limit
            raise over_budget("max_voice_audio_bytes", f"the reference audio is over {limit} bytes", "audio.data")
        if body.transcript is not None and len(body.transcript) > self.limits.max_speech_input_chars:
            raise over_budget("max_speech_input_chars", "the transcript is too long", "transcript")
        ticket = self.admission.admit()
        try:
            voice = await self.pool.run(self._register, speech, store, body)
        finally:
            ticket.release()
        return _object(voice)

    def _register(self, speech: SpeechFrontEnd, store: VoiceStore, body: VoiceCreateRequest,
                  token: CancelToken) -> StoredVoice:
        try:
            data = base64.b64decode(body.audio.data, validate=True)
        except binascii.Error as exc:
            raise bad_request("the reference audio is not valid base64", param="audio.data",
                              code="invalid_audio") from exc
        try:
            if len(data) > self.limits.max_voice_audio_bytes:
                raise over_budget("max_voice_audio_bytes", f"the reference audio is over "
                                  f"{self.limits.max_voice_audio_bytes} bytes", "audio.data")
            audio = decode_reference(data, body.audio.format, self.limits, "audio.data", token.check)
            clone = speech.clone_voice(audio.samples, audio.sample_rate, body.transcript)
        except ValueError as exc:  # the front end's own words (a recording that gives no usable voice)
            raise bad_request(f"could not clone a voice from the audio: {exc}", param="audio",
                              code="invalid_audio") from exc
        try:
            return store.add(body.name, speech.clone_mode(body.transcript), lambda folder: speech.save_voice(clone, folder))
        except VoiceStoreError as exc:
            raise store_error(exc) from exc

    def list(self) -> VoiceList:
        speech = self.engine.front_end.speech
        if speech is not None and not speech.clones_voices:  # its built-in speakers, in vLLM-Omni's field
            return VoiceList(data=[], voices=list(speech.speakers))
        _, store = self._ready()
        stored = store.list()
        return VoiceList(data=[_object(v) for v in stored],
                         uploaded_voices=[UploadedVoice(name=v.name, created_at=v.created_at) for v in stored])

    def delete(self, name: str) -> VoiceDeleted:
        _, store = self._ready()
        try:
            store.delete(name)
        except VoiceStoreError as exc:
            raise store_error(exc) from exc
        return VoiceDeleted(id=name)
