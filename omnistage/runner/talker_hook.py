"""The talker's step: a whole codec frame per request per step, fed back with trailing text.

After codebook 0 is sampled for every running request, the code predictor
fills in the residual codebooks for all of them at once. Generated position
``j`` is then fed as ``frame_embedding(codes_j) + trailing_text_j``, where the
trailing text streams in from the thinker: a request whose next text entry
has not arrived waits (unless the thinker finished, then ``tts_pad`` is used).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from omnistage.engine.request import Request
from omnistage.engine.config import EngineConfig
from omnistage.runner.base import TalkerModel
from omnistage.runner.predictor_graph import PredictorGraphs
from omnistage.runner.sampler import Sampler, SamplingBatch
from omnistage.runner.step_hook import OutputSpan, StepHook


@dataclass
class TalkerRequestData:
    """Per-request talker state, set as ``Request.stage_data``; the pipeline feeds it text."""

    tts_pad_embed: torch.Tensor  # [H], fed once the thinker's text ran out
    trailing_text: list[torch.Tensor] = field(default_factory=list)  # [H] each, one per talker step
    text_finished: bool = False
    frames: list[torch.Tensor] = field(default_factory=list)  # codes [G] of each generated frame

    def add_text(self, embeds: torch.Tensor) -> None:
        """Appends trailing text embeddings ``[K, H]`` (the thinker produced K more tokens)."""
        self.trailing_text.extend(embeds.unbind(0))

    def finish_text(self) -> None:
        self.text_finished = True

    def text_at(self, step: int) -> torch.Tensor | None:
        if step < len(self.trailing_text):
            return self.trailing_text[step]
        return self.tts_pad_embed if self.text_finished else None


def talker_suppress_mask(vocab_size: int, codec_eos_id: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Bool ``[V]``: the top 1024 ids hold codec specials, never sampled except codec EOS."""
    mask = torch.zeros(vocab_size, dtype=torch.bool, device=device)
    mask[max(vocab_size - 1024, 0):] = True
    mask[codec_eos_id] = False
    return mask


def talker_data(request: Request) -> TalkerRequestData:
    """A talker request's state (any family's: its stage feeds the trailing text through it)."""
    data = request.stage_data
    if not isinstance(data, TalkerRequestData):
        raise TypeError(f"talker request {request.request_id!r} needs TalkerRequestData as stage_data")
    return data


class TalkerStepHook(StepHook):
    feeds_output_embeds = True

    def __init__(self, model: TalkerModel, suppress_mask: torch.Tensor | None = None) -> None:
        self.model = model
        self.suppress_mask = suppress_mask
        self.graphs: PredictorGraphs | None = None

    def bind(self, config: EngineConfig) -> None:
        """On CUDA, captures the code predictor's loop as one graph per batch bucket."""
        device = torch.device(config.device)
        if device.type == "cuda" and not config.enforce_eager and config.cuda_graph_max_batch > 0:
            max_batch = min(config.cuda_graph_max_batch, config.max_num_seqs)
            self.graphs, outcome = PredictorGraphs.try_capture(self.model, max_batch, device, config.dtype)
            self.capture_outcomes = (outcome,)

    def is_ready(self, request: Request) -> bool:
        n = request.num_output_tokens
        # The newest frame is fed next; it needs its trailing-text entry (or the thinker to be done).
        return n == 0 or talker_data(request).text_at(n - 1) is not None

    def output_embeds(self, spans: list[OutputSpan]) -> torch.Tensor:
        codes: list[torch.Tensor] = []
        texts: list[torch.Tensor] = []
        for span in spans:
            data = talker_data(span.request)
            codes.extend(data.frames[span.start:span.end])
            for j in range(span.start, span.end):
                text = data.text_at(j)
                if text is None:
                    raise RuntimeError(f"{span.request.request_id}: trailing text {j} fed before it arrived")
                texts.append(text)
        frames = self.model.frame_embedding(torch.stack(codes))
        return frames + torch.stack(texts).to(device=frames.device, dtype=frames.dtype)

    def process_logits(self, logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
        if self.suppress_mask is not None:
            if self.suppress_mask.device != logits.device:  # moved once, not every step
                self.suppress_mask = self.suppress_mask.to(logits.device)
            logits.masked_fill_(self.suppress_mask, float("-inf"))
        return logits

    def on_sampled(
        self, hidden_last: torch.Tensor, token_ids: torch.Tensor, requests: list[Request], sampler: Sampler,
        sampling: SamplingBatch,
    ) -> torch.Tensor:
        if self.graphs is not None and self.graphs.can_run(sampling):
            codes = self.graphs.run(hidden_last, token_ids, sampler, sampling)
        else:
            residual = sampler.residual(sampling, self.model.num_code_groups - 1, self.model.residual_vocab_size,
                                        hidden_last.device)
            codes = self.model.predict_residual_codes(hidden_last, token_ids, residual)
        # Kept on the device (fed back next step); the caller gets one host copy.
        for i, request in enumerate(requests):
            talker_data(request).frames.append(codes[i])
        return codes.cpu()
