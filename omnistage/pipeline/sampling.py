"""Per-stage sampling of one request: the user's knobs for the thinker, stage defaults for the talker."""

from __future__ import annotations

from omnistage.config.pipeline import StageSampling, StreamingSpec
from omnistage.core import RequestSampling
from omnistage.ipc.messages import WireSampling


def thinker_sampling(s: RequestSampling) -> WireSampling:
    """Temperature 0 is greedy; stop strings are matched on text by the orchestrator, not here."""
    return WireSampling(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                        repetition_penalty=s.repetition_penalty, seed=s.seed, max_tokens=s.max_tokens,
                        min_tokens=min(s.min_tokens, s.max_tokens), ignore_eos=s.ignore_eos,
                        presence_penalty=s.presence_penalty, frequency_penalty=s.frequency_penalty,
                        logprobs=s.logprobs, stop_token_ids=s.stop_token_ids)


def talker_sampling(stage: StageSampling, seed: int | None, min_new_tokens: int = 0) -> WireSampling:
    """The talker stage's defaults, seeded from the request so one seed always gives the same audio.

    ``min_new_tokens`` keeps a randomly initialised talker from ending on its first frame (tests).
    """
    return WireSampling(temperature=stage.temperature, top_p=stage.top_p, top_k=stage.top_k,
                        repetition_penalty=stage.repetition_penalty, seed=seed, max_tokens=stage.max_tokens,
                        min_tokens=min(min_new_tokens, stage.max_tokens))


def initial_chunk_frames(streaming: StreamingSpec, requested: int | None, busy: int, capacity: int) -> int:
    """Frames in a request's first code2wav chunk.

    A small first chunk cuts time to first audio but costs one more vocoder call
    per request; under load those calls queue behind other requests' chunks, so
    the first chunk grows linearly with the audio requests already in flight,
    reaching the regular chunk size once code2wav is at capacity. A request may
    name its own size.
    """
    if requested is not None:
        return max(int(requested), 1)
    low, high = streaming.initial_codec_chunk_frames, max(streaming.codec_chunk_frames,
                                                          streaming.initial_codec_chunk_frames)
    share = min(busy / max(capacity, 1), 1.0)
    return round(low + (high - low) * share)
