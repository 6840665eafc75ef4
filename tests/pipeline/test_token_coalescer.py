"""A replica's stream interval: token deltas merged per request, in order, none lost."""

from __future__ import annotations

from omnistage.core import FinishReason
from omnistage.ipc.messages import RequestFailed, StageOutput
from omnistage.ipc.payloads import TokenDelta
from omnistage.pipeline.token_coalescer import TokenCoalescer


def tokens(rid: str, *ids: int, finished: bool = False, prompt: int = 5) -> StageOutput:
    reason = FinishReason.STOP if finished else None
    return StageOutput(rid, TokenDelta(list(ids), prompt), finished, reason)


def sent_ids(outputs: list) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for o in outputs:
        if isinstance(o, StageOutput) and isinstance(o.payload, TokenDelta):
            out.setdefault(o.request_id, []).extend(o.payload.token_ids)
    return out


def test_first_tokens_go_at_once_then_merge_within_the_interval():
    c = TokenCoalescer(0.02)
    assert sent_ids(c.take([tokens("a", 1)], now=0.0)) == {"a": [1]}
    assert c.take([tokens("a", 2)], now=0.005) == []
    assert c.take([tokens("a", 3)], now=0.010) == []
    out = c.take([tokens("a", 4)], now=0.021)  # the interval since the last delta passed: all of them, once
    assert len(out) == 1 and out[0].payload.token_ids == [2, 3, 4]


def test_a_held_delta_goes_out_once_due_even_without_new_tokens():
    c = TokenCoalescer(0.02)
    c.take([tokens("a", 1)], now=0.0)
    assert c.take([tokens("a", 2)], now=0.01) == []
    assert c.take([], now=0.015) == []
    out = c.take([], now=0.025)
    assert sent_ids(out) == {"a": [2]}


def test_the_last_output_carries_what_was_held_and_ends_the_request():
    c = TokenCoalescer(0.02)
    c.take([tokens("a", 1)], now=0.0)
    c.take([tokens("a", 2)], now=0.001)
    out = c.take([tokens("a", 3, finished=True)], now=0.002)
    assert len(out) == 1 and out[0].finished and out[0].finish_reason is FinishReason.STOP
    assert out[0].payload.token_ids == [2, 3]
    assert c.held == {} and c.sent_at == {}  # nothing kept for a request that left


def test_other_outputs_of_a_request_keep_their_place_after_its_held_tokens():
    c = TokenCoalescer(0.02)
    c.take([tokens("a", 1)], now=0.0)
    c.take([tokens("a", 2)], now=0.001)
    hidden = StageOutput("a", "hidden-row")  # e.g. a thinker's states for its next token
    out = c.take([hidden, tokens("a", 3)], now=0.002)
    assert out[0].payload.token_ids == [2] and out[1] is hidden  # 3 is held: the interval since 2 has not passed
    assert c.held["a"].payload.token_ids == [3]


def test_requests_are_independent_and_flush_sends_everything():
    c = TokenCoalescer(0.02)
    c.take([tokens("a", 1), tokens("b", 10)], now=0.0)
    assert c.take([tokens("a", 2), tokens("b", 11)], now=0.001) == []
    assert sent_ids(c.flush(now=0.002)) == {"a": [2], "b": [11]}
    assert c.held == {}


def test_a_failure_or_abort_forgets_the_request():
    c = TokenCoalescer(0.02)
    c.take([tokens("a", 1), tokens("b", 1)], now=0.0)
    c.take([tokens("a", 2), tokens("b", 2)], now=0.001)
    failed = RequestFailed("a", "boom")
    out = c.take([failed], now=0.002)
    assert out[-1] is failed and "a" not in c.sent_at
    c.drop(["b"])
    assert c.held == {} and c.sent_at == {}


def test_logprobs_and_counts_merge():
    c = TokenCoalescer(0.02)
    c.take([tokens("a", 1)], now=0.0)
    first = StageOutput("a", TokenDelta([2], 5, 1, logprobs=["lp2"]))
    then = StageOutput("a", TokenDelta([3], 5, 3, logprobs=["lp3"]), True, FinishReason.LENGTH)
    c.take([first], now=0.001)
    (out,) = c.take([then], now=0.002)
    assert out.payload.logprobs == ["lp2", "lp3"] and out.payload.num_cached_tokens == 3
    assert out.finish_reason is FinishReason.LENGTH


def test_interval_zero_passes_everything_through():
    c = TokenCoalescer(0.0)
    outputs = [tokens("a", 1), tokens("a", 2)]
    assert c.take(outputs, now=0.0) is outputs


def test_a_pipeline_with_a_long_interval_streams_merged_deltas_and_the_same_text(tiny_dir, tmp_path):
    """In a running pipeline: the first tokens alone, the rest merged (the thinker's steps are far faster than a
    second), and the streamed text is the whole reply's; with interval 0, one delta per token."""
    from omnistage.pipeline.omni import Omni
    from omnistage.pipeline.runtime import PipelineOptions
    from tests.pipeline.specs import small_dict, write_spec

    config = write_spec(tmp_path, small_dict())
    texts, counts = [], []
    for interval_ms in (1000.0, 0.0):
        options = PipelineOptions(in_process=True, stream_interval_ms=interval_ms)
        with Omni(tiny_dir, config, options=options) as omni:
            outputs = list(omni.generate("Tell me a story about a fox.", stream=True, max_tokens=16,
                                         ignore_eos=True))
        assert sum(len(o.token_ids) for o in outputs) == 16 and outputs[-1].finished
        texts.append("".join(o.text for o in outputs))
        counts.append(sum(1 for o in outputs if o.token_ids))
        assert len(next(o for o in outputs if o.token_ids).token_ids) == 1  # the first token at once, alone
    assert texts[0] == texts[1]
    # Merged: the first token, then the rest with the last (a pass that made no progress may flush once more).
    assert counts[0] <= 3 and counts[1] == 16
