"""The thinker stage of any omni family: a prompt in, token deltas out, with what its talker reads of its states.

The family's thinker worker loads its model, builds the engine and turns its prompt payload into an engine
request (:meth:`ThinkerWorker.build_request`); this base takes the prompts in and turns engine outputs into
:class:`TokenDelta`\\ s, each preceded, for a request whose reply a talker speaks, by the family's hidden-state
payload (:meth:`ThinkerWorker.hidden_payload`: Qwen3-Omni's prompt states once, Qwen2.5-Omni's new rows every
time).
"""

from __future__ import annotations

from abc import abstractmethod
from typing import ClassVar, Generic, TypeVar

import torch

from omnistage.engine import FinishReason, Request
from omnistage.ipc.messages import RequestFailed, StageInput, StageOutput
from omnistage.ipc.payloads import TokenDelta
from omnistage.workers.base import ARWorker, StepResult


_Prompt = TypeVar("_Prompt")


class ThinkerWorker(ARWorker[Request], Generic[_Prompt]):
    prompt_type: ClassVar[type]  # the family's thinker prompt payload, ``_Prompt``

    @abstractmethod
    def build_request(self, request_id: str, prompt: _Prompt) -> Request:
        """The engine request for one prompt payload."""

    def hidden_payload(self, request: Request) -> object | None:
        """What the talker needs of the thinker's states before this request's next token output, or None."""
        return None

    @torch.inference_mode()
    def handle(self, message: StageInput) -> list[StageOutput | RequestFailed]:
        prompt = message.payload
        if not isinstance(prompt, self.prompt_type):
            raise TypeError(f"the thinker does not take {type(prompt).__name__}")
        request = self.build_request(message.request_id, prompt)
        self.engine.add_request(request)
        self.requests[message.request_id] = request
        return []

    def step(self) -> StepResult:
        outputs: list[StageOutput | RequestFailed] = []
        for out in self.engine.step():
            request = self.requests.get(out.request_id)
            if request is None:
                continue
            if out.finish_reason is FinishReason.ERROR:
                outputs.append(self.failed(out))
                continue
            if (hidden := self.hidden_payload(request)) is not None:
                outputs.append(StageOutput(out.request_id, hidden))
            delta = TokenDelta(out.new_token_ids, request.num_prompt_tokens, max(request.num_cached_tokens, 0),
                               out.logprobs)
            outputs.append(StageOutput(out.request_id, delta, out.finished, out.finish_reason))
            if out.finished:
                self.requests.pop(out.request_id, None)
        return StepResult(outputs, progressed=self.progressed())
