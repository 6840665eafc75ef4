"""Thinker → talker: the talker's prompt and its per-step trailing text, as transformers builds them.

Pure functions over token ids and tensors, so the same code serves the offline
``verify`` path and the streaming pipeline. What the talker reads from the
thinker (``Qwen3OmniMoeForConditionalGeneration.generate``):

* user turns (every token whose turn role is ``user``, from its ``<|im_start|>``
  to the next one): text rows through ``text_projection(thinker embedding)``,
  audio/image/video rows through ``hidden_projection(thinker accept-layer hidden)``;
* the assistant turn: ``[im_start, assistant, \\n]`` projected, 4 × tts_pad,
  tts_bos, then the first generated token — added to a codec track of 3 zero
  rows and the embeddings of ``[nothink, think_bos, think_eos, speaker, pad, bos]``;
* trailing text, one row per talker step: generated tokens ``1 .. n-2`` (the last
  generated token is never fed back to the thinker, so transformers never sees
  its embedding), then tts_eos, then tts_pad forever.

Text rows only need the thinker's *embedding table*, so the thinker sends just
its accept-layer hidden states at multimodal rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from omnistage.models.qwen3_omni.config import TalkerTokenIds

Projection = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class TalkerProjections:
    """The talker-side modules the transform applies (all batched over rows)."""

    thinker_embed: Callable[[torch.Tensor], torch.Tensor]  # token ids → thinker embeddings
    text_projection: Projection
    hidden_projection: Projection
    codec_embed: Callable[[torch.Tensor], torch.Tensor]  # codec ids → talker embeddings


@dataclass(frozen=True)
class TalkerPrompt:
    embeds: torch.Tensor  # [P, H_talker]
    input_ids: list[int]  # [P] what transformers passes as talker_input_ids (for M-RoPE)
    tts_pad_embed: torch.Tensor  # [H_talker]
    tts_eos_embed: torch.Tensor  # [H_talker]
    user_rows: list[int] = field(default_factory=list)  # the thinker position of each leading user-turn row


def user_positions(prompt_ids: Sequence[int], ids: TalkerTokenIds) -> list[int]:
    """Rows of the prompt that lie in user turns (role = the token after the latest <|im_start|>)."""
    rows, role = [], None
    for i, tok in enumerate(prompt_ids):
        if tok == ids.im_start:
            role = prompt_ids[i + 1] if i + 1 < len(prompt_ids) else None
        if role == ids.user:
            rows.append(i)
    return rows


def assistant_start(prompt_ids: Sequence[int], ids: TalkerTokenIds) -> int:
    for i in range(len(prompt_ids) - 2, -1, -1):
        if prompt_ids[i] == ids.im_start and prompt_ids[i + 1] == ids.assistant:
            return i
    raise ValueError("the prompt has no '<|im_start|>assistant' turn to speak")


def build_talker_prompt(
    prompt_ids: Sequence[int],
    mm_hidden: torch.Tensor,
    first_token: int,
    speaker: int,
    ids: TalkerTokenIds,
    proj: TalkerProjections,
) -> TalkerPrompt:
    """The talker's prefill embeddings once the thinker has produced its first token.

    ``mm_hidden`` holds the thinker's accept-layer hidden states at the prompt's
    multimodal rows, in prompt order (``[M, H_thinker]``, M may be 0).
    """
    user_rows = user_positions(prompt_ids, ids)
    start = assistant_start(prompt_ids, ids)
    device = mm_hidden.device
    user_ids = torch.tensor([prompt_ids[r] for r in user_rows], dtype=torch.long, device=device)
    user_embeds = _user_part(prompt_ids, user_rows, user_ids, mm_hidden, ids, proj)
    special = proj.text_projection(proj.thinker_embed(torch.tensor([ids.tts_bos, ids.tts_eos, ids.tts_pad],
                                                                   device=device)))
    tts_bos, tts_eos, tts_pad = special[0], special[1], special[2]
    head_ids = torch.tensor(list(prompt_ids[start:start + 3]) + [first_token], device=device)
    head = proj.text_projection(proj.thinker_embed(head_ids))
    text_track = torch.cat([head[:3], tts_pad.expand(4, -1), tts_bos[None], head[3:4]])
    codec_ids = torch.tensor([*ids.codec_prefix, speaker, ids.codec_pad, ids.codec_bos], device=device)
    codec = proj.codec_embed(codec_ids)
    codec_track = torch.cat([codec.new_zeros(3, codec.shape[-1]), codec])
    embeds = torch.cat([user_embeds, text_track + codec_track])
    input_ids = user_ids.tolist() + [ids.tts_pad] * text_track.shape[0]
    return TalkerPrompt(embeds=embeds, input_ids=input_ids, tts_pad_embed=tts_pad, tts_eos_embed=tts_eos,
                        user_rows=user_rows)


def _user_part(
    prompt_ids: Sequence[int],
    user_rows: list[int],
    user_ids: torch.Tensor,
    mm_hidden: torch.Tensor,
    ids: TalkerTokenIds,
    proj: TalkerProjections,
) -> torch.Tensor:
    is_mm = torch.tensor([prompt_ids[r] in ids.multimodal for r in user_rows], dtype=torch.bool,
                         device=user_ids.device)
    mm_before_user = _mm_rank_of_user_rows(prompt_ids, user_rows, ids)
    text = proj.text_projection(proj.thinker_embed(user_ids[~is_mm]))
    out = text.new_empty(len(user_rows), text.shape[-1])
    out[~is_mm] = text
    if bool(is_mm.any()):
        out[is_mm] = proj.hidden_projection(mm_hidden[mm_before_user]).to(out.dtype)
    return out


def _mm_rank_of_user_rows(prompt_ids: Sequence[int], user_rows: list[int], ids: TalkerTokenIds) -> list[int]:
    """For each multimodal user row, its index among all multimodal rows of the prompt."""
    rank, ranks, user = 0, [], set(user_rows)
    for i, tok in enumerate(prompt_ids):
        if tok in ids.multimodal:
            if i in user:
                ranks.append(rank)
            rank += 1
    return ranks


class TrailingText:
    """The talker's per-step text row, fed as the thinker's tokens arrive.

    Row ``j`` is the projected embedding of generated token ``j + 1`` — known to
    be final only once token ``j + 2`` exists (transformers never embeds the
    last generated token). After the thinker finishes: tts_eos, then tts_pad.
    ``row(j)`` returns None while the row is not yet decided: the talker waits.
    """

    def __init__(self, prompt: TalkerPrompt, proj: TalkerProjections) -> None:
        self._proj = proj
        self._eos, self._pad = prompt.tts_eos_embed, prompt.tts_pad_embed
        self._tokens: list[int] = []
        self._rows: list[torch.Tensor] = []
        self._finished = False

    def extend(self, generated: Sequence[int]) -> None:
        """Adds newly generated thinker tokens (including the first)."""
        self._tokens.extend(generated)
        ready = max(len(self._tokens) - 2, 0)  # rows 0 .. n-3 are final while more may follow
        if ready > len(self._rows):
            ids = torch.tensor(self._tokens[1 + len(self._rows):1 + ready], device=self._eos.device)
            self._rows.extend(self._proj.text_projection(self._proj.thinker_embed(ids)).unbind(0))

    def finish(self) -> None:
        self._finished = True

    @property
    def finished(self) -> bool:
        return self._finished

    def row(self, step: int) -> torch.Tensor | None:
        if step < len(self._rows):
            return self._rows[step]
        if not self._finished:
            return None
        return self._eos if step == len(self._rows) else self._pad
