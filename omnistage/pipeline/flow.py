"""How one request's messages move between stages, and what its caller sees.

All methods run on the orchestrator's thread, one message at a time, so the
per-request state needs no locks. Edges are applied here: the thinker's
tokens start and then feed the talker (async chunk: the talker starts on the
first token, not on the whole answer), talker frames are cut into code2wav
chunks (a smaller first one), and text deltas and audio chunks go to the
caller as soon as they exist.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from omnistage.config.pipeline import PipelineSpec
from omnistage.core import FinishReason, OmniOutput, OmniRequest, Usage
from omnistage.engine.generation_engine import vocoder_batch_cap
from omnistage.engine.logprobs import TokenLogprob
from omnistage.ipc.messages import (
    AbortRequests,
    AudioChunk,
    DecodeChunk,
    FeedText,
    ReplicaInput,
    StartTalker,
    StartThinker,
    TalkerFrames,
    ThinkerTokens,
    WireMultimodal,
    WirePromptLayout,
)
from omnistage.pipeline.audio_gate import AudioGate, StreamLoad
from omnistage.pipeline.chunk_planner import ChunkBounds, PlaybackPlanner, StagePaces
from omnistage.pipeline.detokenizer import IncrementalDetokenizer, Tokenizer
from omnistage.pipeline.playback import Playback
from omnistage.pipeline.request_state import (SAMPLE_RATE, AudioProgress, OutputSink, RequestState, RequestTrace,
                                              finish_reason)
from omnistage.pipeline.router import StageRouter
from omnistage.pipeline.sampling import initial_chunk_frames, talker_sampling, thinker_sampling
from omnistage.pipeline.topology import Topology

logger = logging.getLogger(__name__)
KEEP_TRACES = 256

# Sends a message to replica ``index`` of ``stage``.
SendFn = Callable[[str, int, ReplicaInput], None]


@dataclass(frozen=True)
class FlowSettings:
    spec: PipelineSpec
    topology: Topology
    num_code_groups: int
    talker_min_new_tokens: int = 0


def _mm(request: OmniRequest) -> WireMultimodal | None:
    mm = request.prompt.mm
    fields = {name: getattr(mm, name) for name in WireMultimodal.__struct_fields__}
    return WireMultimodal(**fields) if any(v is not None for v in fields.values()) else None


def _layout(request: OmniRequest) -> WirePromptLayout:
    mm = request.prompt.mm
    return WirePromptLayout(list(request.prompt.token_ids), mm.image_grid_thw, mm.video_grid_thw,
                            mm.audio_lengths(), mm.video_second_per_grid)


class RequestFlows:
    def __init__(self, settings: FlowSettings, routers: dict[str, StageRouter], send: SendFn,
                 tokenizer: Tokenizer | None) -> None:
        self.settings = settings
        self.topo = settings.topology
        self.routers = routers
        self.send = send
        self.tokenizer = tokenizer
        self.states: dict[str, RequestState] = {}
        self.paces = StagePaces()  # every stream's measured talker and code2wav paces
        self.gate = AudioGate(settings.spec.streaming.admission_rtf_limit)
        # Audio requests held back while the running streams are near real time, in arrival order.
        self.waiting: OrderedDict[str, tuple[OmniRequest, OutputSink]] = OrderedDict()
        self.traces: OrderedDict[str, RequestTrace] = OrderedDict()  # finished requests, newest last

    # Entry and exits -----------------------------------------------------------------------------
    def submit(self, request: OmniRequest, sink: OutputSink) -> None:
        """Starts a request at the thinker, or holds an audio request while the running streams have no room
        (:class:`AudioGate`); a request that cannot start gets its error as its only output."""
        rid = request.request_id
        if rid in self.states or rid in self.waiting:
            return self.reject(request, sink, "duplicate request id")
        if request.wants_audio and not self.topo.supports_audio:
            return self.reject(request, sink, "this pipeline has no talker/code2wav stages: "
                                               "audio output is not available")
        if request.wants_audio and (self.waiting or not self.gate.admits(self._stream_loads())):
            self.waiting[rid] = (request, sink)
            return None
        return self._start(request, sink)

    def tick(self) -> None:
        """Records the running streams' load, then starts waiting audio requests while there is room."""
        loads = self._stream_loads()
        self.gate.observe(loads)
        while self.waiting and self.gate.admits(loads):
            _, (request, sink) = self.waiting.popitem(last=False)
            self._start(request, sink)
            loads = self._stream_loads()

    def _stream_loads(self) -> list[StreamLoad]:
        """Audio streams in flight; a stream's talker pace counts while its talker runs."""
        return [StreamLoad(not s.audio.talker_done, s.audio.planner.talker.value)
                for s in self.states.values() if s.audio is not None and not s.audio.done]

    def _start(self, request: OmniRequest, sink: OutputSink) -> None:
        rid = request.request_id
        state = RequestState(request, sink, IncrementalDetokenizer(self.tokenizer, request.sampling.stop),
                             num_prompt_tokens=len(request.prompt.token_ids))
        try:
            if request.wants_audio:
                state.audio = self._audio_progress(request)
            self.states[rid] = state
            self._to(self.topo.thinker, rid, StartThinker(
                rid, list(request.prompt.token_ids), thinker_sampling(request.sampling), _mm(request),
                capture_hidden=request.wants_audio))
        except Exception as exc:  # noqa: BLE001 - e.g. no healthy thinker: this request fails, the loop goes on
            logger.exception("starting %s failed", rid)
            if self.states.get(rid) is state:
                self.fail(rid, f"{type(exc).__name__}: {exc}")
            else:
                self.reject(request, sink, f"{type(exc).__name__}: {exc}")
        return None

    def reject(self, request: OmniRequest, sink: OutputSink, error: str) -> None:
        state = RequestState(request, sink, IncrementalDetokenizer(None))
        self._emit(state, OmniOutput(request.request_id, finished=True, finish_reason=FinishReason.ERROR,
                                     error=error))

    def _audio_progress(self, request: OmniRequest) -> AudioProgress:
        """A streamed request's chunks follow its player (a small first chunk, then as large as its buffer
        allows); a request consumed whole gets full-size chunks after the first."""
        from omnistage.pipeline.qwen3_omni_stages import ChunkPlan, FrameChunker

        streaming = self.settings.spec.streaming
        c2w = self.settings.spec.stage(self.topo.code2wav)
        busy = sum(1 for s in self.states.values() if s.audio is not None and not s.audio.done)
        first = initial_chunk_frames(streaming, request.initial_codec_chunk_frames, busy,
                                     vocoder_batch_cap(c2w.engine.max_num_seqs, c2w.device) * c2w.replicas)
        plan = ChunkPlan(chunk_frames=streaming.codec_chunk_frames,
                         left_context=streaming.codec_left_context_frames, first_chunk_frames=first)
        playback = Playback()
        bounds = ChunkBounds(first, streaming.codec_chunk_frames, streaming.codec_left_context_frames)
        planner = PlaybackPlanner(bounds, playback, self.paces)  # measures every stream; sizes played ones
        sizer = planner if request.stream else None
        chunker = FrameChunker(request.request_id, plan, self.settings.num_code_groups, sizer)
        return AudioProgress(chunker, first, playback, planner)

    def fail(self, request_id: str, error: str | None, reason: FinishReason = FinishReason.ERROR) -> None:
        """Ends a request now (abort or failure): every stage holding it frees it."""
        held = self.waiting.pop(request_id, None)
        if held is not None:  # never started: nothing to free
            request, sink = held
            state = RequestState(request, sink, IncrementalDetokenizer(None), reason=reason)
            self._emit(state, OmniOutput(request_id, finished=True, finish_reason=reason, error=error))
            return
        state = self.states.pop(request_id, None)
        if state is None:
            return  # unknown or already finished: aborts are idempotent
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
    def on_thinker(self, msg: ThinkerTokens) -> None:
        state = self.states.get(msg.request_id)
        if state is None or state.thinker_done:
            return  # aborted, or tokens still in flight after a stop string ended the text
        state.trace.mark("first_text")
        state.num_cached_tokens = max(state.num_cached_tokens, msg.num_cached_tokens)
        state.num_output_tokens += len(msg.token_ids)
        delta = state.detok.add(msg.token_ids, final=msg.finished)
        finished = msg.finished or delta.stopped
        if state.audio is not None:
            self._feed_talker(state, msg, finished)
        if finished:
            state.thinker_done = True
            state.reason = FinishReason.STOP if delta.stopped else finish_reason(msg.finish_reason)
            state.trace.mark("thinker_done")
            if not msg.finished:  # a stop string: the thinker is still generating
                self._to(self.topo.thinker, msg.request_id, AbortRequests([msg.request_id]), place=False)
            self.routers[self.topo.thinker].release(msg.request_id)
        self._deliver(state, text=delta.text, token_ids=tuple(msg.token_ids), logprobs=tuple(msg.logprobs or ()))

    def _feed_talker(self, state: RequestState, msg: ThinkerTokens, finished: bool) -> None:
        rid, tokens = state.request_id, state.spoken.take(msg.token_ids)
        if not state.talker_started:
            if msg.mm_hidden is not None:
                state.talker_hidden = msg.mm_hidden
            if not tokens:
                if finished and state.audio is not None:  # nothing was spoken: no audio to wait for
                    state.audio.talker_done = True
                return
            state.talker_started = True
            state.trace.mark("talker_start")
            stage = self.settings.spec.stage(self.topo.talker)
            sampling = talker_sampling(stage.sampling, state.request.sampling.seed,
                                       self.settings.talker_min_new_tokens)
            self._to(self.topo.talker, rid, StartTalker(rid, _layout(state.request), tokens[0],
                                                         state.request.voice, sampling, state.talker_hidden))
            tokens = tokens[1:]
        if tokens or finished:
            self._to(self.topo.talker, rid, FeedText(rid, tokens, finished), place=False)

    def on_talker(self, msg: TalkerFrames) -> None:
        state = self.states.get(msg.request_id)
        if state is None or state.audio is None:
            return
        audio = state.audio
        now = time.monotonic()
        audio.planner.frames_arrived(now, msg.frames.shape[0])
        jobs = audio.chunker.push(msg.frames) if msg.frames.numel() else []
        if msg.frames.numel():
            state.trace.mark("first_frames")
        if msg.finished:
            jobs += audio.chunker.finish()
            audio.talker_done = True
            self.routers[self.topo.talker].release(msg.request_id)
        for job in jobs:
            self._to(self.topo.code2wav, msg.request_id,
                     DecodeChunk(msg.request_id, job.chunk_index, job.codes, job.left_context, job.is_last,
                                 deadline=audio.playback.deadline(now)))
            audio.chunks_sent += 1
            new_frames = job.codes.shape[1] - job.left_context
            audio.playback.sent(new_frames)
            audio.planner.chunk_sent(job.chunk_index, now, new_frames, job.codes.shape[1])
        if audio.done:  # no chunk in flight: code2wav is done with it even if the thinker is not
            self.routers[self.topo.code2wav].release(msg.request_id)
        self._deliver(state)

    def on_audio(self, msg: AudioChunk) -> None:
        state = self.states.get(msg.request_id)
        if state is None or state.audio is None:
            return
        audio, now = state.audio, time.monotonic()
        audio.chunks_received += 1
        seconds = msg.wav.shape[0] / SAMPLE_RATE
        audio.playback.delivered(now, seconds)
        self.gate.vocoded(msg.busy_s, seconds)
        audio.planner.chunk_returned(msg.chunk_index, now)
        state.trace.mark("first_audio")
        if state.audio.done:
            self.routers[self.topo.code2wav].release(msg.request_id)
        self._deliver(state, audio=msg.wav.numpy())

    # Helpers ---------------------------------------------------------------------------------------
    def _to(self, stage: str, request_id: str, message: ReplicaInput, place: bool = True) -> None:
        router = self.routers[stage]
        index = router.place(request_id) if place else router.replica_of(request_id)
        if index is None:
            return  # that stage already let the request go (e.g. the talker hit EOS before the text ended)
        if place:
            self.states[request_id].trace.replicas.setdefault(stage, index)
        self.send(stage, index, message)

    def _deliver(self, state: RequestState, text: str = "", token_ids: tuple[int, ...] = (),
                 audio: np.ndarray | None = None, logprobs: tuple[TokenLogprob, ...] = ()) -> None:
        done = state.complete
        if not (text or token_ids or audio is not None or done):
            return
        if done:
            self.states.pop(state.request_id, None)
            for router in self.routers.values():
                router.release(state.request_id)
            self._record(state)
        self._emit(state, OmniOutput(state.request_id, text=text, token_ids=token_ids, audio=audio, finished=done,
                                     finish_reason=state.reason if done else None,
                                     usage=self._usage(state) if done else None, logprobs=logprobs))

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
        state.trace.mark("finished")
        self.traces[state.request_id] = state.trace
        while len(self.traces) > KEEP_TRACES:
            self.traces.popitem(last=False)
