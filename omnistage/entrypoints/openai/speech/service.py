"""``POST /v1/audio/speech``: text in, speech out, streamed as it is generated.

What the input becomes depends on the served family (:mod:`omnistage.entrypoints.openai.speech.inputs`): a
text-to-speech checkpoint speaks it, Qwen3-Omni's thinker repeats it for its talker.

``speed`` time-stretches the generated audio without changing its pitch
(``omnistage.audio.time_stretch``), chunk by chunk with carried state, so a
streamed response is stretched exactly as a whole one would be.

``stream_format="audio"`` sends the bytes of one file in ``response_format`` as
they are encoded (WAV with 'unknown' sizes in its header); ``"sse"`` sends the
same bytes base64-encoded in ``speech.audio.delta`` events, then a
``speech.audio.done`` event with the usage.
"""

from __future__ import annotations

import base64
import time
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing

from fastapi import Request
from fastapi.responses import Response

from omnistage.audio import StreamingAudioEncoder, TimeStretcher
from omnistage.core import OmniOutput, OmniRequest
from omnistage.entrypoints.openai.common.admission import Admission, Ticket
from omnistage.entrypoints.openai.common.decode_pool import DecodePool
from omnistage.entrypoints.openai.common.errors import APIError
from omnistage.entrypoints.openai.common.http_spans import traced
from omnistage.entrypoints.openai.common.metrics import RequestTimer, ServerMetrics
from omnistage.entrypoints.openai.common.protocol import ErrorResponse
from omnistage.entrypoints.openai.common.request_budget import over_budget
from omnistage.entrypoints.openai.common.request_checks import engine_failure, require_audio_support, usage_of
from omnistage.entrypoints.openai.common.served_model import ServedModel, audio_rate
from omnistage.entrypoints.openai.common.streaming import (
    AbortingStreamingResponse,
    ClientDisconnected,
    engine_outputs,
    peek,
    prepare_admitted,
    sse_event,
)
from omnistage.entrypoints.openai.engine_protocol import OmniEngine
from omnistage.entrypoints.openai.media.loaders import MediaFetcher
from omnistage.entrypoints.openai.server_config import ServerLimits
from omnistage.entrypoints.openai.speech.context import check_turns
from omnistage.entrypoints.openai.speech.inputs import context_turns, speech_inputs
from omnistage.entrypoints.openai.speech.protocol import SpeechAudioDelta, SpeechAudioDone, SpeechRequest, SpeechUsage
from omnistage.entrypoints.openai.speech.voice_store import VoiceStore


class SpeechService:
    def __init__(self, engine: OmniEngine, metrics: ServerMetrics, limits: ServerLimits,
                 admission: Admission | None = None, pool: DecodePool | None = None,
                 served: ServedModel | None = None, voices: VoiceStore | None = None,
                 fetcher: MediaFetcher | None = None) -> None:
        self.engine = engine
        self.served = served or ServedModel.of(engine)
        self.metrics = metrics
        self.limits = limits
        self.admission = admission or Admission(engine, limits.max_queued_requests)
        self.pool = pool or DecodePool(limits.decode_workers)
        self.inputs = speech_inputs(engine, self.served, self.pool, voices, limits, fetcher)

    async def create(self, body: SpeechRequest, raw: Request) -> Response:
        arrived = time.perf_counter()
        self.check(body)
        ticket = self.admission.admit()  # before the tokenising, which runs in the bounded pool
        try:
            request = traced(await prepare_admitted(raw, ticket, self.inputs.request(body)))
        except ClientDisconnected:
            return Response(status_code=499)
        timer = self.metrics.track("/v1/audio/speech", arrived, streamed=True)
        encoded = self._encoded(request, body, timer, ticket)
        try:
            first, pieces = await peek(raw, encoded)
        except ClientDisconnected:
            return Response(status_code=499)  # nobody reads it; the status shows in access logs
        # A request that fails before its first audio still gets a JSON error, not a cut connection.
        failure = engine_failure(first) if not isinstance(first, bytes) else None
        if failure is not None:
            await encoded.aclose()
            raise failure
        if body.stream_format == "sse":
            return AbortingStreamingResponse(self._sse(pieces, request), media_type="text/event-stream",
                                             upstream=encoded)
        return AbortingStreamingResponse(self._bytes(pieces, request), media_type=body.audio_format.media_type,
                                         upstream=encoded)

    def check(self, body: SpeechRequest) -> None:
        if body.model is not None:  # None: the served model
            self.served.check(body.model)
        require_audio_support(self.engine, "model")
        self.inputs.check_voice(body)
        check_turns(context_turns(body), self.engine.front_end.speech, self.limits)
        if len(body.input) > self.limits.max_speech_input_chars:
            raise over_budget("max_speech_input_chars", f"input is {len(body.input)} characters; the limit is "
                              f"{self.limits.max_speech_input_chars}", "input", "input_too_long")
        if body.ref_text is not None and len(body.ref_text) > self.limits.max_speech_input_chars:
            raise over_budget("max_speech_input_chars", f"ref_text is {len(body.ref_text)} characters; the limit is "
                              f"{self.limits.max_speech_input_chars}", "ref_text", "input_too_long")
        if body.instructions is not None and len(body.instructions) > self.limits.max_instructions_chars:
            raise over_budget("max_instructions_chars", f"instructions are {len(body.instructions)} characters; "
                              f"the limit is {self.limits.max_instructions_chars}", "instructions", "input_too_long")

    async def _encoded(self, request: OmniRequest, body: SpeechRequest, timer: RequestTimer, ticket: Ticket,
                       ) -> AsyncGenerator[bytes | OmniOutput, None]:
        """Encoded audio pieces as they come, then the final output (checked for failure by the caller).

        This generator owns the request's timer: however the stream ends, its ``finally`` records how.
        """
        outcome = "client_disconnected"  # unless the engine's stream ends
        encoder = StreamingAudioEncoder(body.audio_format, audio_rate(self.engine))
        # Stretching and encoding a chunk take milliseconds: done inline, as the chat stream encodes.
        stretcher = TimeStretcher(body.speed)
        try:
            async with aclosing(engine_outputs(self.engine, request, timeout_s=self.limits.request_timeout,
                                               ticket=ticket)) as outputs:
                async for out in outputs:
                    timer.observe(out)
                    if out.audio is not None and out.audio.size and (piece := encoder.feed(stretcher.feed(out.audio))):
                        yield piece
                    if out.finished:
                        outcome = "ok" if engine_failure(out) is None else "engine_error"
                        if outcome == "ok":
                            yield encoder.feed(stretcher.finish()) + encoder.finish()
                        yield out
                        return
            outcome = "engine_error"  # the engine stopped without a final output
        finally:
            ticket.release()  # engine_outputs releases it too, unless it never started
            timer.finish(outcome)

    @staticmethod
    async def _bytes(pieces: AsyncGenerator[bytes | OmniOutput, None], request: OmniRequest) -> AsyncIterator[bytes]:
        final: OmniOutput | None = None
        async with aclosing(pieces):
            async for piece in pieces:
                if isinstance(piece, OmniOutput):
                    final = piece
                elif piece:
                    yield piece
        failure = engine_failure(final)
        if failure is not None:
            # The headers are out: breaking the connection is the only way left to say it failed.
            raise RuntimeError(f"speech request {request.request_id} failed: {failure.detail.message}")

    @classmethod
    async def _sse(cls, pieces: AsyncGenerator[bytes | OmniOutput, None], request: OmniRequest) -> AsyncIterator[str]:
        final: OmniOutput | None = None
        async with aclosing(pieces):
            async for piece in pieces:
                if isinstance(piece, OmniOutput):
                    final = piece
                elif piece:
                    yield sse_event(SpeechAudioDelta(audio=base64.b64encode(piece).decode("ascii")))
        yield cls._done_event(final, request, engine_failure(final))

    @staticmethod
    def _done_event(final: OmniOutput | None, request: OmniRequest, failure: APIError | None) -> str:
        if failure is not None:
            return sse_event(ErrorResponse(error=failure.detail))
        assert final is not None  # engine_failure(None) is never None
        usage = usage_of(final, request.prompt.num_tokens, 0)
        return sse_event(SpeechAudioDone(usage=SpeechUsage(input_tokens=usage.prompt_tokens,
                                                           output_tokens=usage.completion_tokens,
                                                           total_tokens=usage.total_tokens)))
