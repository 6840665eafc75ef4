"""``Omni``: the synchronous Python API.

    omni = Omni(model="tiny")
    for out in omni.generate("Hi!", modalities=["text", "audio"], stream=True, max_tokens=32, seed=0):
        print(out.text, None if out.audio is None else out.audio.shape)

Unset sampling knobs take the thinker stage's defaults from the stage config.
With ``stream=False`` one output comes back, holding the whole text and audio.
"""

from __future__ import annotations

import itertools
import queue
import uuid
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import msgspec
import numpy as np

from omnistage.config.pipeline import PipelineSpec
from omnistage.core import Modality, OmniOutput, OmniRequest
from omnistage.pipeline.engine import OmniPipeline
from omnistage.pipeline.runtime import PipelineOptions
from omnistage.processing.prompt import ProcessedPrompt
from omnistage.processing.video import Video

Messages = str | Sequence[int] | Sequence[dict[str, object]]


class Omni:
    def __init__(self, model: str | Path = "tiny", stage_config: str | Path | PipelineSpec | None = None,
                 *, in_process: bool = False, backend: str = "local", options: PipelineOptions | None = None
                 ) -> None:
        """``backend="ray"`` runs the stage replicas as Ray actors (``docs/ray.md``); ``options`` wins over both
        keywords."""
        self.pipeline = OmniPipeline(model, stage_config,
                                     options or PipelineOptions(in_process=in_process, backend=backend))
        self._ids = itertools.count()

    def __enter__(self) -> Omni:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.pipeline.close()

    def prompt(self, messages: Messages, audios: Sequence[np.ndarray] = (), images: Sequence[object] = (),
               videos: Sequence[Video] = (), use_audio_in_video: bool = False) -> ProcessedPrompt:
        """Chat messages (or a user string, or prompt token ids) plus 16 kHz audios / images / videos (frames
        and their fps) → thinker input. ``use_audio_in_video``: each video's ``audio`` (its 16 kHz sound
        track) is interleaved with its frames, as transformers' processor does."""
        proc = self.pipeline.front_end.processor
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        if messages and isinstance(messages[0], int):
            token_ids = [int(t) for t in messages]
        else:
            token_ids = proc.apply_chat_template(list(messages))
        return proc.process(token_ids, audios=list(audios), images=list(images), videos=list(videos),
                            use_audio_in_video=use_audio_in_video)

    def request(self, messages: Messages, modalities: Iterable[str] = ("text",), *,
                audios: Sequence[np.ndarray] = (), images: Sequence[object] = (), videos: Sequence[Video] = (),
                use_audio_in_video: bool = False, voice: str = "", initial_codec_chunk_frames: int | None = None, request_id: str | None = None,
                stream: bool = True, **sampling: object) -> OmniRequest:
        """The ``OmniRequest`` :meth:`generate` sends; ``sampling`` keys are ``SamplingParams`` fields, replacing
        the server's defaults (with the entry stage's ``max_tokens`` where the checkpoint sets none). ``stream``:
        the audio is played as it arrives (chunks follow the player), else consumed whole."""
        stage = self.pipeline.spec.stage(self.pipeline.graph.entry).sampling
        defaults = self.pipeline.default_sampling  # the stage config's, under the checkpoint's generation config
        knobs = {"max_tokens": defaults.max_tokens or stage.max_tokens}
        knobs.update({k: v for k, v in sampling.items() if v is not None})
        return OmniRequest(
            request_id=request_id or f"omni-{uuid.uuid4().hex[:8]}-{next(self._ids)}",
            prompt=self.prompt(messages, audios, images, videos, use_audio_in_video),
            modalities=frozenset(Modality(m) for m in modalities),
            sampling=msgspec.structs.replace(defaults, **knobs), voice=voice,
            initial_codec_chunk_frames=initial_codec_chunk_frames, stream=stream)

    def generate(self, messages: Messages, modalities: Iterable[str] = ("text",), stream: bool = False,
                 **kwargs: object) -> Iterator[OmniOutput]:
        """Streams deltas (``stream=True``) or yields one output with everything; kwargs as :meth:`request`."""
        outputs = self.stream(self.request(messages, modalities, stream=stream, **kwargs))
        return outputs if stream else _merged(outputs)

    def stream(self, request: OmniRequest) -> Iterator[OmniOutput]:
        deltas: queue.SimpleQueue[OmniOutput] = queue.SimpleQueue()
        self.pipeline.submit(request, deltas.put)
        finished = False
        try:
            while not finished:
                output = deltas.get()
                finished = output.finished
                yield output
        finally:
            if not finished:  # the caller stopped iterating: free every stage
                self.pipeline.abort(request.request_id)


def _merged(outputs: Iterator[OmniOutput]) -> Iterator[OmniOutput]:
    yield merge_outputs(list(outputs))


def merge_outputs(outputs: Sequence[OmniOutput]) -> OmniOutput:
    """One request's deltas → one output with the whole text, tokens and audio (the last one's ending)."""
    return OmniOutput.merge(outputs)
