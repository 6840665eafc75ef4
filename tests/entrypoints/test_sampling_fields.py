"""Sampling fields at their numeric extremes: each is served (200) or refused (400 naming it), never a 500,
and whatever reaches the engine lies in the ranges its batched sampler takes."""

from __future__ import annotations

import json
import math

import httpx
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from omnistage.entrypoints.openai.common.errors import APIError
from omnistage.entrypoints.openai.common.request_checks import make_sampling
from omnistage.sampling_params import TEMPERATURE_MAX, SamplingParams
from tests.entrypoints.conftest import LiveServer

FIELDS = ("temperature", "top_p", "top_k", "repetition_penalty", "seed", "max_tokens", "max_completion_tokens",
          "initial_codec_chunk_frames")
EXTREMES = (0, -1, 1, 2, 2**31 - 1, 2**31, 2**63 - 1, 2**63, 2**64, -(2**63), 10**30, 1e23, 1e300, -1e300,
            5e-324, 1e-45, 0.5, 2.0000001, math.inf, -math.inf, math.nan, True, "1", None)
numbers = st.one_of(st.sampled_from(EXTREMES), st.integers(min_value=-(2**70), max_value=2**70),
                    st.floats(allow_nan=True, allow_infinity=True))


def _post(server: LiveServer, fields: dict[str, object]) -> httpx.Response:
    body = {"model": "fake-omni", "messages": [{"role": "user", "content": "hi"}], **fields}
    # json.dumps writes NaN/Infinity as Python's parser (and so FastAPI's) reads them.
    return httpx.post(f"{server.base_url}/v1/chat/completions", content=json.dumps(body),
                      headers={"content-type": "application/json"}, timeout=30)


@pytest.mark.parametrize(("field", "value"), [("seed", -1), ("seed", 2**64), ("top_k", 1e23), ("top_k", 10**6),
                                              ("repetition_penalty", 1e300), ("repetition_penalty", 0.0),
                                              ("temperature", math.inf), ("top_p", math.nan)])
def test_out_of_range_sampling_is_a_400_naming_the_field(server: LiveServer, field: str, value: object) -> None:
    r = _post(server, {field: value})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field
    assert server.engine.requests == []


@pytest.mark.parametrize(("field", "value", "engine_value"), [("top_k", -1, 0), ("top_k", 0, 0), ("seed", 2**63 - 1,
                                                              2**63 - 1), ("repetition_penalty", 2.0, 2.0)])
def test_edge_values_are_served(server: LiveServer, field: str, value: object, engine_value: object) -> None:
    r = _post(server, {field: value})
    assert r.status_code == 200, r.text
    assert getattr(server.engine.requests[-1].sampling, field) == engine_value


def test_numeric_extremes_never_500(server: LiveServer) -> None:
    seen: list[int] = []

    @settings(max_examples=120, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(fields=st.dictionaries(st.sampled_from(FIELDS), numbers, min_size=1, max_size=3))
    def check(fields: dict[str, object]) -> None:
        server.engine.requests.clear()
        r = _post(server, fields)
        seen.append(r.status_code)
        assert r.status_code in (200, 400), (fields, r.status_code, r.text)
        if r.status_code == 400:
            assert r.json()["error"]["type"] == "invalid_request_error"
            return
        s = server.engine.requests[-1].sampling
        # What the engine got validates again as a SamplingParams (no value that could break a batch got through),
        # within the API's temperature range.
        assert SamplingParams(**msgspec.structs.asdict(s)) == s and s.temperature <= TEMPERATURE_MAX

    check()
    assert 200 in seen and 400 in seen


def test_a_requests_sampling_is_the_defaults_with_its_knobs_replaced() -> None:
    defaults = SamplingParams(temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05, seed=9, stop=("END",),
                              stop_token_ids=(5,), max_tokens=None)
    asked = make_sampling(max_tokens=30, defaults=defaults, top_p=0.5, seed=None, stop=["x", "y"], min_tokens=40,
                          logprobs=2)
    assert asked == msgspec.structs.replace(defaults, top_p=0.5, stop=("x", "y"), max_tokens=30, min_tokens=30,
                                            logprobs=2)
    assert make_sampling(max_tokens=4, defaults=defaults) == msgspec.structs.replace(defaults, max_tokens=4)


@pytest.mark.parametrize(("knobs", "param", "says"), [({"temperature": 2.5}, "temperature", "temperature"),
                                                      ({"temperature": math.nan}, "temperature", "temperature"),
                                                      ({"top_p": 0.0}, None, "top_p"),
                                                      ({"logprobs": 99}, None, "logprobs")])
def test_sampling_the_api_refuses_is_a_400_naming_the_field(knobs: dict, param: str | None, says: str) -> None:
    """The API's temperature range is narrower than the engine's (which takes 2.5); other ranges are the type's."""
    SamplingParams(temperature=2.5)
    with pytest.raises(APIError) as err:
        make_sampling(max_tokens=8, **knobs)
    assert err.value.status_code == 400 and err.value.detail.param == param and says in err.value.detail.message
