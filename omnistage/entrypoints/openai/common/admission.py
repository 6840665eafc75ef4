"""Admission control: a bounded number of requests in the pipeline, refused fast rather than queued for ever.

Every request that reaches the engine holds a ``Ticket`` from admission until
it ends (finished, failed, timed out or abandoned by its client). Past
``max_queued_requests`` tickets a new request is refused at once with 429,
and while a stage has no healthy replica with 503; both carry ``Retry-After``
(a 429's from the rate requests have been leaving at, ``DrainRate``).
Because every stage queue only ever holds admitted requests, this one bound
also bounds each stage's queue. Runs on the event loop only, so no locks.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from fastapi.responses import JSONResponse

from omnistage.core import Modality
from omnistage.entrypoints.openai.common.drain_rate import DrainRate
from omnistage.entrypoints.openai.common.errors import SERVER_ERROR, APIError
from omnistage.entrypoints.openai.engine_protocol import OmniEngine

RETRY_UNHEALTHY_S = 5  # Retry-After while a stage restarts


class Overloaded(APIError):
    """429 or 503 with a ``Retry-After`` header."""

    def __init__(self, status_code: int, message: str, code: str, retry_after_s: float) -> None:
        super().__init__(status_code, message, type=SERVER_ERROR, code=code)
        self.retry_after_s = retry_after_s

    def response(self) -> JSONResponse:
        response = super().response()
        response.headers["Retry-After"] = str(max(1, math.ceil(self.retry_after_s)))
        return response


class Ticket:
    """One admitted request's place; ``release`` is idempotent."""

    def __init__(self, on_release: Callable[[], None]) -> None:
        self._on_release: Callable[[], None] | None = on_release

    def release(self) -> None:
        if self._on_release is not None:
            on_release, self._on_release = self._on_release, None
            on_release()


class _Places:
    """The places taken under one bound (shared by the admissions of every pipeline a server runs)."""

    def __init__(self) -> None:
        self.taken = 0


class Admission:
    def __init__(self, engine: OmniEngine, max_requests: int, drain: DrainRate | None = None) -> None:
        self.engine = engine
        self.max_requests = max_requests
        self._places = _Places()
        self.drain = drain or DrainRate()

    @property
    def admitted(self) -> int:
        return self._places.taken

    def beside(self, engine: OmniEngine) -> Admission:
        """The admission of a second pipeline the server runs (``serve --transcription-model``): its own health,
        this one's bound, places and drain rate."""
        other = Admission(engine, self.max_requests, self.drain)
        other._places = self._places
        return other

    def admit(self, modalities: frozenset[Modality] | None = None) -> Ticket:
        """A ticket for one request, or ``Overloaded``: 503 while a stage it needs is down (every stage, unless
        it names the ``modalities`` it wants: text needs no talker), 429 when full."""
        report = self.engine.health()
        if down := report.down(modalities) or (() if report.stages else ("the pipeline",)):
            raise Overloaded(503, f"no healthy replica of: {', '.join(down)}; retry shortly", "stage_unavailable",
                             RETRY_UNHEALTHY_S)
        if self.admitted >= self.max_requests:
            raise Overloaded(429, f"the server is at its limit of {self.max_requests} requests in flight; "
                                  f"retry shortly", "overloaded", self.drain.retry_after_s())
        self._places.taken += 1
        return Ticket(self._release)

    def _release(self) -> None:
        self._places.taken -= 1
        self.drain.freed()
