"""``POST /v1/responses`` on the chat pipeline, and ``GET``/``DELETE /v1/responses/{id}``.

A request is checked (model, tools, ``previous_response_id`` in the store: an unknown one is a 404 before any
work), its conversation planned and its media headers checked against the budget, then admitted; its prompt is
built in the decode pool and one thinker request runs, its outputs turned into events by ``ResponseWriter``.
Streamed, every event is sent as made; whole, the final response object is the answer (an engine failure is then
the same 5xx as chat's). A finished response is stored (unless ``store: false``) before its last event leaves, so
a client may chain on it as soon as it reads ``response.completed``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from omnistage.core import Modality, OmniOutput, OmniRequest
from omnistage.entrypoints.openai.common.admission import Admission, Ticket
from omnistage.entrypoints.openai.common.auth import caller
from omnistage.entrypoints.openai.common.errors import bad_request
from omnistage.entrypoints.openai.common.http_spans import traced
from omnistage.entrypoints.openai.common.metrics import ServerMetrics
from omnistage.entrypoints.openai.common.request_checks import (
    completion_budget,
    engine_failure,
    make_sampling,
    require_audio_support,
    require_chat,
    resolve_voice,
    usage_of,
)
from omnistage.entrypoints.openai.common.served_model import ServedModel
from omnistage.entrypoints.openai.common.streaming import (
    AbortingStreamingResponse,
    ClientDisconnected,
    engine_outputs,
    prepare_admitted,
    run_until_disconnect,
)
from omnistage.entrypoints.openai.common.tool_calls import ToolSetup
from omnistage.entrypoints.openai.engine_protocol import OmniEngine
from omnistage.entrypoints.openai.media.prompt_builder import PromptBuilder
from omnistage.entrypoints.openai.responses.events import ResponseEvent
from omnistage.entrypoints.openai.responses.inputs import input_items, plan_prompt, tools_of
from omnistage.entrypoints.openai.responses.protocol import (
    FunctionToolOut,
    InputItem,
    ResponseDeleted,
    ResponseObject,
    ResponsesRequest,
)
from omnistage.entrypoints.openai.responses.store import ResponseStore, StoredResponse, stored_size
from omnistage.entrypoints.openai.responses.stream import ResponseWriter, sse
from omnistage.processing.prompt import ProcessedPrompt
from omnistage.sampling_params import SamplingParams

ENDPOINT = "/v1/responses"


class ResponsesService:
    def __init__(self, engine: OmniEngine, builder: PromptBuilder, admission: Admission, served: ServedModel,
                 metrics: ServerMetrics, store: ResponseStore) -> None:
        self.engine = engine
        self.builder = builder
        self.admission = admission
        self.served = served
        self.metrics = metrics
        self.store = store
        self.timeout_s = builder.limits.request_timeout

    async def create(self, body: ResponsesRequest, raw: Request) -> Response:
        arrived = time.perf_counter()
        self.served.check(body.model)
        require_chat(self.engine)
        voice = self._voice(body)
        owner = caller(raw.scope)
        history = self.store.get(body.previous_response_id, owner, "previous_response_id").history() \
            if body.previous_response_id else []
        items = input_items(body)
        tools = tools_of(body)
        # Admitted before any media is fetched or decoded (as chat): see ChatService.create.
        modalities = frozenset({Modality.TEXT, Modality.AUDIO} if voice else {Modality.TEXT})
        ticket = self.admission.admit(modalities)  # text alone is served while the audio stages are down
        try:
            prompt, sampling = await prepare_admitted(raw, ticket, self._prompt(body, history, items, tools))
        except ClientDisconnected:
            return Response(status_code=499)
        request_id = f"resp_{uuid.uuid4().hex}"
        request = traced(OmniRequest(
            request_id=request_id, prompt=prompt, sampling=sampling, stream=bool(body.stream),
            modalities=modalities,
            unspoken=tools.unspoken(getattr(self.engine.front_end.processor, "tokenizer", None)) if voice else None,
            **({"voice": voice} if voice else {})))
        writer = ResponseWriter(_initial(body, request_id, sampling), tools.parser(), audio=voice is not None)
        keep = None if body.store is False else StoredResponse(
            writer.response, (*history, *items), owner, stored_size(len(await raw.body()), len(items)))
        events = self._events(request, ticket, writer, keep, body, arrived)
        if body.stream:
            return AbortingStreamingResponse(_sse(events), media_type="text/event-stream", ticket=ticket)
        try:
            await run_until_disconnect(raw, _drain(events))
        except ClientDisconnected:
            return Response(status_code=499)
        finally:
            ticket.release()
        return JSONResponse(writer.response.model_dump())

    def retrieve(self, response_id: str, owner: str) -> ResponseObject:
        return self.store.get(response_id, owner).response

    def delete(self, response_id: str, owner: str) -> ResponseDeleted:
        self.store.delete(response_id, owner)
        return ResponseDeleted(id=response_id)

    def _voice(self, body: ResponsesRequest) -> str | None:
        if not body.speaks:
            if body.audio is not None:
                raise bad_request("'audio' is set but modalities does not include 'audio'", param="audio")
            return None
        require_audio_support(self.engine, "modalities")
        return resolve_voice(self.served.voices, body.audio.voice if body.audio else None, "audio.voice")

    async def _prompt(self, body: ResponsesRequest, history: list[InputItem], items: list[InputItem],
                      tools: ToolSetup) -> tuple[ProcessedPrompt, SamplingParams]:
        plan = await plan_prompt(self.builder, body.instructions, history, items, tools)
        prompt = await self.builder.build(plan)
        budget = completion_budget(body.max_output_tokens, len(prompt.token_ids), self.engine.max_model_len,
                                   "max_output_tokens", self.engine.default_sampling.max_tokens)
        return prompt, make_sampling(max_tokens=budget, defaults=self.engine.default_sampling,
                                     temperature=body.temperature, top_p=body.top_p, seed=body.seed)

    async def _events(self, request: OmniRequest, ticket: Ticket, writer: ResponseWriter,
                      keep: StoredResponse | None, body: ResponsesRequest,
                      arrived: float) -> AsyncIterator[ResponseEvent]:
        """The response's events; nothing starts (no timer, no engine request) until the first is asked for.
        ``keep``: the entry to store once the response has ended well (None: ``store: false``)."""
        timer = self.metrics.track(ENDPOINT, arrived, streamed=bool(body.stream))
        outcome = "client_disconnected"  # unless the final output is reached
        final: OmniOutput | None = None
        tokens = 0
        try:
            for event in writer.start():
                yield event
            async with aclosing(engine_outputs(self.engine, request, timeout_s=self.timeout_s,
                                               ticket=ticket)) as outputs:
                async for out in outputs:
                    timer.observe(out)
                    tokens += len(out.token_ids)
                    final = out if out.finished else None
                    for event in writer.output(out):
                        yield event
            failure = engine_failure(final)
            if failure is not None:
                outcome = "engine_error"
                if not body.stream:
                    raise failure
                for event in writer.fail(failure.detail.message):
                    yield event
                return
            assert final is not None
            ending = writer.finish(final, usage_of(final, len(request.prompt.token_ids), tokens))
            if keep is not None:  # stored before the client can read that it ended
                self.store.put(keep)
            outcome = "ok"
            for event in ending:
                yield event
        finally:
            timer.finish(outcome)


def _initial(body: ResponsesRequest, request_id: str, sampling: SamplingParams) -> ResponseObject:
    """The response as ``response.created`` shows it: the request's settings as they apply, no output yet."""
    return ResponseObject(
        id=request_id, created_at=int(time.time()), status="in_progress", model=body.model,
        instructions=body.instructions, previous_response_id=body.previous_response_id,
        max_output_tokens=body.max_output_tokens, temperature=sampling.temperature, top_p=sampling.top_p,
        tools=[FunctionToolOut(**t.model_dump(include={"name", "description", "parameters", "strict"}))
               for t in body.tools or ()],
        tool_choice=body.tool_choice or "auto", parallel_tool_calls=body.parallel_tool_calls is not False,
        metadata=body.metadata, store=body.store is not False)


async def _sse(events: AsyncIterator[ResponseEvent]) -> AsyncIterator[str]:
    async with aclosing(events):  # type: ignore[type-var]
        async for event in events:
            yield sse(event)


async def _drain(events: AsyncIterator[ResponseEvent]) -> None:
    async with aclosing(events):  # type: ignore[type-var]
        async for _ in events:
            pass
