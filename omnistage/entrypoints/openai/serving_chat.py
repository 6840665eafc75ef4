"""``POST /v1/chat/completions``: text and speech answers, whole or streamed.

Streaming speech: OpenAI only streams ``pcm16``, so a request for ``wav`` or
``pcm16`` streams raw base64 PCM16 (24 kHz mono) chunks in ``delta.audio.data``,
as OpenAI does; a client wanting a WAV file wraps the concatenation in a header.
``mp3``, ``flac``, ``opus`` and ``aac`` stream successive pieces of one encoded
file, so the concatenated chunks decode as that format. Text goes in
``delta.content``; when speech is requested it is repeated in
``delta.audio.transcript``, where OpenAI's audio clients read it.
"""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass

import anyio
import numpy as np
from fastapi import Request
from fastapi.responses import JSONResponse, Response

from omnistage.audio import AudioFormat, StreamingAudioEncoder, encode_audio
from omnistage.core import OUTPUT_SAMPLE_RATE, Modality, OmniOutput, OmniRequest, RequestSampling, Usage
from omnistage.entrypoints.openai.admission import Admission, Ticket
from omnistage.entrypoints.openai.chat_inputs import ChatPromptBuilder, PromptPlan
from omnistage.entrypoints.openai.engine_protocol import OmniEngine
from omnistage.entrypoints.openai.errors import SERVER_ERROR, APIError, bad_request
from omnistage.entrypoints.openai.metrics import RequestTimer, ServerMetrics
from omnistage.entrypoints.openai.protocol import (
    ChatCompletionAudio,
    ChatCompletionChoice,
    ChatCompletionChunk,
    ChatCompletionMessage,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChoiceDelta,
    ChunkChoice,
    DeltaAudio,
    ErrorDetail,
    ErrorResponse,
    PromptTokensDetails,
    UsageInfo,
)
from omnistage.entrypoints.openai.serving_common import (
    check_model,
    completion_budget,
    engine_failure,
    finish_reason_name,
    make_sampling,
    require_audio_support,
    resolve_voice,
    top_k_of,
    usage_of,
)
from omnistage.entrypoints.openai.streaming import (
    SSE_DONE,
    AbortingStreamingResponse,
    ClientDisconnected,
    engine_outputs,
    prepare_admitted,
    run_until_disconnect,
    sse_event,
)
from omnistage.processing.prompt import ProcessedPrompt

# Audio is not kept, but OpenAI's clients expect an expiry; an hour is what OpenAI gives.
AUDIO_TTL_S = 3600


@dataclass(frozen=True)
class AudioOutput:
    voice: str
    format: AudioFormat


@dataclass(frozen=True)
class _Completion:
    text: str
    audio: np.ndarray | None
    final: OmniOutput
    usage: Usage


def _usage_info(usage: Usage) -> UsageInfo:
    return UsageInfo(prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens,
                     total_tokens=usage.total_tokens,
                     prompt_tokens_details=PromptTokensDetails(cached_tokens=usage.cached_tokens))


class ChatService:
    def __init__(self, engine: OmniEngine, builder: ChatPromptBuilder, metrics: ServerMetrics,
                 admission: Admission | None = None) -> None:
        self.engine = engine
        self.builder = builder
        self.metrics = metrics
        self.admission = admission or Admission(engine, builder.limits.max_queued_requests)
        self.timeout_s = builder.limits.request_timeout

    async def create(self, body: ChatCompletionRequest, raw: Request) -> Response:
        arrived = time.perf_counter()
        check_model(self.engine, body.model)
        audio = self._audio_output(body)
        top_k = top_k_of(self.engine, body.top_k)
        plan = await self.builder.plan(body.messages)  # media fetched and their headers checked: nothing decoded
        # Admitted before the decoding, which then runs in the bounded pool and stops if the client leaves.
        ticket = self.admission.admit()
        try:
            prompt, sampling = await prepare_admitted(raw, ticket, self._prompt(body, plan, top_k))
        except ClientDisconnected:
            return Response(status_code=499)
        modalities = frozenset({Modality.TEXT} | ({Modality.AUDIO} if audio else set()))
        request = OmniRequest(request_id=f"chatcmpl-{uuid.uuid4().hex}", prompt=prompt, modalities=modalities,
                              sampling=sampling, initial_codec_chunk_frames=body.initial_codec_chunk_frames,
                              stream=bool(body.stream),
                              **({"voice": audio.voice} if audio else {}))
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            stream = self._stream(request, body.model, audio, include_usage, arrived, ticket)
            return AbortingStreamingResponse(stream, media_type="text/event-stream", ticket=ticket)
        timer = self.metrics.track("/v1/chat/completions", arrived)
        try:
            done = await run_until_disconnect(raw, self._collect(request, timer, ticket))
        except ClientDisconnected:
            timer.finish("client_disconnected")
            return Response(status_code=499)  # nobody reads it; the status shows in access logs
        finally:
            ticket.release()
        reply = await self._reply(request.request_id, body.model, done, audio)
        return JSONResponse(reply.model_dump())

    async def _prompt(self, body: ChatCompletionRequest, plan: PromptPlan, top_k: int | None,
                      ) -> tuple[ProcessedPrompt, RequestSampling]:
        prompt = await self.builder.build(plan)
        param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
        budget = completion_budget(body.max_completion_tokens or body.max_tokens, len(prompt.token_ids),
                                   self.engine.max_model_len, param)
        sampling = make_sampling(max_tokens=budget, temperature=body.temperature, top_p=body.top_p, top_k=top_k,
                                 repetition_penalty=body.repetition_penalty, seed=body.seed, stop=body.stop_sequences)
        return prompt, sampling

    def _audio_output(self, body: ChatCompletionRequest) -> AudioOutput | None:
        wants_audio = "audio" in (body.modalities or ["text"])
        if not wants_audio:
            if body.audio is not None:
                raise bad_request("'audio' is set but modalities does not include 'audio'", param="audio")
            return None
        if body.audio is None:
            raise bad_request("audio output needs the 'audio' parameter ({voice, format})", param="audio")
        require_audio_support(self.engine, "modalities")
        voice = resolve_voice(self.engine, body.audio.voice_name, "audio.voice")
        return AudioOutput(voice=voice, format=AudioFormat.parse(body.audio.format))

    async def _collect(self, request: OmniRequest, timer: RequestTimer, ticket: Ticket) -> _Completion:
        texts: list[str] = []
        chunks: list[np.ndarray] = []
        final: OmniOutput | None = None
        completion_tokens = 0
        async with aclosing(engine_outputs(self.engine, request, timeout_s=self.timeout_s, ticket=ticket)) as outputs:
            async for out in outputs:
                timer.observe(out)
                texts.append(out.text)
                completion_tokens += len(out.token_ids)
                if out.audio is not None and out.audio.size:
                    chunks.append(out.audio)
                final = out
        failure = engine_failure(final)
        if failure is not None:
            timer.finish("engine_error")
            raise failure
        assert final is not None
        timer.finish("ok")
        audio = np.concatenate(chunks).astype(np.float32) if chunks else None
        return _Completion("".join(texts), audio, final,
                           usage_of(final, len(request.prompt.token_ids), completion_tokens))

    async def _reply(self, request_id: str, model: str, done: _Completion,
                     audio: AudioOutput | None) -> ChatCompletionResponse:
        speech: ChatCompletionAudio | None = None
        if audio is not None:
            samples = done.audio if done.audio is not None else np.zeros(0, dtype=np.float32)
            # mp3/opus encoding is CPU work: keep it off the event loop.
            data = await anyio.to_thread.run_sync(encode_audio, samples, OUTPUT_SAMPLE_RATE, audio.format)
            speech = ChatCompletionAudio(
                id=f"audio_{uuid.uuid4().hex}", data=base64.b64encode(data).decode("ascii"),
                expires_at=int(time.time()) + AUDIO_TTL_S, transcript=done.text,
            )
        message = ChatCompletionMessage(content=done.text, audio=speech)
        choice = ChatCompletionChoice(message=message, finish_reason=finish_reason_name(done.final.finish_reason))
        return ChatCompletionResponse(id=request_id, created=int(time.time()), model=model, choices=[choice],
                                      usage=_usage_info(done.usage))

    async def _stream(self, request: OmniRequest, model: str, audio: AudioOutput | None, include_usage: bool,
                      arrived: float, ticket: Ticket) -> AsyncIterator[str]:
        """The SSE body. Nothing starts (no timer, no engine request) until the response is being sent."""
        timer = self.metrics.track("/v1/chat/completions", arrived, streamed=True)
        chunks = _ChunkWriter(request.request_id, model, audio)
        outcome = "client_disconnected"  # unless the engine's final output is reached
        completion_tokens = 0
        try:
            yield chunks.delta(ChoiceDelta(role="assistant", content=""))
            async with aclosing(engine_outputs(self.engine, request, timeout_s=self.timeout_s,
                                               ticket=ticket)) as outputs:
                async for out in outputs:
                    timer.observe(out)
                    completion_tokens += len(out.token_ids)
                    for event in chunks.output(out):
                        yield event
                    if out.finished:
                        usage = usage_of(out, len(request.prompt.token_ids), completion_tokens)
                        events, outcome = chunks.end(out, usage if include_usage else None)
                        for event in events:
                            yield event
                        return
            outcome = "engine_error"
            yield chunks.error(engine_failure(None))
        finally:
            timer.finish(outcome)


class _ChunkWriter:
    """Builds the SSE events of one streamed completion; owns the audio encoder and the audio id."""

    def __init__(self, request_id: str, model: str, audio: AudioOutput | None) -> None:
        self.request_id = request_id
        self.model = model
        self.created = int(time.time())
        self.audio = audio
        self.audio_id = f"audio_{uuid.uuid4().hex}"
        self.encoder: StreamingAudioEncoder | None = None
        if audio is not None:
            streamed = AudioFormat.PCM16 if audio.format in (AudioFormat.WAV, AudioFormat.PCM16) else audio.format
            self.encoder = StreamingAudioEncoder(streamed, OUTPUT_SAMPLE_RATE)

    def delta(self, delta: ChoiceDelta, finish: OmniOutput | None = None) -> str:
        reason = finish_reason_name(finish.finish_reason) if finish is not None else None
        chunk = ChatCompletionChunk(id=self.request_id, created=self.created, model=self.model,
                                    choices=[ChunkChoice(delta=delta, finish_reason=reason)])
        return sse_event(chunk)

    def output(self, out: OmniOutput) -> list[str]:
        events: list[str] = []
        if out.text:
            transcript = DeltaAudio(id=self.audio_id, transcript=out.text) if self.audio else None
            events.append(self.delta(ChoiceDelta(content=out.text, audio=transcript)))
        if self.encoder is not None and out.audio is not None and out.audio.size:
            # Encoding a chunk takes milliseconds; a thread hop would cost about as much.
            events.extend(self._audio_data(self.encoder.feed(out.audio)))
        return events

    def end(self, out: OmniOutput, usage: Usage | None) -> tuple[list[str], str]:
        """The closing events for the final output, and the request's outcome for the metrics."""
        failure = engine_failure(out)
        if failure is not None:
            # OpenAI's client raises on an event carrying "error".
            return [self.error(failure)], "engine_error"
        events = self._audio_data(self.encoder.finish()) if self.encoder is not None else []
        if self.audio is not None:
            expiry = DeltaAudio(id=self.audio_id, expires_at=int(time.time()) + AUDIO_TTL_S)
            events.append(self.delta(ChoiceDelta(audio=expiry)))
        events.append(self.delta(ChoiceDelta(), finish=out))
        if usage is not None:
            events.append(sse_event(ChatCompletionChunk(id=self.request_id, created=self.created, model=self.model,
                                                        choices=[], usage=_usage_info(usage))))
        events.append(SSE_DONE)
        return events, "ok"

    @staticmethod
    def error(failure: APIError | None) -> str:
        detail = failure.detail if failure is not None else ErrorDetail(message="unknown error", type=SERVER_ERROR)
        return sse_event(ErrorResponse(error=detail))

    def _audio_data(self, data: bytes) -> list[str]:
        if not data:
            return []
        encoded = base64.b64encode(data).decode("ascii")
        return [self.delta(ChoiceDelta(audio=DeltaAudio(id=self.audio_id, data=encoded)))]
