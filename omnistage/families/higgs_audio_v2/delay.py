"""Higgs Audio v2's staircase over 8 codebooks, as transformers' generation applies it.

Generating (``HiggsAudioV2DelayPatternLogitsProcessor`` and ``_sample``): after the prompt's audio BOS, codebook k
is held at the stream BOS for its first k + 1 frames; once any codebook samples the stream EOS, the text stream
switches to the delay token and each codebook in turn is held at EOS (codebook k k + 1 frames later), until a
frame is all EOS: the utterance ends there (that frame is no audio). A frame's codebook k describes the time k + 1
frames earlier, so the codec edge de-delays with ``HiggsConfig.delays``.

Prompting with audio (the processor's ``build_delay_pattern``): a voice's codes ``[G, n]`` with a BOS column before
and an EOS column after, codebook k shifted k frames: ``n + 2 + G - 1`` frames, under ``n + 2`` audio tokens and
``G - 1`` delay tokens.
"""

from __future__ import annotations

import torch

from omnistage.families.higgs_audio_v2.config import HiggsConfig


class DelayRule:
    """One utterance's markers state; :meth:`constrain` before each frame is sampled, :meth:`advance` after. Kept
    in Python ints: most frames hold no codebook, and those cost no tensor op."""

    def __init__(self, cfg: HiggsConfig, prompt_ids: torch.Tensor) -> None:
        self.cfg = cfg
        delays = list(cfg.delays)
        window = prompt_ids[-len(delays):].tolist()
        self.bos_left = self._from(delays, window, cfg.audio_bos_token_id, missing=[0] * len(delays))
        self.eos_left = self._from(delays, window, cfg.audio_delay_token_id, missing=delays)
        self.last_id = int(prompt_ids[-1])
        self._holds = True  # whether a later frame may still hold a codebook (False: constrain is a no-op)

    @staticmethod
    def _from(delays: list[int], window: list[int], token: int, missing: list[int]) -> list[int]:
        if token not in window:
            return list(missing)
        shift = len(delays) - window.index(token)
        return [d - shift for d in delays]

    def may_hold(self) -> bool:
        """Whether :meth:`constrain` may force a codebook this frame (False on most frames: every BOS hold is over
        and no EOS one has begun); a frame it says False for needs no call."""
        return self._holds or self.last_id == self.cfg.audio_delay_token_id

    def constrain(self, scores: torch.Tensor) -> torch.Tensor:
        """``[G, V]`` logits with the held codebooks forced to their marker (in place); call once per frame."""
        cfg = self.cfg
        if not self.may_hold():
            return scores
        bos_rows = [k for k, left in enumerate(self.bos_left) if left >= 0]
        self.bos_left = [left - 1 if left >= 0 else left for left in self.bos_left]
        if self.last_id == cfg.audio_delay_token_id:
            self.eos_left = [left - 1 for left in self.eos_left]
        eos_rows = [k for k, left in enumerate(self.eos_left) if left <= 0]
        # BOS holds only count down, and EOS ones move only after the delay token (which stays once it came)
        self._holds = any(left >= 0 for left in self.bos_left) or any(left <= 0 for left in self.eos_left)
        for rows, marker in ((bos_rows, cfg.audio_stream_bos_id), (eos_rows, cfg.audio_stream_eos_id)):
            if rows:
                kept = scores[rows, marker].clone()
                scores[rows] = float("-inf")
                scores[rows, marker] = kept
        return scores

    def advance(self, any_eos: bool, all_eos: bool) -> bool:
        """After a frame was sampled (whether any / every codebook is at the stream EOS): whether it ends the
        utterance."""
        cfg = self.cfg
        if all_eos:
            self.last_id = cfg.eos_token_id
            return True
        delayed = any_eos or self.last_id == cfg.audio_delay_token_id
        self.last_id = cfg.audio_delay_token_id if delayed else cfg.audio_token_id
        return False


def delayed_voice(codes: torch.Tensor, cfg: HiggsConfig) -> torch.Tensor:
    """A voice's codes ``[G, n]`` -> prompt frames ``[n + 2 + G - 1, G]`` under the staircase, markers included."""
    groups, n = codes.shape
    framed = torch.cat([codes.new_full((groups, 1), cfg.audio_stream_bos_id), codes.long(),
                        codes.new_full((groups, 1), cfg.audio_stream_eos_id)], dim=1)
    out = torch.full((groups, n + 2 + groups - 1), cfg.audio_stream_bos_id, dtype=torch.long)
    for k in range(groups):
        out[k, k:k + n + 2] = framed[k]
        out[k, k + n + 2:] = cfg.audio_stream_eos_id
    return out.T.contiguous()


def undelay(rows: torch.Tensor, delays: tuple[int, ...]) -> torch.Tensor:
    """Generated rows ``[n, G]`` (the all-BOS first row included) -> aligned frames ``[n - max(delays), G]``,
    as the reference's ``revert_delay_pattern`` after its first row (whole utterances; streams de-delay in the
    codec edge)."""
    count = rows.shape[0] - max(delays)
    if count <= 0:
        return rows[:0]
    return torch.stack([rows[d:d + count, k] for k, d in enumerate(delays)], dim=1)
