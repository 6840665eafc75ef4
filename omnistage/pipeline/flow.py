"""How one request's messages move between stages, and what its caller sees.

All methods run on the orchestrator's thread, one message at a time, so the
per-request state needs no locks. Routing follows the stage graph, never
stage roles: a request starts at the graph's entry stage with the input its
family prepares, and each output of a stage goes through every edge leaving it
(the edge's per-request :class:`RequestEdge` turns it into the next stage's
inputs: async chunk streaming, so a talker starts on its source's first token).
Outputs the caller gets are generic: tokens of the stage whose output is text
(detokenised, stop strings), audio chunks of the stage whose output is audio
(the player model, the audio gate). The generic codec edge carries no frames:
the talker replica cuts and sends its chunks itself, and this side plans them
(:mod:`omnistage.pipeline.codec_edge`: the stream opened before the talker's
first input, orders batched per talker replica and sent once per orchestrator
pass by :meth:`RequestFlows.flush_orders`). A request is done once every stage
it entered has let it go. A prefill-only request (``OmniRequest.prefill_only``)
stops short of the stage that makes audio and passes the gate: it is no stream.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import msgspec
import numpy as np

from omnistage.audio_spec import AudioSpec
from omnistage.core import FinishReason, Modality, OmniOutput, OmniRequest, PromptDelta, Usage
from omnistage.engine.generation_engine import StreamVoice
from omnistage.engine.logprobs import TokenLogprob
from omnistage.families.base import EdgeContext, RequestEdge
from omnistage.ipc.messages import (
    AbortRequests,
    ChunkOrder,
    ChunkOrders,
    FrameNotes,
    ReplicaInput,
    StageInput,
    StageOutput,
)
from omnistage.ipc.payloads import AudioChunk, CodecFrames, FramesMade, TokenDelta
from omnistage.pipeline.audio_gate import AudioGate, StreamLoad
from omnistage.pipeline.chunk_planner import StagePaces
from omnistage.pipeline.codec_edge import CodecEdge, StreamSetup
from omnistage.pipeline.detokenizer import IncrementalDetokenizer, Tokenizer
from omnistage.pipeline.graph import Edge, StageGraph
from omnistage.pipeline.request_state import ChunkSeen, OutputSink, RequestState, RequestTrace, TraceBook, TraceSink
from omnistage.pipeline.router import StageRouter

logger = logging.getLogger(__name__)
# The gate's walk over every running stream (their paces recorded, room for waiting requests) at most this often,
# and at once when a stream or its talker ends (that frees room). Every pass walked them: with a batch of streams
# and requests waiting, a third of the orchestrator's time. A talker frame lasts 40-133 ms.
GATE_INTERVAL_S = 0.025

# Sends a message to replica ``index`` of ``stage``.
SendFn = Callable[[str, int, ReplicaInput], None]
# The address replica ``index`` of ``stage`` takes its peers' inputs at (a codec replica's, for a talker's chunks).
PeerAddressFn = Callable[[str, int], str]


@dataclass(frozen=True)
class FlowSettings:
    graph: StageGraph
    audio: AudioSpec | None  # the served family's audio (None: it makes none)
    min_new_tokens: int = 0  # --talker-min-new-tokens, for stages sampled with their configured defaults


class RequestFlows:
    def __init__(self, settings: FlowSettings, routers: dict[str, StageRouter], send: SendFn,
                 tokenizer: Tokenizer | None, peer_address: PeerAddressFn = lambda stage, index: "",
                 trace_sink: TraceSink | None = None) -> None:
        self.settings = settings
        self.graph = settings.graph
        self.routers = routers
        self.send = send
        self.peer_address = peer_address
        self.tokenizer = tokenizer
        self.states: dict[str, RequestState] = {}
        self.paces = StagePaces()  # every stream's measured talker and codec paces
        frame_s = settings.audio.frame_s if settings.audio is not None else 1.0
        self.gate = AudioGate(settings.graph.spec.streaming.admission_rtf_limit, frame_s)
        # Orders for the talker replicas, gathered during a pass: (stage, replica) → orders.
        self.orders: dict[tuple[str, int], list[ChunkOrder]] = {}
        self._paced = False  # a talker reported frames since the gate's last walk: it records the streams' paces
        self._next_walk = 0.0  # monotonic time of the gate's next walk (GATE_INTERVAL_S)
        self._text_stage = self.graph.output_stage(Modality.TEXT)
        # Audio requests held back while the running streams are near real time, in arrival order (and since when).
        self.waiting: OrderedDict[str, tuple[OmniRequest, OutputSink, float]] = OrderedDict()
        self.traces = TraceBook(trace_sink)  # finished requests' traces, and the sink when the server traces
        self.held_feeds: dict[str, list[PromptDelta]] = {}  # input fed to requests the gate still holds

    # Entry and exits -----------------------------------------------------------------------------
    def submit(self, request: OmniRequest, sink: OutputSink) -> None:
        """Starts a request at the entry stage, or holds an audio request while the running streams have no
        room (:class:`AudioGate`); a request that cannot start gets its error as its only output."""
        rid = request.request_id
        if rid in self.states or rid in self.waiting:
            return self.reject(request, sink, "duplicate request id")
        missing = sorted(m.value for m in request.modalities if not self.graph.supports(m))
        if missing:
            return self.reject(request, sink, f"this pipeline has no stage that makes {' or '.join(missing)}: "
                                              f"{' and '.join(missing)} output is not available")
        if request.streams_audio and (self.waiting or not self.gate.admits(self._stream_loads())):
            self.waiting[rid] = (request, sink, time.monotonic())
            return None
        return self._start(request, sink)

    def stage_profiled(self, stage: str, step_seconds: dict[int, float]) -> None:
        """A replica's decode step time by batch size: the talker's (the stage whose frames feed a codec edge)
        tells the admission gate what one more stream costs it."""
        codec = self.graph.codec_edge()
        if codec is not None and codec.source == stage:
            self.gate.profile(step_seconds)

    def tick(self) -> None:
        """Records the running streams' load when a talker reported since the last walk, then starts waiting audio
        requests while there is room (both skipped on a pass with neither, and until ``GATE_INTERVAL_S`` after the
        last walk unless a stream ended: the loads are a walk over every stream)."""
        if not (self._paced or self.waiting):
            return
        now = time.monotonic()
        if now < self._next_walk:
            return
        self._next_walk = now + GATE_INTERVAL_S
        if not self.waiting:  # only the talker's pace to record: the players' state is not needed
            self.gate.observe(self._talker_paces())
            self._paced = False
            return
        loads = self._stream_loads()
        if self._paced:
            self.gate.observe([load.talker_frame_s for load in loads if load.talking])
            self._paced = False
        while self.waiting and (room := self.gate.room(loads)) > 0:
            for _ in range(min(room, len(self.waiting))):  # a round starts together: its prefills batch
                _, (request, sink, since) = self.waiting.popitem(last=False)
                self._start(request, sink, time.monotonic() - since)  # a head start that went by is gone (_crossing)
            loads = self._stream_loads()

    def _stream_loads(self) -> list[StreamLoad]:
        """Audio streams in flight; a stream's talker pace counts while its talker runs, the audio its player holds
        while one plays it as it arrives."""
        now = time.monotonic()
        loads = []
        for s in self.states.values():
            audio = s.audio
            if audio is None or audio.done:
                continue
            playing = s.request.stream and audio.playback.play_end is not None
            # A talker waiting for its input paces the writer, not the talker: counted, not measured.
            pace = None if s.input_open else audio.planner.talker.value
            loads.append(StreamLoad(not audio.talker_done, pace, audio.playback.buffered_s(now) if playing else None))
        return loads

    def _talker_paces(self) -> list[float | None]:
        """The talking streams' paces, as ``_stream_loads`` gives them (a lighter walk, on most passes)."""
        paces: list[float | None] = []
        for s in self.states.values():
            audio = s.audio
            if audio is not None and not audio.talker_done:  # talking implies not done
                paces.append(None if s.input_open else audio.planner.talker.value)
        return paces

    def _start(self, request: OmniRequest, sink: OutputSink, gated_s: float = 0.0) -> None:
        rid = request.request_id
        state = RequestState(request, sink, IncrementalDetokenizer(self.tokenizer, request.sampling.stop),
                             self._stages(request), RequestTrace(gated_s=gated_s),
                             num_prompt_tokens=request.prompt.num_tokens, input_open=request.open_input)
        try:
            for edge in self.graph.edges:
                if edge.source in state.stages and edge.target in state.stages:
                    crossing = self._crossing(state, edge)
                    if crossing is not None:
                        state.edges[(edge.source, edge.target)] = crossing
            self.states[rid] = state
            entry = self.graph.entry
            payload = self.graph.family.entry_input(self._context(request, entry))
            self._to(entry, rid, payload)
            for delta in self.held_feeds.pop(rid, ()):
                self.feed(rid, delta)
        except Exception as exc:  # noqa: BLE001 - e.g. no healthy entry replica: this request fails, the loop goes on
            logger.exception("starting %s failed", rid)
            if self.states.get(rid) is state:
                self.fail(rid, f"{type(exc).__name__}: {exc}")
            else:
                self.reject(request, sink, f"{type(exc).__name__}: {exc}")
        return None

    def _stages(self, request: OmniRequest) -> frozenset[str]:
        """The stages a request runs through. A prefill-only one stops short of the stage that makes audio: it
        warms the talker's cache, and with no edge into the audio stage no codec stream (no audio progress, nothing
        for the gate to count) is made."""
        stages = self.graph.stages_for(request.modalities)
        audio = self.graph.output_stage(Modality.AUDIO)
        if request.prefill_only and audio is not None and audio != self.graph.entry:
            return stages - {audio}
        return stages

    def _context(self, request: OmniRequest, stage: str) -> EdgeContext:
        return EdgeContext(request, self.graph.stage(stage), self.settings.min_new_tokens)

    def _crossing(self, state: RequestState, edge: Edge) -> RequestEdge | None:
        """A family's edge for this request, or None for the codec edge (its plan is ``state.audio``)."""
        if edge.model.make is not None:
            return edge.model.make(self._context(state.request, edge.target))
        request = state.request
        if self.settings.audio is None:
            raise ValueError(f"the family declares no audio, so its edge {edge.source} -> {edge.target} cannot "
                             f"be the codec edge")
        busy = sum(1 for s in self.states.values() if s.audio is not None and not s.audio.done)
        # Starting before its player does (not held by the gate past that moment): a head start.
        head_start = request.plays_at is not None and time.monotonic() < request.plays_at
        setup = StreamSetup(edge.source, edge.target, self.settings.audio, self.graph.spec.streaming,
                            self.graph.stage(edge.target), request.stream, busy, request.initial_codec_chunk_frames,
                            head_start, self.graph.family.codec_prime(request),
                            StreamVoice(request.voice or "", request.sampling.seed or 0))
        state.audio = CodecEdge(setup, self.paces)
        state.audio.planner.input_open = state.input_open  # input-bound: its chunks do not wait on frames
        return None

    def feed(self, request_id: str, delta: PromptDelta) -> None:
        """More input for a running request (text still being written) to its entry stage, in order; held while
        the gate holds the request, dropped once its entry stage let it go."""
        if request_id in self.waiting:
            self.held_feeds.setdefault(request_id, []).append(delta)
            return
        state = self.states.get(request_id)
        if state is None:
            return
        try:
            payload = self.graph.family.entry_feed(delta)
        except Exception as exc:  # noqa: BLE001 - a delta the family does not take fails its request only
            return self.fail(request_id, f"{type(exc).__name__}: {exc}")
        state.num_prompt_tokens += delta.num_tokens
        state.input_open = state.input_open and not delta.done
        if state.audio is not None:
            state.audio.planner.input_open = state.input_open
        self._to(self.graph.entry, request_id, payload)
        return None

    def reject(self, request: OmniRequest, sink: OutputSink, error: str) -> None:
        state = RequestState(request, sink, IncrementalDetokenizer(None))
        self._emit(state, OmniOutput(request.request_id, finished=True, finish_reason=FinishReason.ERROR,
                                     error=error))

    def fail(self, request_id: str, error: str | None, reason: FinishReason = FinishReason.ERROR) -> None:
        """Ends a request now (abort or failure): every stage holding it frees it."""
        held = self.waiting.pop(request_id, None)
        self.held_feeds.pop(request_id, None)
        if held is not None:  # never started: nothing to free
            request, sink, _ = held
            state = RequestState(request, sink, IncrementalDetokenizer(None), reason=reason)
            self._emit(state, OmniOutput(request_id, finished=True, finish_reason=reason, error=error))
            return
        state = self.states.pop(request_id, None)
        if state is None:
            return  # unknown or already finished: aborts are idempotent
        self._next_walk = 0.0  # its room is free: the gate walks on the next pass
        for stage, router in self.routers.items():
            index = router.replica_of(request_id)
            if index is not None:
                self.send(stage, index, AbortRequests([request_id]))
            router.release(request_id)
        state.reason = reason
        self._record(state)
        self._emit(state, OmniOutput(request_id, finished=True, finish_reason=reason, usage=self._usage(state),
                                     error=error))

    def fail_all(self, error: str) -> None:
        for rid in [*self.waiting, *self.states]:
            self.fail(rid, error)

    def fail_replica(self, stage: str, index: int, error: str) -> None:
        for rid in self.routers[stage].requests_on(index):
            self.fail(rid, f"stage {stage!r} replica {index}: {error}")

    # Stage outputs -------------------------------------------------------------------------------
    def on_output(self, stage: str, output: StageOutput) -> None:
        state = self.states.get(output.request_id)
        if state is None or stage in state.closed:
            return  # aborted, or outputs still in flight after a stop string let the stage go
        payload, finished = output.payload, output.finished
        if type(payload) is FramesMade and not finished:
            # A talker's notice mid-stream (most messages of an audio stream): it only plans; nothing crosses an
            # edge or reaches the caller.
            self._frames_made(state, stage, payload, False)
            return
        text, token_ids, audio, logprobs = "", (), None, ()
        if isinstance(payload, TokenDelta):
            text, token_ids, stopped = self._tokens(state, stage, payload, finished)
            if len(token_ids) < len(payload.token_ids):  # a stop string inside a merged delta: the rest is dropped
                payload = msgspec.structs.replace(payload, token_ids=list(token_ids), logprobs=None if
                                                  payload.logprobs is None else payload.logprobs[:len(token_ids)])
            logprobs = tuple(payload.logprobs or ()) if token_ids else ()
            if stopped and not finished:  # a stop string: the stage is still generating
                self._abort_at(stage, state.request_id)
                finished = True
        elif isinstance(payload, AudioChunk):  # paced through the codec edge's player model when it has one
            audio = self._audio(state, stage, payload)
        elif isinstance(payload, CodecFrames) and payload.frames.numel():
            self._frames(state, payload.frames.shape[0])
        elif isinstance(payload, FramesMade):
            self._frames_made(state, stage, payload, finished)
        if finished:
            self._close(state, stage, output.finish_reason)
        for edge in self.graph.edges_from(stage):
            crossing = state.edges.get((edge.source, edge.target))
            if crossing is not None:
                for item in crossing.on_output(payload, finished):
                    self._to(edge.target, state.request_id, item)
        self._deliver(state, text=text, token_ids=token_ids, audio=audio, logprobs=logprobs)

    def _tokens(self, state: RequestState, stage: str, delta: TokenDelta,
                finished: bool) -> tuple[str, tuple[int, ...], bool]:
        """Counts a stage's tokens; the text stage's become the caller's text (its stop strings end it). A delta
        of several tokens (merged by the stream interval) is read token by token when the request has stop strings:
        only the tokens up to the one that completed a stop string count, reach the caller and the next stage."""
        state.num_prompt_tokens = max(state.num_prompt_tokens, delta.num_prompt_tokens)
        state.num_cached_tokens = max(state.num_cached_tokens, delta.num_cached_tokens)
        if self.graph.models[stage].output is not Modality.TEXT:
            return "", (), False
        state.trace.mark("first_text")
        ids = delta.token_ids
        if state.detok.stop and len(ids) > 1:
            text, stopped = "", False
            for n, token in enumerate(ids, 1):
                step = state.detok.add([token], final=finished and n == len(ids))
                text += step.text
                if step.stopped:
                    ids, stopped = ids[:n], True
                    break
        else:
            step = state.detok.add(ids, final=finished)
            text, stopped = step.text, step.stopped
        state.num_output_tokens += len(ids)
        if stopped:
            state.reason = FinishReason.STOP
        return text, tuple(ids), stopped

    def _frames(self, state: RequestState, count: int) -> None:
        if count:
            if state.trace.first_frames is None:
                state.trace.mark("first_frames")
            if self._text_stage not in state.stages:  # no text: frames are the output
                state.num_output_tokens += count

    def _frames_made(self, state: RequestState, stage: str, notice: FramesMade, finished: bool) -> None:
        """The talker cut and sent chunks itself: the codec stage holds the request from its first chunk on."""
        edge = state.audio
        if edge is None or edge.source != stage:
            return
        self._frames(state, notice.count)
        self._paced = self._paced or notice.count > 0
        if finished:
            self._next_walk = 0.0  # a talker the less: the gate walks on the next pass
        if notice.cuts:
            self._enter(state, edge.target)
        self._queue_order(stage, state, edge.frames_made(state.request_id, notice, finished, time.monotonic()))

    def frames_noted(self, stage: str, notes: FrameNotes) -> None:
        """A talker's plain notices since its last report (new frames, no chunk cut, none a stream's last): each
        paces and plans its stream only, as ``_frames_made`` does with such a notice. One call a message, not one a
        notice: one per frame, they are most of an audio stream's notices."""
        now, states = time.monotonic(), self.states
        for rid, count, pending in zip(notes.request_ids, notes.counts, notes.pendings):
            state = states.get(rid)
            if state is None or stage in state.closed:
                continue
            edge = state.audio
            if edge is None or edge.source != stage:
                continue
            try:
                if count:
                    self._frames(state, count)
                    self._paced = True
                order = edge.frames_noted(rid, count, pending, now)
            except Exception as exc:  # noqa: BLE001 - one request's failure must not stall the others
                logger.exception("handling a frame notice of stage %s failed", stage)
                self.fail(rid, f"{type(exc).__name__}: {exc}")
                continue
            self._queue_order(stage, state, order)

    def _audio(self, state: RequestState, stage: str, chunk: AudioChunk) -> np.ndarray:
        """A chunk for the caller; through the codec edge's player model, which tells the talker."""
        edge, now = state.audio, time.monotonic()
        state.trace.mark("first_audio")
        if edge is None:
            return chunk.wav.numpy()
        self._enter(state, stage)  # its audio may overtake the talker's notice of the chunk
        seconds = edge.setup.audio.seconds(chunk.wav.shape[0])
        self.gate.vocoded(chunk.busy_s, seconds)
        if self.traces.sink is not None:
            state.trace.chunks.append(ChunkSeen(stage, now, chunk.chunk_index, seconds, chunk.busy_s))
        self._queue_order(edge.source, state, edge.heard(state.request_id, chunk, seconds, now))
        return chunk.wav.numpy()

    def _queue_order(self, stage: str, state: RequestState, order: ChunkOrder | None) -> None:
        if order is None:  # most notices change nothing
            return
        index = self.routers[stage].replica_of(state.request_id)
        if index is not None and stage not in state.closed:
            self.orders.setdefault((stage, index), []).append(order)

    def flush_orders(self) -> None:
        """Sends each talker replica the orders of this pass, in one message."""
        orders, self.orders = self.orders, {}
        for (stage, index), batch in orders.items():
            self.send(stage, index, ChunkOrders(batch))

    def _close(self, state: RequestState, stage: str, reason: FinishReason | None) -> None:
        """The stage is done with the request. Why the request ended is its text stage's reason when it has
        one (a stop string already said STOP), else the first a stage gives."""
        state.open.discard(stage)
        state.closed.add(stage)
        state.trace.left.setdefault(stage, time.monotonic())
        self.routers[stage].release(state.request_id)
        text_stage = self.graph.output_stage(Modality.TEXT)
        if stage == text_stage:
            state.reason = state.reason or reason
        elif text_stage not in state.stages and state.reason is None:
            state.reason = reason

    # Helpers ---------------------------------------------------------------------------------------
    def _to(self, stage: str, request_id: str, payload: object) -> None:
        """Sends a payload to the request's replica of ``stage``, placing it there the first time; a talker
        feeding the codec edge is told first where to send the request's chunks."""
        state = self.states[request_id]
        if stage in state.closed:
            return  # that stage already let the request go (e.g. the talker hit EOS before the text ended)
        first = stage not in state.open
        index = self._enter(state, stage)
        edge = state.audio
        if first and edge is not None and edge.source == stage:
            codec = self.routers[edge.target].place(request_id)
            self.send(stage, index, edge.opening(request_id, self.peer_address(edge.target, codec)))
        self.send(stage, index, StageInput(request_id, payload))

    def _enter(self, state: RequestState, stage: str) -> int:
        """The request's replica of ``stage``, placed there and marked open the first time."""
        index = self.routers[stage].place(state.request_id)
        if stage not in state.open and stage not in state.closed:
            state.open.add(stage)
            state.trace.replicas.setdefault(stage, index)
            state.trace.entered.setdefault(stage, time.monotonic())
        return index

    def _abort_at(self, stage: str, request_id: str) -> None:
        index = self.routers[stage].replica_of(request_id)
        if index is not None:
            self.send(stage, index, AbortRequests([request_id]))

    def _deliver(self, state: RequestState, text: str = "", token_ids: tuple[int, ...] = (),
                 audio: np.ndarray | None = None, logprobs: tuple[TokenLogprob, ...] = ()) -> None:
        done = state.complete
        if not (text or token_ids or audio is not None or done):
            return
        if done:
            self.states.pop(state.request_id, None)
            self._next_walk = 0.0
            for router in self.routers.values():
                router.release(state.request_id)
            self._record(state)
        reason = (state.reason or FinishReason.STOP) if done else None
        self._emit(state, OmniOutput(state.request_id, text=text, token_ids=token_ids, audio=audio, finished=done,
                                     finish_reason=reason, usage=self._usage(state) if done else None,
                                     logprobs=logprobs))

    def _emit(self, state: RequestState, output: OmniOutput) -> None:
        try:
            state.sink(output)
        except Exception:  # noqa: BLE001 - e.g. the caller's event loop is gone: nobody is listening any more
            logger.exception("delivering to the caller of %s failed; aborting it", state.request_id)
            if not output.finished:
                self.fail(state.request_id, "the caller went away", FinishReason.ABORT)

    @staticmethod
    def _usage(state: RequestState) -> Usage:
        return Usage(prompt_tokens=state.num_prompt_tokens, completion_tokens=state.num_output_tokens,
                     cached_tokens=state.num_cached_tokens)

    def _record(self, state: RequestState) -> None:
        if self.traces.sink is not None:  # how it ended, for its spans
            state.trace.usage, state.trace.reason = self._usage(state), state.reason
        self.traces.record(state.request, state.trace)
