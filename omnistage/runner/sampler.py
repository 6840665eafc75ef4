"""Batched sampling: penalties, temperature, top-k/top-p and seeded draws on ``[N, V]`` tensors.

Random choice uses the exponential race (``argmax(p / E)``, ``E ~ Exp(1)``),
which samples exactly from ``p``. Each seeded request fills its own noise row
from its own generator, so its draws depend on nothing else in the batch;
the argmax over all rows is then one batched op.

One request's settings must never break the batch: a row whose logits become
NaN or +inf, or all -inf (a penalty or temperature out of range, a model that
overflowed on its input), is reported in :class:`SampledTokens` ``bad`` and
given a harmless token, so the engine fails that request alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class SamplingBatch:
    """Settings of the rows being sampled this step, one row per request.

    temperature: [N]; 0 = greedy. top_k: [N] long, 0 = off. top_p: [N], 1 = off.
    repetition_penalty / seen: [N] and bool [N, V], or None when no row penalises.
    presence_penalty / frequency_penalty / counts: [N], [N] and float [N, V] generated-token counts (OpenAI's
        penalties), or None when no row uses them.
    logprob_rows / max_logprobs: the rows that report log-probabilities, and the most alternatives any asks for.
    generators: each row's seeded generator, or None to use the shared one.
    banned: (row, ids) pairs masked to -inf (EOS/stop ids before min_tokens).
    """

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    generators: list[torch.Generator | None]
    all_greedy: bool
    any_greedy: bool
    needs_sort: bool
    repetition_penalty: torch.Tensor | None = None
    seen: torch.Tensor | None = None
    banned: tuple[tuple[int, tuple[int, ...]], ...] = ()
    presence_penalty: torch.Tensor | None = None
    frequency_penalty: torch.Tensor | None = None
    counts: torch.Tensor | None = None
    logprob_rows: tuple[int, ...] = ()
    max_logprobs: int = 0
    # Host-side facts that let top-k alone skip the full sort: the largest k of any row (0 = some row is
    # unrestricted... only used when no row uses top-p) and whether any row uses top-p; None = unknown.
    max_top_k: int | None = None
    any_top_p: bool | None = None
    all_top_k: bool | None = None  # every sampled (non-greedy) row has a top-k; None = unknown


@dataclass
class SampledTokens:
    """token_ids: [N] long. bad: [N] bool, rows whose logits were not usable (NaN, +inf, or nothing finite):
    their token is a placeholder (0) the caller must not use as an answer."""

    token_ids: torch.Tensor
    bad: torch.Tensor
    logprobs: RowLogprobs | None = None


@dataclass
class RowLogprobs:
    """For ``SamplingBatch.logprob_rows`` in order: the sampled token's log-probability ``[R]`` and the
    ``max_logprobs`` best ``(ids, logprobs)`` ``[R, k]``, from the raw logits (log-softmax, before penalties and
    temperature: what vLLM reports by default)."""

    rows: tuple[int, ...]
    sampled: torch.Tensor
    top_ids: torch.Tensor
    top_logprobs: torch.Tensor


def row_logprobs(raw: torch.Tensor, token_ids: torch.Tensor, rows: tuple[int, ...], k: int) -> RowLogprobs:
    index = torch.tensor(rows, dtype=torch.int64, device=raw.device)
    logp = raw.index_select(0, index).log_softmax(dim=-1)
    sampled = logp.gather(1, token_ids.index_select(0, index)[:, None])[:, 0]
    top = logp.topk(min(k, logp.shape[-1]), dim=-1) if k > 0 else None
    empty = logp.new_zeros(len(rows), 0)
    return RowLogprobs(rows, sampled, top.indices if top is not None else empty.long(),
                       top.values if top is not None else empty)


def unusable_rows(logits: torch.Tensor) -> torch.Tensor:
    """[N] bool: rows with a NaN or +inf, or no finite logit at all. One reduction: ``amax`` carries a NaN
    through, is +inf when any entry is, and -inf only when every entry is (masked tokens are -inf, but the
    best token always survives masking)."""
    return ~torch.isfinite(logits.amax(dim=-1))


def apply_penalties(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """Returns new logits (the caller's tensor is left alone)."""
    fresh = False
    if batch.seen is not None and batch.repetition_penalty is not None:
        penalty = batch.repetition_penalty[:, None]
        penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
        logits, fresh = torch.where(batch.seen, penalised, logits), True
    if batch.counts is not None and batch.presence_penalty is not None and batch.frequency_penalty is not None:
        # OpenAI's rule: logit - frequency * count - presence * (count > 0), per generated token.
        present = (batch.counts > 0).to(logits.dtype)
        logits = logits - batch.frequency_penalty[:, None] * batch.counts - batch.presence_penalty[:, None] * present
        fresh = True
    if batch.banned and not fresh:
        logits = logits.clone()
    for row, ids in batch.banned:
        logits[row, list(ids)] = float("-inf")
    return logits


def apply_top_k_top_p_within(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor | None,
                             max_k: int) -> torch.Tensor:
    """:func:`apply_top_k_top_p` from one ``topk`` of width ``max_k`` instead of a sort of the vocabulary (a
    talker's 8,448 or a thinker's 151,936 entries a row, every step): each row is masked below its smallest
    surviving logit. Rows with k = 0 stay whole. ``top_p`` None is top-k alone; with a ``top_p``, rows with k = 0
    must be greedy ones (whose mask the caller ignores), for the nucleus lies within the top k. The same rule,
    summed in the same order: a candidate goes when the mass at or below it is at most ``1 - top_p``; the best
    always stays. Ties with the k-th logit survive as on the sort path (they sit at the threshold), though the
    sort path also counts them in the nucleus's mass."""
    max_k = min(max_k, logits.shape[-1])
    best = logits.topk(max_k, dim=-1).values  # [N, max_k], descending
    k = torch.where(top_k > 0, top_k, max_k).clamp(max=max_k)
    if top_p is None:
        threshold = best.gather(1, (k - 1)[:, None])
    else:
        ranks = torch.arange(max_k, device=logits.device)
        candidates = best.masked_fill(ranks >= k[:, None], float("-inf"))
        below = candidates.softmax(dim=-1).flip(-1).cumsum(dim=-1).flip(-1)
        drop = below <= (1.0 - top_p)[:, None]
        drop[:, 0] = False
        threshold = candidates.masked_fill(drop, float("inf")).amin(dim=-1, keepdim=True)
    threshold = torch.where(top_k[:, None] > 0, threshold, float("-inf"))
    return logits.masked_fill(logits < threshold, float("-inf"))


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Masks each row to its own top-k and nucleus (one sort for the whole batch)."""
    vocab = logits.shape[-1]
    sorted_logits, order = logits.sort(dim=-1, descending=False)
    k = torch.where(top_k > 0, top_k, vocab).clamp(max=vocab)
    kth = sorted_logits.gather(1, (vocab - k)[:, None])
    sorted_logits.masked_fill_(sorted_logits < kth, float("-inf"))
    cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    drop = cum <= (1.0 - top_p)[:, None]
    drop[:, -1] = False  # the best token always survives
    sorted_logits.masked_fill_(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


class Sampler:
    def __init__(self) -> None:
        # Noise buffers reused across steps, one per (device, vocabulary width).
        self._noise: dict[tuple[str, int], torch.Tensor] = {}

    def sample(self, logits: torch.Tensor, batch: SamplingBatch, penalties: bool = True) -> torch.Tensor:
        """logits ``[N, V]`` → sampled ids ``[N]`` (long)."""
        return self.sample_checked(logits, batch, penalties).token_ids

    def sample_checked(self, logits: torch.Tensor, batch: SamplingBatch, penalties: bool = True) -> SampledTokens:
        """Like :meth:`sample`, also saying which rows could not be sampled (their ids are 0)."""
        raw = logits = logits.float()
        if penalties:
            logits = apply_penalties(logits, batch)
        bad = unusable_rows(logits)
        if batch.all_greedy:
            sampled = logits.argmax(dim=-1).masked_fill(bad, 0)
        else:
            noise = self._draw_noise((logits.shape[0],), logits.shape[-1], logits.device, batch.generators)[0]
            sampled, overflowed = race(logits, batch, noise)
            bad = bad | overflowed
            sampled = sampled.masked_fill(bad, 0)
        logprobs = row_logprobs(raw, sampled, batch.logprob_rows, batch.max_logprobs) if batch.logprob_rows else None
        return SampledTokens(sampled, bad, logprobs)

    def residual(self, batch: SamplingBatch, steps: int, vocab: int, device: torch.device,
                 whole_vocab: bool = False) -> ResidualSampling:
        """The code predictor's sampling of ``steps`` residual codebooks for the rows of ``batch``: each row's
        settings, and its noise for every step drawn now from its own generator, so the predictor's loop is
        tensors only (no generator calls, no host syncs) and can be captured in a CUDA graph.

        When every sampled row keeps only its top k (the talkers' default, k = 50 of 2048), noise is drawn for
        the largest k alone and the race runs among those candidates (:func:`race_top_k`): per talker step that
        is ``steps x N x k`` draws instead of ``steps x N x vocab``, which on a CPU cost more than a predictor
        pass. ``whole_vocab`` keeps one noise value per token (a captured graph's fixed buffer)."""
        if batch.all_greedy:
            return ResidualSampling(batch, None)
        width = vocab
        if not whole_vocab and batch.any_top_p is False and batch.all_top_k and batch.max_top_k:
            width = min(batch.max_top_k, vocab)
        return ResidualSampling(batch, self._draw_noise((steps, len(batch.generators)), width, device,
                                                        batch.generators))

    def _draw_noise(
        self, lead: tuple[int, ...], vocab: int, device: torch.device, generators: list[torch.Generator | None]
    ) -> torch.Tensor:
        """Exp(1) noise ``[*lead, vocab]`` whose last lead axis is the batch row; seeded rows draw from their own
        generator (a row's draws depend on nothing else in the batch)."""
        n = lead[-1]
        key = (str(device), vocab, len(lead))
        buf = self._noise.get(key)
        if buf is None or buf.shape[-2] < n or buf.shape[:-2] != lead[:-1]:
            buf = torch.empty(*lead[:-1], max(n, 8), vocab, device=device)
            self._noise[key] = buf
        noise = buf[..., :n, :]
        seeded = [(i, g) for i, g in enumerate(generators) if g is not None]
        if len(seeded) < n:
            noise.exponential_()
        for i, gen in seeded:
            noise[..., i, :].exponential_(generator=gen)
        return noise if len(lead) > 1 else noise[None]


def race(logits: torch.Tensor, batch: SamplingBatch, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Samples float32 ``logits [N, V]`` with each row's temperature (0 = greedy), top-k and top-p by the
    exponential race over ``noise [N, V]``. Tensors only: no host sync, no generator call. Also returns the rows a
    tiny temperature overflowed (finite before scaling, not after; greedy rows ignore scaling)."""
    greedy = logits.argmax(dim=-1)
    temperature = torch.where(batch.temperature > 0, batch.temperature, 1.0)
    scaled = logits / temperature[:, None]
    if batch.needs_sort:
        if batch.max_top_k and (batch.any_top_p is False or batch.all_top_k):
            top_p = None if batch.any_top_p is False else batch.top_p
            scaled = apply_top_k_top_p_within(scaled, batch.top_k, top_p, batch.max_top_k)
        else:
            scaled = apply_top_k_top_p(scaled, batch.top_k, batch.top_p)
    overflowed = unusable_rows(scaled) & (batch.temperature > 0)
    sampled = (scaled.softmax(dim=-1) / noise).argmax(dim=-1)
    if batch.any_greedy:
        sampled = torch.where(batch.temperature > 0, sampled, greedy)
    return sampled, overflowed


def race_top_k(logits: torch.Tensor, batch: SamplingBatch, noise: torch.Tensor) -> torch.Tensor:
    """:func:`race` for rows that all keep only their top k (no top-p), over ``noise [N, W]`` for the ``W`` best
    logits of each row (W = the largest k): the same distribution (each row's top k, renormalised at its
    temperature), raced among W candidates instead of the vocabulary. At a tie with the k-th logit this keeps
    exactly k where :func:`apply_top_k_top_p_within` keeps every tied token. Greedy rows take the best logit."""
    width = noise.shape[-1]
    best, ids = logits.topk(width, dim=-1)  # descending: temperature scaling keeps the order
    temperature = torch.where(batch.temperature > 0, batch.temperature, 1.0)
    ranks = torch.arange(width, device=logits.device)
    scaled = (best / temperature[:, None]).masked_fill(ranks >= batch.top_k[:, None], float("-inf"))
    pick = (scaled.softmax(dim=-1) / noise).argmax(dim=-1, keepdim=True)
    if batch.any_greedy:
        pick = torch.where(batch.temperature[:, None] > 0, pick, 0)
    return ids.gather(1, pick)[:, 0]


@dataclass
class ResidualSampling:
    """How the code predictor samples each residual codebook of N frames: the rows' settings and, unless every
    row is greedy, their noise ``[steps, N, V]`` drawn beforehand (``Sampler.residual``). A CUDA graph replays
    :meth:`sample` on the static buffers this object points to."""

    batch: SamplingBatch
    noise: torch.Tensor | None

    def sample(self, logits: torch.Tensor, step: int) -> torch.Tensor:
        """Residual logits ``[N, V]`` of codebook ``step + 1`` → ids ``[N]``."""
        logits = logits.float()
        if self.noise is None:
            return logits.argmax(dim=-1)
        # A non-finite row here belongs to a request whose codebook 0 already failed it (its hidden state is the
        # same); its codes are placeholders that request never delivers.
        noise = self.noise[step]
        if noise.shape[-1] < logits.shape[-1]:
            return race_top_k(logits, self.batch, noise)
        return race(logits, self.batch, noise)[0]
