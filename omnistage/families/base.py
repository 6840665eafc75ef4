"""What a model family contributes to serving: the seams the generic pipeline resolves names through.

A :class:`Family` says how its ``config.json`` is recognised and parsed (once,
into its typed config), which stage workers its stage YAML ``model:`` names
run, which edge transforms its ``transform:`` names apply, which payload structs
its stages exchange, how a caller's request becomes the entry stage's typed
input, which preset a checkpoint gets, and its make-tiny/verify hooks. The
pipeline never names a family's roles: it routes each request along the graph's
edges, handing each edge's :class:`RequestEdge` the source's outputs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import msgspec

from omnistage.audio_spec import AudioSpec
from omnistage.config.pipeline import PipelineSpec, StageSpec
from omnistage.core import Modality, OmniRequest
from omnistage.importing import resolve
from omnistage.ipc.messages import PayloadTypes
from omnistage.sampling_params import SamplingParams

if TYPE_CHECKING:
    from omnistage.families.speech import SpeechFrontEnd
    from omnistage.processing.transcription import TranscriptionPrompter, WordTimer


@dataclass(frozen=True)
class StageModel:
    """A stage YAML ``model:`` name resolved.

    kind: the engine kind it runs on (``ar`` or ``generation``).
    worker: ``"package.module:Class"``, the :class:`omnistage.workers.base.StageWorker` a replica builds.
    output: what the caller gets from this stage: its :class:`TokenDelta`\\ s are the caller's text (TEXT), its
        :class:`AudioChunk`\\ s the caller's audio (AUDIO); None for a stage whose outputs only feed others.
    entry: whether a request can start here (the family's :meth:`Family.entry_input` makes its input).
    tensor_parallel: the worker can load its model as one rank of a tensor-parallel group.
    """

    kind: str
    worker: str
    output: Modality | None = None
    entry: bool = False
    tensor_parallel: bool = False  # the model can be sharded over ranks (a stage's tensor_parallel_size > 1)


@dataclass(frozen=True)
class EdgeContext:
    """What an edge's per-request state is built from: the request and the target stage's settings."""

    request: OmniRequest
    target: StageSpec
    min_new_tokens: int = 0  # --talker-min-new-tokens: random test checkpoints stop at once otherwise

    def request_sampling(self) -> SamplingParams:
        """The request's own sampling, an entry stage's (a thinker's, a TTS talker's), checked again here: a caller
        may have forced a value past its checks, and it must fail this request at the pipeline's door rather than
        its decode in the stage's replica."""
        return msgspec.structs.replace(self.request.sampling)

    def stage_sampling(self) -> SamplingParams:
        """The target stage's configured sampling for this request (a talker's): seeded from the request (one seed
        always gives the same audio), with the floor; a prefill-only request runs the stage one step (its prefill)
        and no floor holds it longer, so every family's talker prefills and lets it go."""
        stage = self.target.sampling
        seed = stage.seed if self.request.sampling.seed is None else self.request.sampling.seed
        if self.request.prefill_only:
            return msgspec.structs.replace(stage, seed=seed, max_tokens=1, min_tokens=0)
        return msgspec.structs.replace(stage, seed=seed).with_floor(self.min_new_tokens)


class RequestEdge(ABC):
    """One request crossing one edge: the source stage's output payloads in, the target's input payloads out."""

    @abstractmethod
    def on_output(self, payload: object, finished: bool) -> list[object]:
        """``finished``: the source is done with the request (after this payload, which may be None)."""


@dataclass(frozen=True)
class EdgeModel:
    """A stage YAML ``transform:`` name resolved: which stage models it joins, and what crosses.

    make: builds one request's :class:`RequestEdge`. None means the generic codec edge: the source's
    :class:`CodecFrames` cut into playback-aware :class:`ChunkJob`\\ s for a codec stage
    (``omnistage.pipeline.codec_edge``), whose per-request voice prompt the family may give
    (:meth:`Family.codec_prime`).
    """

    source: str
    target: str
    make: Callable[[EdgeContext], RequestEdge] | None = None


@dataclass(frozen=True)
class Hooks:
    """Tool hooks as ``"package.module:function"``, imported only when used.

    make_tiny(args) -> int: ``omnistage make-tiny --model-type <family>`` (writes a random checkpoint).
    verify(args, folder) -> int: ``omnistage verify`` on one of the family's folders (parity vs the reference).
    cached(name) -> Path: the embedded random checkpoint ``--model <name>`` means (made on first use), for the
        names in ``tiny_names``.
    word_timer(folder) -> WordTimer: a forced aligner of the family's, loaded for ``serve --aligner FOLDER``.
    speech_baseline(folder, texts, max_frames) -> list[tuple[float, float]]: transformers' own generation of each
        text, one at a time (``bench serve --backend openai-audio-speech --baseline hf``): each utterance's
        seconds from start to its whole audio, and its audio's seconds.
    duplex(folder, max_sessions, dtype) -> DuplexServed: a full-duplex family's model and codec for the duplex engine
        (``omnistage.engine.duplex``), which serves it instead of a stage pipeline.
    footprints(folder, dtype_bytes, kv_dtype_bytes) -> dict[str, StageFootprint]: each stage's memory for
        ``omnistage plan``, keyed by the preset's stage ``model`` names (Qwen3-Omni's is the plan's own).
    """

    make_tiny: str = ""
    verify: str = ""
    cached: str = ""
    tiny_names: tuple[str, ...] = ()
    word_timer: str = ""
    speech_baseline: str = ""
    duplex: str = ""
    footprints: str = ""


def call_hook(hook: str, *args: object) -> object:
    return resolve(hook)(*args)


class Family(ABC):
    """A model family as the pipeline and the front end see it (subclass once per family)."""

    name: str
    model_types: tuple[str, ...] = ()  # the config.json ``model_type``\ s it serves (the registry keys on them)
    stage_models: Mapping[str, StageModel]
    edges: Mapping[str, EdgeModel]
    payloads: PayloadTypes  # the family's own payload structs (the generic ones are always there)
    hooks: Hooks = Hooks()

    @property
    def tensor_parallel_models(self) -> tuple[str, ...]:
        """The stage ``model:`` names whose model this family can shard."""
        return tuple(name for name, model in self.stage_models.items() if model.tensor_parallel)

    def recognises(self, raw: Mapping[str, Any]) -> bool:
        """Whether a parsed ``config.json`` is one of this family's checkpoints (default: its model_type)."""
        return raw.get("model_type") in self.model_types

    @abstractmethod
    def load_config(self, folder: Path) -> object:
        """The family's typed config of a checkpoint folder (parsed once, passed down)."""

    @abstractmethod
    def preset(self, config: object) -> Path:
        """The stage config a checkpoint is served with by default: the path of a YAML in the family's own
        package (every family's presets live with it)."""

    def check_spec(self, spec: PipelineSpec, config: object) -> None:
        """Rejects a stage config this checkpoint cannot serve (``ConfigError``); default: anything goes."""

    @abstractmethod
    def front_end(self, folder: Path, config: object) -> FrontEnd:
        """What the server needs without loading weights: tokenizer/processor, voices, request preparation."""

    @abstractmethod
    def entry_input(self, context: EdgeContext) -> object:
        """The entry stage's input payload for a caller's request (``context.target`` is the entry stage)."""

    def entry_feed(self, delta: object) -> object:
        """The entry stage's input for more of a running request's input (a ``PromptDelta`` its front end made:
        text still being written); a family whose front end makes none takes none."""
        raise TypeError(f"the {self.name} family takes no input while its request runs")

    def codec_prime(self, request: OmniRequest) -> object | None:
        """Frames ``[G, R]`` a request's codec stream decodes first without returning their audio (a cloned
        voice's reference), or None."""
        return None


@dataclass
class FrontEnd:
    """A served checkpoint as the front end sees it (built in the server process, no weights).

    tokenizer: detokenises a text stage's tokens (None: the family has no text output).
    processor: the chat prompt processor (None: the family takes no chat).
    voices: the names ``voice`` may take (speakers of the checkpoint).
    max_positions: the entry stage model's positions (its engine may cap them).
    speech: text-to-speech preparation when the family is a TTS model (None otherwise).
    openai_voices: OpenAI's voice names (``alloy``...) → the family's speakers, for clients that allow only those.
    default_voice: the speaker a request that names none gets ("": the first of ``voices``).
    audio: the family's audio (frame timing, what a frame holds, how its decoder streams, the output rate);
        None when it makes none. Every generic layer reads these from here (``omnistage.audio_spec``).
    spoken_system_prompt: the system turn the family's talker was trained under ("": none needed); a prompt the
        server writes itself for a spoken reply (speech's, when the thinker repeats the input) opens with it, and a
        realtime session's instructions are it until the client sets its own.
    transcriber: a speech recogniser's transcription prompts (Qwen3-ASR's), which the transcription routes use
        instead of asking ``processor``'s chat model for a transcript (None: the family has none).
    word_timer: a forced aligner served beside the model (``serve --aligner``), which times a transcript's words.
    duplex: the model is served by the duplex engine (its family's ``duplex`` hook), not a stage pipeline: it
        listens and speaks at once in GPT-Live sessions (``/v1/live/sessions``) and takes no request-shaped route.
    """

    tokenizer: object | None
    processor: object | None
    voices: tuple[str, ...]
    max_positions: int
    audio: AudioSpec | None = None
    speech: SpeechFrontEnd | None = None
    openai_voices: Mapping[str, str] = field(default_factory=dict)
    default_voice: str = ""
    spoken_system_prompt: str = ""
    transcriber: TranscriptionPrompter | None = None
    word_timer: WordTimer | None = None
    duplex: bool = False
