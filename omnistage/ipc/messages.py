"""The messages between the orchestrator and a stage replica (the one process boundary of the pipeline).

Inputs go orchestrator → replica on the replica's input socket; a replica
answers with ``ReplicaMessage``s on its output socket. Every struct is tagged,
so each direction decodes as one union. Tensor fields travel out of band
(``omnistage.ipc.serialization``).
"""

from __future__ import annotations

import msgspec
import torch

from omnistage.engine.logprobs import TokenLogprob


class WireSampling(msgspec.Struct, frozen=True):
    """``omnistage.engine.SamplingParams`` on the wire."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    seed: int | None = None
    max_tokens: int = 16
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: int | None = None


class WireMultimodal(msgspec.Struct, frozen=True):
    """``omnistage.processing.prompt.MultimodalInputs`` on the wire."""

    input_features: torch.Tensor | None = None
    feature_attention_mask: torch.Tensor | None = None
    pixel_values: torch.Tensor | None = None
    image_grid_thw: torch.Tensor | None = None
    pixel_values_videos: torch.Tensor | None = None
    video_grid_thw: torch.Tensor | None = None
    video_second_per_grid: torch.Tensor | None = None


# ---- orchestrator → replica -------------------------------------------------------------------
class StartThinker(msgspec.Struct, tag=True):
    request_id: str
    prompt_token_ids: list[int]
    sampling: WireSampling
    mm: WireMultimodal | None = None
    capture_hidden: bool = False  # the talker will need accept-layer hidden states


class WirePromptLayout(msgspec.Struct, frozen=True):
    """The thinker prompt as the talker lays out its positions (``qwen3_omni_stages.PromptLayout``)."""

    token_ids: list[int]
    image_grid_thw: torch.Tensor | None = None
    video_grid_thw: torch.Tensor | None = None
    audio_lengths: torch.Tensor | None = None
    video_second_per_grid: torch.Tensor | None = None


class StartTalker(msgspec.Struct, tag=True):
    """The talker's start: the thinker's prompt, its hidden states at multimodal rows, its first token."""

    request_id: str
    layout: WirePromptLayout
    first_token: int
    voice: str
    sampling: WireSampling
    mm_hidden: torch.Tensor | None = None  # [M, H_thinker] at the prompt's M multimodal rows; None when M = 0


class FeedText(msgspec.Struct, tag=True):
    """More thinker tokens for a running talker request; ``finished`` once the thinker is done."""

    request_id: str
    token_ids: list[int]
    finished: bool = False


class DecodeChunk(msgspec.Struct, tag=True):
    """Code2wav: codes ``[G, T]`` whose first ``left_context`` frames were already decoded."""

    request_id: str
    chunk_index: int
    codes: torch.Tensor
    left_context: int
    is_last: bool = False
    deadline: float = 0.0  # orchestrator's monotonic time when the stream's buffered audio runs out


class AbortRequests(msgspec.Struct, tag=True):
    request_ids: list[str]


class Shutdown(msgspec.Struct, tag=True):
    pass


ReplicaInput = StartThinker | StartTalker | FeedText | DecodeChunk | AbortRequests | Shutdown


# ---- replica → orchestrator -------------------------------------------------------------------
class ReplicaLoad(msgspec.Struct, frozen=True):
    waiting: int = 0
    running: int = 0
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    kv_block_bytes: int = 0  # one block over all layers; the pool's bytes = (total + null block) * this


class ThinkerTokens(msgspec.Struct, tag=True):
    """New thinker tokens; the first message of a capturing request carries ``mm_hidden``."""

    request_id: str
    token_ids: list[int]
    finished: bool = False
    finish_reason: str | None = None
    num_prompt_tokens: int = 0
    mm_hidden: torch.Tensor | None = None
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache (their prefill skipped)
    logprobs: list[TokenLogprob] | None = None  # one per token, when the request asked


class TalkerFrames(msgspec.Struct, tag=True):
    """Codec frames ``[n, G]`` (codec EOS frames excluded); ``finished`` after the request's last one."""

    request_id: str
    frames: torch.Tensor
    finished: bool = False
    finish_reason: str | None = None


class AudioChunk(msgspec.Struct, tag=True):
    request_id: str
    chunk_index: int
    wav: torch.Tensor  # float32 mono samples at 24 kHz
    is_last: bool = False
    busy_s: float = 0.0  # this chunk's share of the vocoder step that made it (admission measures load)


class RequestFailed(msgspec.Struct, tag=True):
    request_id: str
    error: str


StageOutput = ThinkerTokens | TalkerFrames | AudioChunk | RequestFailed


class StepBatch(msgspec.Struct, tag=True):
    """Everything one pass of a replica's loop produced, with its load after the pass."""

    outputs: list[StageOutput]
    load: ReplicaLoad


class ReplicaReady(msgspec.Struct, tag=True):
    load: ReplicaLoad
    pid: int
    # False when the replica runs on another machine (Ray): tensors for it must travel in the message
    # frames, since it cannot map this machine's shared memory.
    same_host: bool = True


class Heartbeat(msgspec.Struct, tag=True):
    """The replica's engine loop is turning (sent when it had nothing else to send for a while)."""

    passes: int  # loop passes so far


class ReplicaFailed(msgspec.Struct, tag=True):
    """The replica cannot go on (load failure, crashed loop); it exits after sending this."""

    error: str


ReplicaMessage = StepBatch | ReplicaReady | ReplicaFailed | Heartbeat
