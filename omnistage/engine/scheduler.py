"""Token-budget scheduling with continuous batching (vLLM v1's rule).

Every step each request asks for ``num_tokens - num_computed_tokens`` new
tokens: a whole or chunked prompt, one decode token, or a recompute after
preemption. Running requests go first in arrival order; when the KV cache is
full the most recently admitted running request is preempted (its blocks
freed, its progress reset, recomputed later). Waiting requests are admitted
only while no one was preempted in the same step.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from omnistage.engine.config import EngineConfig
from omnistage.engine.kv_cache.manager import KVCacheManager
from omnistage.engine.outputs import ModelRunnerOutput, RequestOutput, ScheduledRequest, SchedulerOutput
from omnistage.engine.request import FinishReason, Request, RequestStatus


NON_FINITE = ("sampling failed: this request's logits were not finite (NaN or infinity) under its sampling "
              "settings; the other requests in its batch went on")


def _always_ready(_: Request) -> bool:
    return True


class Scheduler:
    def __init__(
        self, config: EngineConfig, kv_manager: KVCacheManager | None = None,
        is_ready: Callable[[Request], bool] = _always_ready,
    ) -> None:
        self.config = config
        self.kv = kv_manager or KVCacheManager(config.num_blocks, config.block_size, config.enable_prefix_caching)
        # A stage hook may hold a running request back (the talker waiting for text).
        self.is_ready = is_ready
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self._finished_ids: list[str] = []

    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in this engine")
        limit = min(self.config.max_model_len, self.kv.usable_blocks * self.config.block_size)
        if request.num_prompt_tokens >= limit:
            raise ValueError(f"prompt of {request.num_prompt_tokens} tokens does not fit (limit {limit})")
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def abort_request(self, request_id: str) -> Request | None:
        request = self.requests.get(request_id)
        if request is None:
            return None
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
        else:
            self.waiting.remove(request)
        self._finish(request, FinishReason.ABORT)
        return request

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def schedule(self) -> SchedulerOutput:
        budget = self.config.max_num_batched_tokens
        scheduled: list[ScheduledRequest] = []
        preempted: list[str] = []
        budget = self._schedule_running(budget, scheduled, preempted)
        if not preempted:
            budget = self._schedule_waiting(budget, scheduled)
        finished, self._finished_ids = self._finished_ids, []
        return SchedulerOutput(
            scheduled=scheduled, num_tokens=self.config.max_num_batched_tokens - budget,
            finished_req_ids=finished, preempted_req_ids=preempted,
        )

    def _num_new_tokens(self, request: Request, budget: int) -> int:
        remaining = request.num_tokens - request.num_computed_tokens
        if remaining > 1:  # prefill (or recompute) chunk: capped so decodes keep flowing
            remaining = min(remaining, self.config.prefill_chunk_cap)
        return min(remaining, budget)

    def _schedule_running(self, budget: int, scheduled: list[ScheduledRequest], preempted: list[str]) -> int:
        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            num_new = self._num_new_tokens(request, budget) if self.is_ready(request) else 0
            if num_new == 0:
                i += 1
                continue
            new_ids = self.kv.allocate_slots(request, num_new)
            while new_ids is None and len(self.running) > 1:
                victim = self.running.pop()  # lowest priority: the latest admitted
                self._preempt(victim)
                preempted.append(victim.request_id)
                if victim is request:
                    break
                new_ids = self.kv.allocate_slots(request, num_new)
            if new_ids is None:
                if request.status is RequestStatus.RUNNING:
                    # Alone and still out of blocks: the cache cannot hold it, so stop it here.
                    self.running.remove(request)
                    self._finish(request, FinishReason.LENGTH)
                break
            scheduled.append(ScheduledRequest(request, num_new, new_ids, reset=False))
            budget -= num_new
            i += 1
        return budget

    def _schedule_waiting(self, budget: int, scheduled: list[ScheduledRequest]) -> int:
        held: list[Request] = []  # preempted requests whose hook input is not there yet keep their place
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = self.waiting.popleft()
            if not self.is_ready(request):
                held.append(request)
                continue
            hits, num_hit = self.kv.get_computed_blocks(request)
            num_new = min(request.num_tokens - num_hit, budget)
            if num_new > 1:
                num_new = min(num_new, self.config.prefill_chunk_cap)
            new_ids = self.kv.allocate_slots(request, num_new, hits)
            if new_ids is None:
                self.waiting.appendleft(request)
                break
            request.num_computed_tokens = num_hit
            if request.num_cached_tokens < 0:
                request.num_cached_tokens = num_hit
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            scheduled.append(ScheduledRequest(request, num_new, new_ids, reset=True))
            budget -= num_new
        self.waiting.extendleft(reversed(held))
        return budget

    def _preempt(self, request: Request) -> None:
        self.kv.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.waiting.appendleft(request)

    def _finish(self, request: Request, reason: FinishReason) -> None:
        request.finish(reason)
        self.kv.free(request)
        del self.requests[request.request_id]
        self._finished_ids.append(request.request_id)

    def update_from_output(self, sched: SchedulerOutput, result: ModelRunnerOutput) -> list[RequestOutput]:
        """Advances each scheduled request, appends sampled tokens, and retires finished ones."""
        outputs: list[RequestOutput] = []
        done: set[str] = set()
        extra_row = 0
        failed = set(result.failed_rows)
        for row, (entry, token) in enumerate(zip(sched.scheduled, result.sampled_token_ids)):
            request = entry.request
            request.num_computed_tokens += entry.num_new_tokens
            if token < 0 or request.is_finished:
                continue
            if row in failed:  # this request alone ends; the rest of the batch goes on
                extra_row += 1
                self._finish(request, FinishReason.ERROR)
                done.add(request.request_id)
                outputs.append(RequestOutput(request.request_id, [], True, FinishReason.ERROR, error=NON_FINITE))
                continue
            request.output_token_ids.append(token)
            frame = None if result.extra is None else result.extra[extra_row:extra_row + 1]
            extra_row += 1
            reason = self._stop_reason(request, token)
            if reason is not None:
                self._finish(request, reason)
                done.add(request.request_id)
            logprob = result.logprobs.get(row) if result.logprobs else None
            outputs.append(RequestOutput(request.request_id, [token], reason is not None, reason, frame,
                                         logprobs=None if logprob is None else [logprob]))
        if done:
            self.running = [r for r in self.running if r.request_id not in done]
        return outputs

    def _stop_reason(self, request: Request, token: int) -> FinishReason | None:
        params = request.sampling_params
        n_out = request.num_output_tokens
        if n_out >= params.min_tokens:
            if token == request.eos_token_id and not params.ignore_eos:
                return FinishReason.STOP
            if token in params.stop_token_ids:
                return FinishReason.STOP
        cap = params.max_tokens  # None: the context's end alone
        if (cap is not None and n_out >= cap) or request.num_tokens >= self.config.max_model_len:
            return FinishReason.LENGTH
        return None
