"""The one sampling type: what it normalises, what it refuses, and the talker's floor over it."""

from __future__ import annotations

import msgspec
import pytest

from omnistage.sampling_params import SamplingParams


def test_lists_and_one_stop_string_become_tuples_also_off_the_wire() -> None:
    params = SamplingParams(stop="END", stop_token_ids=[3, 4])
    assert (params.stop, params.stop_token_ids) == (("END",), (3, 4))
    assert SamplingParams(stop=["a", "b"]).stop == ("a", "b")
    wire = msgspec.msgpack.decode(msgspec.msgpack.encode(SamplingParams(stop=["x"], max_tokens=None)),
                                  type=SamplingParams)
    assert wire == SamplingParams(stop=("x",)) and wire.max_tokens is None


@pytest.mark.parametrize("bad", [dict(max_tokens=0), dict(min_tokens=-1), dict(min_tokens=5, max_tokens=4),
                                 dict(temperature=float("inf"))])
def test_refuses_what_no_engine_can_run(bad: dict) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        SamplingParams(**bad)
    SamplingParams(min_tokens=500)  # no max_tokens: any floor fits the context's end


def test_a_floor_holds_eos_back_but_never_past_max_tokens() -> None:
    assert SamplingParams(max_tokens=10).with_floor(4).min_tokens == 4
    assert SamplingParams(max_tokens=3).with_floor(4).min_tokens == 3
    assert SamplingParams(max_tokens=10, min_tokens=6).with_floor(4).min_tokens == 6
    assert SamplingParams().with_floor(4).min_tokens == 4
