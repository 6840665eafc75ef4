"""Truncation against the thinker's prefix cache, on the real tiny pipeline with a small context: a long text session
keeps answering under ``auto`` and under ``retention_ratio``, but ``auto`` cuts the oldest turn again at every turn
once full (each prompt's start after the instructions changes: the cache serves little more than the instructions),
while ``retention_ratio`` cuts to half the room at once and then grows in place (the cache serves each prompt up to
the previous one). Counted from ``response.done``'s ``usage.input_token_details.cached_tokens``."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from omnistage.entrypoints.openai.api_server import build_app
from omnistage.pipeline.async_omni import AsyncOmni
from omnistage.pipeline.runtime import PipelineOptions
from tests.entrypoints.server_thread import ServerThread
from tests.entrypoints.test_realtime import open_session, send, until
from tests.pipeline.specs import small_dict, write_spec

pytestmark = pytest.mark.e2e
CONTEXT = 320  # tokens: a dozen short turns fill it
TURNS = 20
ANSWER = 6  # max_output_tokens: also the room truncation keeps free


class _Server:
    def __init__(self, base_url: str) -> None:
        self.base_url = base_url


@pytest.fixture(scope="module")
def live(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    data = small_dict()
    data["stages"][0]["engine"]["max_model_len"] = CONTEXT
    config = write_spec(tmp_path_factory.mktemp("stages"), data)
    engine = AsyncOmni(tiny_dir, config, PipelineOptions(in_process=True), "tiny")
    thread = ServerThread(build_app(engine))
    try:
        yield _Server(thread.start())
    finally:
        thread.stop()
        asyncio.run(engine.shutdown())


def session_usage(live: _Server, truncation: object, word: str) -> list[dict]:
    """Each turn's usage (all must complete). ``word`` opens the instructions: sessions share no cached prefix."""
    async def scenario() -> list[dict]:
        usages = []
        async with await open_session(live, output_modalities=["text"], truncation=truncation,
                                      instructions=f"{word}: you are terse.",
                                      audio={"input": {"turn_detection": None}}) as ws:
            for turn in range(TURNS):
                await send(ws, {"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                                "content": [{"type": "input_text", "text": f"{word} turn {turn}, tell me more"}]}})
                await send(ws, {"type": "response.create", "response": {"max_output_tokens": ANSWER}})
                done, _ = await until(ws, "response.done")
                assert done["response"]["status"] in ("completed", "incomplete"), done["response"]
                usages.append(done["response"]["usage"])
        return usages
    return asyncio.run(scenario())


def cache_share(usages: list[dict]) -> float:
    """Cached tokens over prompt tokens, from the first turn that was truncated on (its prompt stopped growing)."""
    inputs = [u["input_tokens"] for u in usages]
    first_cut = next(i for i in range(1, len(inputs)) if inputs[i] < inputs[i - 1] or inputs[i] == inputs[i - 1])
    cached = sum(u["input_token_details"]["cached_tokens"] for u in usages[first_cut:])
    return cached / sum(inputs[first_cut:])


def test_retention_ratio_keeps_the_prefix_cache_hitting_where_auto_does_not(live: _Server) -> None:
    auto = session_usage(live, "auto", "alpha")
    ratio = session_usage(live, {"type": "retention_ratio", "retention_ratio": 0.5}, "bravo")
    for usages in (auto, ratio):  # the session outgrew the context, and every prompt fits
        assert max(u["input_tokens"] for u in usages) <= CONTEXT - ANSWER
        assert sum(u["input_tokens"] for u in usages) > CONTEXT * 2
    shares = cache_share(auto), cache_share(ratio)
    print(f"\ncached share of prompt tokens once truncating: auto {shares[0]:.2f}, retention_ratio 0.5 {shares[1]:.2f}")
    assert shares[1] > 0.5 and shares[1] > shares[0] + 0.25, shares
