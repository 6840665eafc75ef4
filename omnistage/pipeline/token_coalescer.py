"""A replica's new tokens go out at most once per interval per request, merged: its stream interval.

A stage that makes text sends a ``TokenDelta`` per request per step. Each crosses to the orchestrator, which
detokenises it, feeds it to the next stage and posts it to the caller's event loop, and each of those costs per
message, not per token: with many streams in a batch the steps come every few milliseconds and that cost, not the
model, fills the server process. vLLM's ``--stream-interval`` batches a request's tokens by count; this batches
them by time, so a slow step (one stream, a large model) still sends every token at once and only fast steps
merge. A request's first tokens go at once (time to first token, and the next stage starts on them), as does its
last output; a delta held back goes out with the request's next other output (before it: a stage's hidden
states are sent ahead of their tokens, and that order holds), once the interval since the request's last delta
has passed at the end of a step, or when the loop is about to wait for work (``flush``).
"""

from __future__ import annotations

from omnistage.ipc.messages import RequestFailed, StageOutput, StageTimes
from omnistage.ipc.payloads import TokenDelta

Output = StageOutput | RequestFailed | StageTimes


def merged(first: StageOutput, then: StageOutput) -> StageOutput:
    """One output for two consecutive token deltas of a request (``then``'s end, if it ends)."""
    a, b = first.payload, then.payload
    assert isinstance(a, TokenDelta) and isinstance(b, TokenDelta)
    logprobs = None if a.logprobs is None and b.logprobs is None else [*(a.logprobs or ()), *(b.logprobs or ())]
    delta = TokenDelta([*a.token_ids, *b.token_ids], max(a.num_prompt_tokens, b.num_prompt_tokens),
                       max(a.num_cached_tokens, b.num_cached_tokens), logprobs)
    return StageOutput(then.request_id, delta, then.finished, then.finish_reason)


class TokenCoalescer:
    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.held: dict[str, StageOutput] = {}  # request → its unsent tokens, merged
        self.sent_at: dict[str, float] = {}  # request → when its last delta went out (while it runs here)

    def take(self, outputs: list[Output], now: float) -> list[Output]:
        """What of a pass's outputs goes out now, in order per request, with held deltas now due."""
        if self.interval_s <= 0:
            return outputs
        out: list[Output] = []
        for output in outputs:
            rid = output.request_id
            if type(output) is StageOutput and type(output.payload) is TokenDelta:
                held = self.held.pop(rid, None)
                if held is not None:
                    output = merged(held, output)
                last = self.sent_at.get(rid)
                if not output.finished and last is not None and now - last < self.interval_s:
                    self.held[rid] = output
                    continue
                self.sent_at[rid] = now
            else:
                held = self.held.pop(rid, None)
                if held is not None:  # ahead of what came after it
                    out.append(held)
                    self.sent_at[rid] = now
            if type(output) is RequestFailed or (type(output) is StageOutput and output.finished):
                self.sent_at.pop(rid, None)
            out.append(output)
        if self.held:
            due = [rid for rid, output in self.held.items() if now - self.sent_at[rid] >= self.interval_s]
            for rid in due:
                out.append(self.held.pop(rid))
                self.sent_at[rid] = now
        return out

    def flush(self, now: float) -> list[Output]:
        """Every held delta (the loop is about to wait: nothing else would send them)."""
        out = list(self.held.values())
        for rid in self.held:
            self.sent_at[rid] = now
        self.held.clear()
        return out

    def drop(self, request_ids: list[str]) -> None:
        """Aborted here: what was held for them is not wanted."""
        for rid in request_ids:
            self.held.pop(rid, None)
            self.sent_at.pop(rid, None)
