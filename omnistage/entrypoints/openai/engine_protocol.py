"""What the HTTP layer needs from the pipeline, and the typed reports it reads back.

The server is written against ``OmniEngine`` only; the real implementation is
``omnistage.pipeline.async_omni.AsyncOmni`` and the tests use a fake. Reports
are frozen dataclasses rather than dicts so both sides agree on every field.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol, runtime_checkable

from omnistage.core import OmniOutput, OmniRequest, PromptDelta
from omnistage.families.base import FrontEnd
from omnistage.pipeline.reports import EngineStats, HealthReport
from omnistage.sampling_params import SamplingParams


@runtime_checkable
class OmniEngine(Protocol):
    """The pipeline as the server sees it.

    ``generate`` yields deltas of one request (text and/or a float32 audio chunk at
    the family's rate, ``front_end.audio.sample_rate``); the last has ``finished=True``.
    If the consumer stops early the server calls ``abort`` (shielded from
    cancellation) and then closes the iterator, so ``abort`` must free the request
    in every stage and be idempotent; aborting an unknown or finished id is a no-op.
    The front end's ``processor`` and ``speech`` are called from worker threads.
    """

    model_name: str  # the id /v1/models lists and requests must name
    # The served family's front end (its fields are declared there, once): the chat prompt processor (None: the
    # model takes no chat), a TTS model's speech preparation, voices, OpenAI voice names, default voice, and
    # its audio (frame timing, output rate; None when it makes none).
    front_end: FrontEnd
    supports_audio: bool  # False when the pipeline has no talker/code2wav stages
    max_model_len: int  # the thinker's context: prompt + completion tokens
    default_sampling: SamplingParams  # what a request's unset sampling knobs take

    def generate(self, request: OmniRequest) -> AsyncIterator[OmniOutput]: ...

    async def abort(self, request_id: str) -> None: ...

    def feed(self, request_id: str, delta: PromptDelta) -> None:
        """More input for a running request (its front end's ``PromptDelta``: text still being written), in
        order; a request that ended (or an unknown id) takes none. ``generate`` submits its request when its
        iterator is first advanced, before it first waits: a feed after that step reaches the pipeline after it."""
        ...

    def health(self) -> HealthReport: ...

    def stats(self) -> EngineStats: ...

    async def shutdown(self) -> None: ...
