"""Persistent host buffers for one AR step, and the per-request rows that outlive steps.

Each running request owns a row: its block table and sampling settings live
there, written once at admission and appended to as blocks are added, so a
decode step only writes one id, one position and one slot per request. Step
tensors are views of buffers allocated once (pinned and copied once to the
device on CUDA).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from omnistage.engine.config import EngineConfig
from omnistage.engine.outputs import ScheduledRequest, SchedulerOutput
from omnistage.engine.request import Request
from omnistage.layers.attention.base import AttentionMetadata
from omnistage.runner.sampler import SamplingBatch
from omnistage.runner.step_hook import OutputSpan


@dataclass
class StepInputs:
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T] or [3, T]
    meta: AttentionMetadata
    logits_indices: torch.Tensor  # [n] rows of the hidden states to sample from
    sample_requests: list[Request]
    sample_rows: list[int]  # each sampled request's batch row
    embed_prompt: list[tuple[int, Request, int, int]]  # (flat start, request, prompt start, end)
    embed_outputs: list[tuple[int, OutputSpan]]  # (flat start, generated span) fed as hook embeddings
    spans: list[tuple[int, Request, int, int]]  # every request: (flat start, request, first position, count)


@dataclass
class _Row:
    index: int
    num_blocks: int = 0


class InputBatch:
    def __init__(self, config: EngineConfig, mrope: bool, device: torch.device, feeds_output_embeds: bool) -> None:
        self.block_size = config.block_size
        self.device = device
        self.feeds_output_embeds = feeds_output_embeds
        max_t, max_n, width = config.max_num_batched_tokens, config.max_num_seqs, config.max_blocks_per_seq
        pin = device.type == "cuda"

        def buf(*shape: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
            return torch.zeros(*shape, dtype=dtype, pin_memory=pin)

        self.input_ids, self.positions = buf(max_t), buf(3 if mrope else 1, max_t)
        self.slot_mapping, self.query_start_loc = buf(max_t), buf(max_n + 1, dtype=torch.int32)
        self.context_lens, self.logits_indices = buf(max_n, dtype=torch.int32), buf(max_n)
        self.step_rows = buf(max_n)
        self.block_table = torch.zeros(max_n, width, dtype=torch.int32)  # rows persist across steps
        self._tok_row, self._tok_pos = np.zeros(max_t, np.int64), np.zeros(max_t, np.int64)
        self._ids_np, self._pos_np = self.input_ids.numpy(), self.positions.numpy()
        self._bt_np = self.block_table.numpy()
        self.mrope = mrope
        # Per-row sampling settings, gathered per step with one index op each.
        self.temperature = torch.zeros(max_n, dtype=torch.float32)
        self.top_p = torch.ones(max_n, dtype=torch.float32)
        self.top_k = torch.zeros(max_n, dtype=torch.int64)
        self.repetition_penalty = torch.ones(max_n, dtype=torch.float32)
        self.presence_penalty = torch.zeros(max_n, dtype=torch.float32)
        self.frequency_penalty = torch.zeros(max_n, dtype=torch.float32)
        self.rows: dict[str, _Row] = {}
        self._free_rows = list(range(max_n - 1, -1, -1))
        self.generators: dict[str, torch.Generator] = {}
        self.seen: torch.Tensor | None = None  # bool [max_n, V], made when a request first penalises
        self._seen_stale: set[int] = set()
        self.counts: torch.Tensor | None = None  # float [max_n, V] generated-token counts, made when first used
        self._counts_stale: set[int] = set()
        self._copied: torch.cuda.Event | None = None  # CUDA: marks the end of a step's host-to-device copies

    # -- request rows ---------------------------------------------------------------
    def drop(self, sched: SchedulerOutput) -> None:
        for rid in sched.finished_req_ids:
            self._release(rid)
            self.generators.pop(rid, None)
        for rid in sched.preempted_req_ids:
            self._release(rid)  # the generator stays: a resumed request continues its random stream

    def _release(self, request_id: str) -> None:
        row = self.rows.pop(request_id, None)
        if row is not None:
            self._free_rows.append(row.index)

    def _row_for(self, entry: ScheduledRequest) -> _Row:
        request = entry.request
        row = self.rows.get(request.request_id)
        if row is None:
            row = _Row(self._free_rows.pop())
            self.rows[request.request_id] = row
            self._admit(request, row.index)
        if entry.reset:
            row.num_blocks = 0
        new = entry.new_block_ids
        if new:
            self._bt_np[row.index, row.num_blocks:row.num_blocks + len(new)] = new
            row.num_blocks += len(new)
        return row

    def _admit(self, request: Request, index: int) -> None:
        params = request.sampling_params
        self.temperature[index] = params.temperature
        self.top_p[index] = params.top_p
        self.top_k[index] = params.top_k
        # Through float32 as the buffer holds it: a value past its range becomes inf (the sampler then fails
        # this row alone) instead of an overflow error that would fail the whole step.
        self.repetition_penalty[index] = torch.tensor(params.repetition_penalty, dtype=torch.float64).float()
        self.presence_penalty[index] = params.presence_penalty
        self.frequency_penalty[index] = params.frequency_penalty
        if params.seed is not None and request.request_id not in self.generators:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(params.seed)
            self.generators[request.request_id] = gen
        self._seen_stale.add(index)
        self._counts_stale.add(index)

    # -- one step -------------------------------------------------------------------
    def prepare(self, sched: SchedulerOutput) -> StepInputs:
        if self._copied is not None:  # the last step's async copies must have read the pinned buffers
            self._copied.synchronize()
        self.drop(sched)
        t = 0
        qsl, ctx, rows = self.query_start_loc.numpy(), self.context_lens.numpy(), self.step_rows.numpy()
        sample_requests: list[Request] = []
        sample_rows: list[int] = []
        embed_prompt: list[tuple[int, Request, int, int]] = []
        embed_outputs: list[tuple[int, OutputSpan]] = []
        spans: list[tuple[int, Request, int, int]] = []
        for i, entry in enumerate(sched.scheduled):
            request, k = entry.request, entry.num_new_tokens
            row = self._row_for(entry)
            start = request.num_computed_tokens
            end = start + k
            spans.append((t, request, start, k))
            self._write_tokens(request, start, end, t, row.index)
            prompt_len = request.num_prompt_tokens
            if request.prompt_embeds is not None and start < prompt_len:
                embed_prompt.append((t, request, start, min(end, prompt_len)))
            if self.feeds_output_embeds and end > prompt_len:
                first = max(start, prompt_len)
                span = OutputSpan(request, first - prompt_len, end - prompt_len)
                embed_outputs.append((t + first - start, span))
            rows[i] = row.index
            t += k
            qsl[i + 1] = t
            ctx[i] = end
            if end == request.num_tokens:
                self.logits_indices[len(sample_requests)] = t - 1
                sample_requests.append(request)
                sample_rows.append(i)
        n = len(sched.scheduled)
        self._write_slots(t)
        inputs = StepInputs(
            input_ids=self._to_device(self.input_ids[:t]),
            positions=self._to_device(self.positions[:, :t] if self.mrope else self.positions[0, :t]),
            meta=self._metadata(sched, n, t),
            logits_indices=self._to_device(self.logits_indices[:len(sample_requests)]),
            sample_requests=sample_requests, sample_rows=sample_rows,
            embed_prompt=embed_prompt, embed_outputs=embed_outputs, spans=spans,
        )
        if self.device.type == "cuda":
            self._copied = torch.cuda.Event()
            self._copied.record()
        return inputs

    def _write_tokens(self, request: Request, start: int, end: int, t: int, row: int) -> None:
        k = end - start
        prompt_len = request.num_prompt_tokens
        if k == 1 and start >= prompt_len:  # the decode fast path: scalars only
            self._ids_np[t] = request.output_token_ids[start - prompt_len]
            self._pos_np[:, t] = start + request.rope_delta
            self._tok_row[t], self._tok_pos[t] = row, start
            return
        self._ids_np[t:t + k] = request.token_ids(start, end)
        self._tok_row[t:t + k] = row
        self._tok_pos[t:t + k] = np.arange(start, end)
        mid = min(max(prompt_len, start), end)  # prompt positions are [start, mid), generated [mid, end)
        if mid > start:
            given = request.prompt_positions
            if given is None:
                self._pos_np[:, t:t + mid - start] = np.arange(start, mid)
            else:
                self.positions[:, t:t + mid - start] = given[..., start:mid] if self.mrope else given.reshape(
                    -1, given.shape[-1])[0, start:mid]
        if end > mid:
            self._pos_np[:, t + mid - start:t + k] = np.arange(mid, end) + request.rope_delta

    def _write_slots(self, t: int) -> None:
        pos = self._tok_pos[:t]
        blocks = self._bt_np[self._tok_row[:t], pos // self.block_size]
        self.slot_mapping.numpy()[:t] = blocks * self.block_size + pos % self.block_size

    def _metadata(self, sched: SchedulerOutput, n: int, t: int) -> AttentionMetadata:
        max_blocks = max(self.rows[e.request.request_id].num_blocks for e in sched.scheduled)
        tables = torch.index_select(self.block_table[:, :max_blocks], 0, self.step_rows[:n])
        ctx = self.context_lens[:n]
        return AttentionMetadata(
            query_start_loc=self._to_device(self.query_start_loc[:n + 1]),
            context_lens=self._to_device(ctx),
            slot_mapping=self._to_device(self.slot_mapping[:t]),
            block_tables=self._to_device(tables),
            query_lens=[e.num_new_tokens for e in sched.scheduled],
            context_lens_cpu=ctx.tolist(),
        )

    def _to_device(self, x: torch.Tensor) -> torch.Tensor:
        if self.device.type == "cpu":
            return x
        return x.to(self.device, non_blocking=True)

    # -- sampling -------------------------------------------------------------------
    def sampling_batch(self, inputs: StepInputs, vocab_size: int) -> SamplingBatch:
        """The sampled requests' settings, gathered from their rows."""
        requests = inputs.sample_requests
        params = [r.sampling_params for r in requests]
        index = torch.tensor([self.rows[r.request_id].index for r in requests], dtype=torch.int64)
        greedy = [p.greedy for p in params]
        batch = SamplingBatch(
            temperature=self._to_device(self.temperature[index]),
            top_k=self._to_device(self.top_k[index]),
            top_p=self._to_device(self.top_p[index]),
            generators=[self.generators.get(r.request_id) for r in requests],
            all_greedy=all(greedy), any_greedy=any(greedy),
            needs_sort=any(p.needs_sort for p in params),
            banned=_banned_ids(requests),
            max_top_k=max(p.top_k for p in params), any_top_p=any(p.top_p < 1.0 for p in params),
            all_top_k=all(p.top_k > 0 for p in params if not p.greedy),
            logprob_rows=tuple(i for i, p in enumerate(params) if p.logprobs is not None),
            max_logprobs=max((p.logprobs or 0) for p in params),
        )
        if any(p.repetition_penalty != 1.0 for p in params):
            batch.repetition_penalty = self._to_device(self.repetition_penalty[index])
            batch.seen = self._seen_rows(requests, index, vocab_size)
        if any(p.counts_outputs for p in params):
            batch.presence_penalty = self._to_device(self.presence_penalty[index])
            batch.frequency_penalty = self._to_device(self.frequency_penalty[index])
            batch.counts = self._count_rows(requests, index, vocab_size)
        return batch

    def _count_rows(self, requests: list[Request], index: torch.Tensor, vocab_size: int) -> torch.Tensor:
        if self.counts is None or self.counts.shape[1] != vocab_size:
            self.counts = torch.zeros(len(self.temperature), vocab_size, dtype=torch.float32, device=self.device)
            self._counts_stale = set(range(len(self.temperature)))
        for request in requests:
            row = self.rows[request.request_id].index
            if row in self._counts_stale:  # (re)built from the generated tokens once per admission
                self.counts[row].zero_()
                ids = torch.tensor([i for i in request.output_token_ids if 0 <= i < vocab_size], dtype=torch.int64,
                                   device=self.device)
                self.counts[row].index_add_(0, ids, torch.ones(len(ids), device=self.device))
                self._counts_stale.discard(row)
        return self.counts[index.to(self.device)]

    def _seen_rows(self, requests: list[Request], index: torch.Tensor, vocab_size: int) -> torch.Tensor:
        if self.seen is None or self.seen.shape[1] != vocab_size:
            self.seen = torch.zeros(len(self.temperature), vocab_size, dtype=torch.bool, device=self.device)
            self._seen_stale = set(range(len(self.temperature)))
        for request in requests:
            row = self.rows[request.request_id].index
            if row in self._seen_stale:  # (re)built from the token history once per admission
                self.seen[row].zero_()
                ids = [i for i in request.seen_token_ids() if 0 <= i < vocab_size]
                self.seen[row, torch.tensor(ids, dtype=torch.int64, device=self.device)] = True
                self._seen_stale.discard(row)
        return self.seen[index.to(self.device)]

    def record_sampled(self, requests: list[Request], token_ids: torch.Tensor) -> None:
        """Marks the new tokens as seen (and counted) for the rows that penalise repeats."""
        if self.counts is not None:
            counted = [(i, self.rows[r.request_id].index) for i, r in enumerate(requests)
                       if r.sampling_params.counts_outputs]
            if counted:
                which = torch.tensor([i for i, _ in counted], device=token_ids.device)
                rows = torch.tensor([row for _, row in counted], device=self.device)
                self.counts.index_put_((rows, token_ids[which].to(self.device)),
                                       torch.ones(len(counted), device=self.device), accumulate=True)
        if self.seen is None:
            return
        pairs = [(i, self.rows[r.request_id].index) for i, r in enumerate(requests)
                 if r.sampling_params.repetition_penalty != 1.0]
        if pairs:
            which = torch.tensor([i for i, _ in pairs], device=token_ids.device)
            rows = torch.tensor([row for _, row in pairs], device=self.device)
            self.seen[rows, token_ids[which].to(self.device)] = True


def _banned_ids(requests: list[Request]) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """EOS and stop ids are masked for requests still short of their min_tokens."""
    banned = []
    for i, request in enumerate(requests):
        params = request.sampling_params
        if request.num_output_tokens >= params.min_tokens:
            continue
        ids = params.stop_token_ids
        if request.eos_token_id is not None and not params.ignore_eos:
            ids = (*ids, request.eos_token_id)
        if ids:
            banned.append((i, ids))
    return tuple(banned)
