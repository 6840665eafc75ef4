"""A toy model family of two stages, registered by tests: nothing of Qwen3-Omni or Qwen3-TTS is imported.

``letters`` (the entry stage, text out) writes token ``i`` on its i-th step until the request's count;
the ``toy.letters_to_tones`` edge hands each token on as a :class:`ToneFeed`; ``tones`` (audio out) answers
each feed at once with ``SAMPLES`` samples holding the token's value. Run as a script it serves one request
through the orchestrator and prints what the caller got, and which model code was imported, as JSON.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import msgspec
import torch

from omnistage.core import Modality
from omnistage.families.base import EdgeContext, EdgeModel, Family, FrontEnd, RequestEdge, StageModel
from omnistage.ipc.messages import PayloadTypes, ReplicaLoad, StageInput, StageOutput
from omnistage.ipc.payloads import AudioChunk, TokenDelta
from omnistage.workers.base import StageWorker, StepResult, WorkerSpec

SAMPLES = 3


@dataclass(frozen=True)
class ToyPrompt:
    count: int

    @property
    def num_tokens(self) -> int:
        return 1


class LettersStart(msgspec.Struct, tag="toy.LettersStart"):
    count: int


class ToneFeed(msgspec.Struct, tag="toy.ToneFeed"):
    token_ids: list[int]
    finished: bool = False


class Letters:
    """Token ids as letters (the caller's text)."""

    @staticmethod
    def decode(token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(ord("a") + t % 26) for t in token_ids)


class LettersWorker(StageWorker):
    def __init__(self, spec: WorkerSpec) -> None:
        self.todo: dict[str, list[int]] = {}  # request id → [made, count]

    def handle(self, message: StageInput) -> list[StageOutput]:
        assert isinstance(message.payload, LettersStart)
        self.todo[message.request_id] = [0, message.payload.count]
        return []

    def step(self) -> StepResult:
        outputs = []
        for rid, seq in list(self.todo.items()):
            seq[0] += 1
            done = seq[0] >= seq[1]
            outputs.append(StageOutput(rid, TokenDelta([seq[0]], num_prompt_tokens=1), done))
            if done:
                del self.todo[rid]
        return StepResult(outputs)

    def abort(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self.todo.pop(rid, None)

    def has_work(self) -> bool:
        return bool(self.todo)

    def load(self) -> ReplicaLoad:
        return ReplicaLoad(running=len(self.todo))

    def request_ids(self) -> list[str]:
        return list(self.todo)


class TonesWorker(StageWorker):
    def __init__(self, spec: WorkerSpec) -> None:
        self.chunks: dict[str, int] = {}

    def handle(self, message: StageInput) -> list[StageOutput]:
        feed = message.payload
        assert isinstance(feed, ToneFeed)
        index = self.chunks.get(message.request_id, 0)
        self.chunks[message.request_id] = index + 1
        wav = torch.tensor(feed.token_ids, dtype=torch.float32).repeat_interleave(SAMPLES)
        if feed.finished:
            self.chunks.pop(message.request_id)
        return [StageOutput(message.request_id, AudioChunk(index, wav, feed.finished), feed.finished)]

    def step(self) -> StepResult:
        return StepResult([], progressed=False)

    def abort(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self.chunks.pop(rid, None)

    def has_work(self) -> bool:
        return False

    def load(self) -> ReplicaLoad:
        return ReplicaLoad(running=len(self.chunks))

    def request_ids(self) -> list[str]:
        return list(self.chunks)


class LettersToTones(RequestEdge):
    def __init__(self, context: EdgeContext) -> None:
        self.context = context

    def on_output(self, payload: object, finished: bool) -> list[object]:
        tokens = list(payload.token_ids) if isinstance(payload, TokenDelta) else []
        return [ToneFeed(tokens, finished)] if tokens or finished else []


class ToyFamily(Family):
    name = "toy"
    model_types = ("toy",)
    stage_models = MappingProxyType({
        "letters": StageModel("ar", f"{__name__}:LettersWorker", output=Modality.TEXT, entry=True),
        "tones": StageModel("generation", f"{__name__}:TonesWorker", output=Modality.AUDIO),
    })
    edges = MappingProxyType({"toy.letters_to_tones": EdgeModel("letters", "tones", LettersToTones)})
    payloads = PayloadTypes((LettersStart, ToneFeed))

    def load_config(self, folder: Path) -> object:
        return None

    def preset(self, config: object) -> str:
        return "toy"

    def front_end(self, folder: Path, config: object) -> FrontEnd:
        return FrontEnd(Letters(), None, (), 64)

    def entry_input(self, context: EdgeContext) -> LettersStart:
        prompt = context.request.prompt
        assert isinstance(prompt, ToyPrompt)
        return LettersStart(prompt.count)


SPEC = {
    "name": "toy",
    "stages": [{"name": "writer", "kind": "ar", "model": "letters"},
               {"name": "speaker", "kind": "generation", "model": "tones"}],
    "edges": [{"from": "writer", "to": "speaker", "transform": "toy.letters_to_tones"}],
}


def serve_one(count: int, in_process: bool) -> dict[str, object]:
    """One request through a toy pipeline: the caller's text, audio and finish reason."""
    import queue

    from omnistage.config.pipeline import parse_pipeline
    from omnistage.core import OmniRequest
    from omnistage.families.registry import FamilyRegistry
    from omnistage.pipeline.graph import resolve_graph
    from omnistage.pipeline.runtime import PipelineOptions, PipelineRuntime, model_factories

    registry = FamilyRegistry({}).with_family(ToyFamily())
    graph = resolve_graph(parse_pipeline(SPEC), registry.family("toy"))
    options = PipelineOptions(in_process=in_process, ready_timeout_s=120)
    runtime = PipelineRuntime(graph, model_factories("", graph, options), Letters(), None, options)
    try:
        outputs: queue.Queue = queue.Queue()
        runtime.orchestrator.submit(OmniRequest("toy-1", ToyPrompt(count), frozenset(Modality)), outputs.put)
        text, audio = "", []
        while True:
            out = outputs.get(timeout=60)
            text += out.text
            if out.audio is not None:
                audio.extend(out.audio.tolist())
            if out.finished:
                return {"text": text, "audio": audio, "reason": out.finish_reason.value, "error": out.error,
                        "usage": [out.usage.prompt_tokens, out.usage.completion_tokens]}
    finally:
        runtime.close()


if __name__ == "__main__":
    # Through the module's own name: its classes are pickled for the replica processes by that name.
    from tests.pipeline.toy_family import serve_one as serve

    result = serve(int(sys.argv[1]), in_process=sys.argv[2] == "threads")
    result["imported"] = sorted(m for m in sys.modules if m.startswith(("omnistage.families.qwen3",
                                                                       "omnistage.models.qwen3")))
    print(json.dumps(result))
