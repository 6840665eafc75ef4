"""Moshi's duplex step over many sessions: one user frame in, the agent's text token and one frame out, per row.

Moshi reads frame *columns*, transformers' layout: column 0 holds the initial tokens; column ``c`` holds frame
``c-1``'s text token and semantic codes (agent's and user's) and frame ``c-2``'s acoustic codes (the acoustic
codebooks lag one step). The step that reads column ``c`` picks frame ``c``'s text token and semantic agent code,
and frame ``c-1``'s acoustic agent codes, which completes agent frame ``c-1``: a session's audio is one frame
behind its text. The user frame that arrives with that step is frame ``c``.

A session's prompt (PersonaPlex's voice and text prompts, or verify's forced frames) is a run of frames whose
every token is given: its columns are known ahead, so it is one prefill, and the frame after it is generated.

Live sessions are rows ``0..n-1`` of every state tensor and of the :class:`RingCache` (a closed session's row is
filled by the last one), so a tick's batch is a view.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from omnistage.families.moshi.config import MoshiConfig
from omnistage.families.moshi.model import DuplexSampling, MoshiLM, chooser
from omnistage.families.moshi.ring_cache import RingCache


@dataclass(frozen=True)
class ForcedFrames:
    """Frames whose every token is given: ``text`` [F], ``agent`` [F, K], ``user`` [F, K]."""

    text: torch.Tensor
    agent: torch.Tensor
    user: torch.Tensor

    def __len__(self) -> int:
        return int(self.text.shape[0])


@dataclass(frozen=True)
class StepOutput:
    """One tick's rows: ``text`` [B], ``frames`` [B, K] (agent frame ``c-1``), ``complete`` [B] (False where
    the row's frame is not a generated one yet: its first step, or the step after its prompt)."""

    text: torch.Tensor
    frames: torch.Tensor
    complete: torch.Tensor


class MoshiStreams:
    """The per-row column state and the batched step (rows ``0..n-1`` live)."""

    def __init__(self, model: MoshiLM, max_rows: int, sampling: DuplexSampling = DuplexSampling(),
                 window: int | None = None) -> None:
        cfg: MoshiConfig = model.cfg
        self.model, self.cfg, self.k = model, cfg, cfg.num_codebooks
        p = next(model.parameters())
        self.cache = RingCache(max_rows, cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, window or cfg.context,
                               dtype=p.dtype, device=p.device)
        long = {"dtype": torch.long, "device": p.device}
        self.text_in = torch.zeros(max_rows, **long)
        self.agent_in = torch.zeros(max_rows, self.k, **long)
        self.user_in = torch.zeros(max_rows, self.k, **long)
        self.user_acoustic = torch.zeros(max_rows, self.k - 1, **long)
        self.pending = torch.zeros(max_rows, **long)  # agent frame c-1's semantic code, awaiting its acoustics
        self.forced_acoustic = torch.full((max_rows, self.k - 1), -1, **long)  # a prompt's last frame's
        self.pos = torch.zeros(max_rows, **long)
        generator = torch.Generator(device=p.device).manual_seed(sampling.seed)
        self.choose_text = chooser(sampling.text_temperature, sampling.text_top_k, generator)
        self.choose_audio = chooser(sampling.audio_temperature, sampling.audio_top_k, generator)
        self.rows = 0

    @property
    def max_rows(self) -> int:
        return self.cache.rows

    def open(self, prompt: ForcedFrames | None = None) -> int:
        """A new session in row ``rows``; its prompt prefilled. Returns the row."""
        if self.rows >= self.max_rows:
            raise RuntimeError(f"all {self.max_rows} duplex rows are taken")
        row, cfg = self.rows, self.cfg
        self.rows += 1
        self.cache.clear(row)
        self.text_in[row] = cfg.text_initial_id
        self.agent_in[row] = cfg.audio_initial_id
        self.user_in[row] = cfg.audio_initial_id
        self.user_acoustic[row] = cfg.audio_initial_id
        self.forced_acoustic[row] = -1
        self.pos[row] = 0
        if prompt is not None and len(prompt):
            self._prefill(row, prompt)
        return row

    def close(self, row: int) -> int | None:
        """Frees ``row``; the last live row moves into it. Returns the row that moved (its new row is ``row``)."""
        last = self.rows - 1
        self.rows -= 1
        if row == last:
            self.cache.clear(row)
            return None
        self.cache.move(last, row)
        for t in (self.text_in, self.agent_in, self.user_in, self.user_acoustic, self.pending,
                  self.forced_acoustic, self.pos):
            t[row] = t[last]
        return last

    @torch.inference_mode()
    def step(self, user: torch.Tensor) -> StepOutput:
        """One column for every live row; ``user`` [n, K] is each row's arriving user frame."""
        n = self.rows
        audio = torch.cat([self.agent_in[:n], self.user_in[:n]], dim=1)[:, :, None]
        x = self.model.embed(self.text_in[:n, None], audio)
        hidden = self.model.decoder.step(x, self.pos[:n], self.cache)[:, 0]
        text = self.choose_text(self.model.decoder.text_logits(hidden), 0)
        codes = self.model.depth_decoder.codes(hidden, text, self.k, self.choose_audio)
        first = self.pos[:n] == 0
        forced = self.forced_acoustic[:n, 0] >= 0
        acoustic = torch.where(first[:, None], self.cfg.audio_initial_id, codes[:, 1:])
        acoustic = torch.where(forced[:, None], self.forced_acoustic[:n], acoustic)
        frames = torch.cat([self.pending[:n, None], acoustic], dim=1)
        out = StepOutput(text, frames, ~(first | forced))
        self._advance(n, text, codes[:, 0], acoustic, user)
        return out

    def _advance(self, n: int, text: torch.Tensor, semantic: torch.Tensor, acoustic: torch.Tensor,
                 user: torch.Tensor) -> None:
        self.text_in[:n] = text
        self.agent_in[:n, 0] = semantic
        self.agent_in[:n, 1:] = acoustic
        self.pending[:n] = semantic
        self.forced_acoustic[:n] = -1
        self.user_in[:n, 0] = user[:, 0]
        self.user_in[:n, 1:] = self.user_acoustic[:n]
        self.user_acoustic[:n] = user[:, 1:]
        self.pos[:n] += 1

    @torch.inference_mode()
    def _prefill(self, row: int, prompt: ForcedFrames) -> None:
        """The prompt's columns ``0..F-1`` in one pass; the state then reads column ``F``."""
        cfg, f = self.cfg, len(prompt)
        text = torch.cat([torch.tensor([cfg.text_initial_id]), prompt.text[:-1]])
        agent = _columns(prompt.agent, cfg.audio_initial_id)[:f]
        user = _columns(prompt.user, cfg.audio_initial_id)[:f]
        x = self.model.embed(text[None], torch.cat([agent, user], dim=1).T[None])
        self.model.decoder.prefill(x, row, 0, self.cache)
        self.text_in[row] = prompt.text[-1]
        self.agent_in[row] = _columns(prompt.agent, cfg.audio_initial_id)[f]
        self.user_in[row] = _columns(prompt.user, cfg.audio_initial_id)[f]
        self.user_acoustic[row] = prompt.user[-1, 1:]
        self.pending[row] = prompt.agent[-1, 0]
        self.forced_acoustic[row] = prompt.agent[-1, 1:]
        self.pos[row] = f


def _columns(frames: torch.Tensor, initial: int) -> torch.Tensor:
    """Frames [F, K] as columns [F + 1, K]: column ``c`` holds frame ``c-1``'s semantic code and frame ``c-2``'s
    acoustic ones (the initial token where there is no such frame)."""
    f, k = frames.shape
    cols = torch.full((f + 1, k), initial, dtype=torch.long)
    cols[1:, 0] = frames[:, 0]
    cols[2:, 1:] = frames[:-1, 1:]
    return cols
