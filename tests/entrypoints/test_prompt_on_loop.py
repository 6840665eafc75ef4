"""Where a chat prompt is built: a short plain-text one on the event loop (a pool hop cost the server more than
the build), anything with media, tools or a long text in the decode pool, with the same ids either way."""

from __future__ import annotations

import asyncio

from omnistage.entrypoints.openai.common.decode_pool import CancelToken, DecodePool
from omnistage.entrypoints.openai.media.loaders import MediaFetcher
from omnistage.entrypoints.openai.media.prompt_builder import ON_LOOP_TEXT, PromptBuilder, PromptPlan, TemplateOptions
from omnistage.entrypoints.openai.server_config import MediaPolicy, ServerLimits
from tests.entrypoints.fake_engine import RecordingProcessor

TOOL = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object", "properties": {}}}}


class _CountingPool(DecodePool):
    def __init__(self) -> None:
        super().__init__(1)
        self.jobs = 0

    async def run(self, fn, *args):  # noqa: ANN001, ANN002, ANN201 - DecodePool.run's own signature
        self.jobs += 1
        return await super().run(fn, *args)


def _built(processor: RecordingProcessor, plan: PromptPlan) -> tuple[list[int], int]:
    """The prompt's ids, and how many jobs the pool ran for it."""
    limits = ServerLimits()
    pool = _CountingPool()
    try:
        builder = PromptBuilder(processor, MediaFetcher(MediaPolicy(), limits), limits, pool)
        prompt = asyncio.run(builder.build(plan))
    finally:
        pool.shutdown()
    return list(prompt.token_ids), pool.jobs


def _in_pool(processor: RecordingProcessor, plan: PromptPlan) -> list[int]:
    """The ids the pool's job builds (``PromptBuilder._build``, called here directly)."""
    limits = ServerLimits()
    builder = PromptBuilder(processor, MediaFetcher(MediaPolicy(), limits), limits, DecodePool(1))
    return list(builder._build(plan, CancelToken()).token_ids)


def test_a_short_plain_text_prompt_is_built_on_the_loop(processor: RecordingProcessor) -> None:
    plan = PromptPlan([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello there"}])
    ids, jobs = _built(processor, plan)
    assert jobs == 0
    assert ids == _in_pool(processor, plan) and len(ids) > 4


def test_a_long_text_tools_or_parts_go_to_the_pool(processor: RecordingProcessor) -> None:
    long = PromptPlan([{"role": "user", "content": "word " * (ON_LOOP_TEXT // 5 + 1)}])
    tools = PromptPlan([{"role": "user", "content": "hi"}], options=TemplateOptions(tools=[TOOL]))
    parts = PromptPlan([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    for plan in (long, tools, parts):
        ids, jobs = _built(processor, plan)
        assert jobs == 1, plan
        assert ids == _in_pool(processor, plan)
