"""``POST /v1/chat/completions``: text and speech answers, whole or streamed, with tool calls and n choices.

Each of ``n`` choices is its own engine request (``n > 1`` for text only), admitted
on its own place; the stream interleaves their chunks as they come (see
``stream.py`` for the chunk shapes). With ``seed``, choice ``i`` samples with
``seed + i``, so choices differ and each repeats.
"""

from __future__ import annotations

import asyncio
import base64
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, replace

import anyio
import msgspec
import numpy as np
from fastapi import Request
from fastapi.responses import JSONResponse, Response

from omnistage.audio import encode_audio, pcm16
from omnistage.core import Modality, OmniOutput, OmniRequest, Usage
from omnistage.engine.logprobs import TokenLogprob
from omnistage.entrypoints.openai.chat.inputs import ChatPromptBuilder
from omnistage.entrypoints.openai.chat.logprobs import LogprobWriter
from omnistage.entrypoints.openai.chat.protocol import (
    ChatCompletionAudio,
    ChatCompletionChoice,
    ChatCompletionMessage,
    ChatCompletionRequest,
    ChatCompletionResponse,
    FunctionCall,
    ToolCall,
)
from omnistage.entrypoints.openai.chat.request import ChatPlan, chat_plan, chat_sampling
from omnistage.entrypoints.openai.chat.spoken import SpokenAsk, SpokenChat
from omnistage.entrypoints.openai.chat.stream import AUDIO_TTL_S, ChunkWriter, finish_reason_name, usage_info
from omnistage.entrypoints.openai.common.admission import Admission, Ticket
from omnistage.entrypoints.openai.common.errors import APIError
from omnistage.entrypoints.openai.common.http_spans import traced
from omnistage.entrypoints.openai.common.metrics import RequestTimer, ServerMetrics
from omnistage.entrypoints.openai.common.request_checks import engine_failure, usage_of
from omnistage.entrypoints.openai.common.served_model import ServedModel
from omnistage.entrypoints.openai.common.streaming import (
    SSE_DONE,
    AbortingStreamingResponse,
    ClientDisconnected,
    engine_outputs,
    prepare_admitted,
    run_until_disconnect,
)
from omnistage.entrypoints.openai.common.tool_calls import ParsedCall
from omnistage.entrypoints.openai.engine_protocol import OmniEngine
from omnistage.processing.prompt import ProcessedPrompt
from omnistage.sampling_params import SamplingParams


@dataclass(frozen=True)
class _Completion:
    text: str
    audio: np.ndarray | None
    final: OmniOutput
    usage: Usage
    logprobs: tuple[TokenLogprob, ...]


def _total_usage(usages: list[Usage]) -> Usage:
    """n choices share one prompt: it counts once, their completions add up."""
    return Usage(usages[0].prompt_tokens, sum(u.completion_tokens for u in usages), usages[0].cached_tokens)


class ChatService:
    def __init__(self, engine: OmniEngine, builder: ChatPromptBuilder, metrics: ServerMetrics,
                 admission: Admission | None = None, served: ServedModel | None = None,
                 spoken: SpokenChat | None = None) -> None:
        """``spoken``: the served model is a conversational speech model (CSM), whose reply is spoken text."""
        self.engine = engine
        self.spoken = spoken
        self.builder = builder
        self.metrics = metrics
        self.admission = admission or Admission(engine, builder.limits.max_queued_requests)
        self.served = served or ServedModel.of(engine)
        self.timeout_s = builder.limits.request_timeout
        if self.engine.supports_audio:
            pcm16.preload()  # its first build takes a compiler run: not inside a stream's loop turn

    async def create(self, body: ChatCompletionRequest, raw: Request) -> Response:
        arrived = time.perf_counter()
        if self.spoken is not None:
            plan, ask = self.spoken.prepare(body)
            made = self._spoken(ask, bool(body.stream))
        else:
            plan = chat_plan(body, self.engine, self.served)
            made = self._made(body, plan)
        # Admitted before any media is fetched or decoded (a data: URL's base64 included): an overloaded server
        # refuses at once instead of first spending a pool job on a body it will not serve. The work then runs in
        # the bounded pool and stops if the client leaves; a media error gives the tickets back.
        tickets = self._admit(plan.choices, _modalities(plan))
        group = Ticket(lambda: [t.release() for t in tickets])
        try:
            requests = [traced(r) for r in await prepare_admitted(raw, group, made)]
        except ClientDisconnected:
            return Response(status_code=499)
        logprobs = LogprobWriter(getattr(self.engine.front_end.processor, "tokenizer", None), plan.logprobs or 0) \
            if plan.logprobs is not None else None
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            writer = ChunkWriter(requests[0].request_id, body.model, plan, logprobs)
            stream = self._stream(requests, tickets, writer, include_usage, arrived)
            return AbortingStreamingResponse(stream, media_type="text/event-stream", ticket=group)
        timer = self.metrics.track("/v1/chat/completions", arrived)
        try:
            done = await run_until_disconnect(raw, self._collect_all(requests, tickets, timer))
        except ClientDisconnected:
            timer.finish("client_disconnected")
            return Response(status_code=499)  # nobody reads it; the status shows in access logs
        finally:
            group.release()
        if self.spoken is not None:  # what it spoke is the transcript (and the text, when asked for)
            done = [replace(d, text=ask.speech.input) for d in done]
        reply = await self._reply(requests[0].request_id, body.model, done, plan, logprobs)
        return JSONResponse(reply.model_dump())

    def _admit(self, n: int, modalities: frozenset[Modality]) -> list[Ticket]:
        tickets: list[Ticket] = []
        try:
            for _ in range(n):
                tickets.append(self.admission.admit(modalities))
        except APIError:
            for ticket in tickets:
                ticket.release()
            raise
        return tickets

    async def _made(self, body: ChatCompletionRequest, plan: ChatPlan) -> list[OmniRequest]:
        prompt_plan = await self.builder.plan(body.messages, plan.template)  # media fetched, headers checked
        prompt = await self.builder.build(prompt_plan)
        return self._requests(body, plan, prompt, chat_sampling(body, self.engine, len(prompt.token_ids), plan))

    async def _spoken(self, ask: SpokenAsk, stream: bool) -> list[OmniRequest]:
        assert self.spoken is not None
        return [await self.spoken.request(ask, stream)]

    def _requests(self, body: ChatCompletionRequest, plan: ChatPlan, prompt: ProcessedPrompt,
                  sampling: SamplingParams) -> list[OmniRequest]:
        base = f"chatcmpl-{uuid.uuid4().hex}"
        modalities = _modalities(plan)
        tokenizer = getattr(self.engine.front_end.processor, "tokenizer", None)
        unspoken = plan.tools.unspoken(tokenizer) if plan.audio else None
        voice = {"voice": plan.audio.voice} if plan.audio else {}
        return [OmniRequest(request_id=base if plan.choices == 1 else f"{base}-{i}", prompt=prompt,
                            modalities=modalities,
                            sampling=sampling if sampling.seed is None or i == 0
                            else msgspec.structs.replace(sampling, seed=(sampling.seed + i) % 2**63),
                            initial_codec_chunk_frames=body.initial_codec_chunk_frames, stream=bool(body.stream),
                            unspoken=unspoken, **voice)
                for i in range(plan.choices)]

    async def _collect_all(self, requests: list[OmniRequest], tickets: list[Ticket],
                           timer: RequestTimer) -> list[_Completion]:
        try:
            done = await asyncio.gather(*(self._collect(r, t, timer) for r, t in zip(requests, tickets)))
        except APIError:
            timer.finish("engine_error")
            raise
        timer.finish("ok")
        return list(done)

    async def _collect(self, request: OmniRequest, ticket: Ticket, timer: RequestTimer) -> _Completion:
        texts: list[str] = []
        chunks: list[np.ndarray] = []
        logprobs: list[TokenLogprob] = []
        final: OmniOutput | None = None
        completion_tokens = 0
        async with aclosing(engine_outputs(self.engine, request, timeout_s=self.timeout_s, ticket=ticket)) as outputs:
            async for out in outputs:
                timer.observe(out)
                texts.append(out.text)
                logprobs.extend(out.logprobs)
                completion_tokens += len(out.token_ids)
                if out.audio is not None and out.audio.size:
                    chunks.append(out.audio)
                final = out
        failure = engine_failure(final)
        if failure is not None:
            raise failure
        assert final is not None
        audio = np.concatenate(chunks).astype(np.float32) if chunks else None
        return _Completion("".join(texts), audio, final,
                           usage_of(final, request.prompt.num_tokens, completion_tokens), tuple(logprobs))

    async def _reply(self, request_id: str, model: str, done: list[_Completion], plan: ChatPlan,
                     logprobs: LogprobWriter | None) -> ChatCompletionResponse:
        choices = [await self._choice(i, c, plan, logprobs) for i, c in enumerate(done)]
        if plan.split:  # vLLM-Omni's shape: the text in one choice, the audio in the next
            choices = [part for c in choices for part in _per_modality(c)]
        return ChatCompletionResponse(id=request_id, created=int(time.time()), model=model, choices=choices,
                                      usage=usage_info(_total_usage([c.usage for c in done])))

    async def _choice(self, index: int, done: _Completion, plan: ChatPlan,
                      logprobs: LogprobWriter | None) -> ChatCompletionChoice:
        parser = plan.tools.parser()
        text, calls = done.text, []
        if parser is not None:
            head, calls = parser.feed(done.text)
            tail, more = parser.finish()
            text, calls = head + tail, calls + more
        speech: ChatCompletionAudio | None = None
        if plan.audio is not None:
            samples = done.audio if done.audio is not None else np.zeros(0, dtype=np.float32)
            # mp3/opus encoding is CPU work: keep it off the event loop.
            data = await anyio.to_thread.run_sync(encode_audio, samples, plan.audio.source_rate, plan.audio.format)
            speech = ChatCompletionAudio(id=f"audio_{uuid.uuid4().hex}", data=base64.b64encode(data).decode("ascii"),
                                         expires_at=int(time.time()) + AUDIO_TTL_S, transcript=text)
        content = None if not plan.text else (text or None) if calls else text
        message = ChatCompletionMessage(content=content, audio=speech,
                                        tool_calls=_tool_calls(calls) or None)
        return ChatCompletionChoice(index=index, message=message,
                                    finish_reason=finish_reason_name(done.final.finish_reason, bool(calls)),
                                    logprobs=logprobs.choice(done.logprobs) if logprobs is not None else None)

    async def _stream(self, requests: list[OmniRequest], tickets: list[Ticket], writer: ChunkWriter,
                      include_usage: bool, arrived: float) -> AsyncIterator[str | bytes]:
        """The SSE body. Nothing starts (no timer, no engine request) until the response is being sent."""
        timer = self.metrics.track("/v1/chat/completions", arrived, streamed=True)
        outcome = "client_disconnected"  # unless every choice's final output is reached
        usages: list[Usage] = []
        tokens = [0] * len(requests)
        try:
            for event in writer.start():
                yield event
            async with aclosing(self._merged(requests, tickets)) as outputs:
                async for index, out in outputs:
                    if out is None:  # that choice's stream ended without a final output
                        outcome = "engine_error"
                        yield writer.error(engine_failure(None))
                        return
                    timer.observe(out)
                    tokens[index] += len(out.token_ids)
                    events = writer.output(index, out)
                    if events:  # one write for an output's events (its transcript and its audio)
                        yield _joined(events)
                    if not out.finished:
                        continue
                    failure = engine_failure(out)
                    if failure is not None:  # OpenAI's client raises on an event carrying "error"
                        outcome = "engine_error"
                        yield writer.error(failure)
                        return
                    usages.append(usage_of(out, requests[index].prompt.num_tokens, tokens[index]))
                    yield _joined(writer.end(index, out))  # at once: its audio's tail plays on from the last chunk
            outcome = "ok"
            # One write for the usage and [DONE] (the same events, a socket write fewer).
            yield _joined([writer.usage(_total_usage(usages)), SSE_DONE] if include_usage else [SSE_DONE])
        finally:
            timer.finish(outcome)

    async def _merged(self, requests: list[OmniRequest], tickets: list[Ticket],
                      ) -> AsyncIterator[tuple[int, OmniOutput | None]]:
        """Every choice's outputs as they come, as ``(index, output)``; ``(index, None)`` when a choice's stream
        ended without a final output. Closing this stops (and aborts) every choice still running."""
        if len(requests) == 1:  # one choice: its stream as it is (no task and queue hop per output)
            async with aclosing(engine_outputs(self.engine, requests[0], timeout_s=self.timeout_s,
                                               ticket=tickets[0])) as outputs:
                finished = False
                async for out in outputs:
                    finished = out.finished
                    yield 0, out
            if not finished:
                yield 0, None
            return
        # One slot: a choice's engine stream advances only as fast as the client reads (nothing piles up here).
        queue: asyncio.Queue[tuple[int, OmniOutput | None]] = asyncio.Queue(maxsize=1)

        async def pump(index: int, request: OmniRequest, ticket: Ticket) -> None:
            finished = False
            async with aclosing(engine_outputs(self.engine, request, timeout_s=self.timeout_s,
                                               ticket=ticket)) as outputs:
                async for out in outputs:
                    finished = out.finished
                    await queue.put((index, out))
            if not finished:
                await queue.put((index, None))

        tasks = [asyncio.create_task(pump(i, r, t)) for i, (r, t) in enumerate(zip(requests, tickets))]
        try:
            left = len(tasks)
            while left:
                index, out = await queue.get()
                left -= out is None or out.finished
                yield index, out
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def _joined(events: list[str | bytes]) -> str | bytes:
    """One write's events; audio chunks come as bytes (written around their base64), text as str."""
    if len(events) == 1:
        return events[0]
    return b"".join(e if isinstance(e, bytes) else e.encode() for e in events)


def _per_modality(choice: ChatCompletionChoice) -> list[ChatCompletionChoice]:
    """One choice as two, text then audio, indexed in order (n is 1 when there is audio)."""
    message = choice.message
    text = choice.model_copy(update={"message": message.model_copy(update={"audio": None})})
    audio = choice.model_copy(update={"index": choice.index + 1, "logprobs": None,
                                      "message": message.model_copy(update={"content": None, "tool_calls": None})})
    return [text, audio]


def _tool_calls(calls: list[ParsedCall]) -> list[ToolCall]:
    return [ToolCall(id=c.id, function=FunctionCall(name=c.name, arguments=c.arguments)) for c in calls]


def _modalities(plan: ChatPlan) -> frozenset[Modality]:
    """What the request wants out: text, and audio when it asked for it (admission checks their stages)."""
    return frozenset({Modality.TEXT} | ({Modality.AUDIO} if plan.audio else set()))
