"""A talker stage of any family: codec frames out, one whole frame per request per engine step.

The family's talker worker builds the engine and turns its inputs into engine requests; this base turns
engine outputs into :class:`CodecFrames`. Like transformers, a finished request's last frame is dropped (its
code 0 is codec EOS, or generation stopped at max tokens before its residual codes), unless the family's
:meth:`TalkerWorker.audio_frames` says otherwise.
"""

from __future__ import annotations

import torch

from omnistage.config.pipeline import StageSpec
from omnistage.engine import FinishReason, Request, RequestOutput
from omnistage.engine.step_profile import measure_decode_steps, profile_batches
from omnistage.ipc.messages import RequestFailed, StageOutput
from omnistage.ipc.payloads import CodecFrames
from omnistage.runner.talker_hook import TalkerRequestData
from omnistage.sampling_params import SamplingParams
from omnistage.workers.base import ARWorker, StepResult


def talker_frames(output: RequestOutput) -> torch.Tensor | None:
    """The frames of one talker output that become audio: a finished request's final frame is dropped."""
    frames = output.new_frames
    return frames[:-1] if frames is not None and output.finished else frames


PROBE_PROMPT_ROWS = 8


class TalkerWorker(ARWorker):
    num_groups: int  # codebooks per frame (set by the family's worker)
    profile_max_batch = 0  # the step profile's largest batch; 0 until :meth:`profile_with` (no profile)

    def profile_with(self, stage: StageSpec, like: torch.Tensor) -> None:
        """Turns the step profile on as the stage's settings say; ``like``: a tensor of the talker's width, device
        and dtype (its codec head's weight)."""
        self.profile_max_batch = min(stage.engine.step_profile_max_batch, stage.engine.max_num_seqs)
        self._probe_sampling = stage.sampling
        self._probe_row = like.new_zeros(like.shape[-1])

    def probe_request(self, request_id: str) -> Request:
        """A synthetic request decoding like a served one (the stage's sampling, a short prompt, its text already
        finished) that does not stop on its own: what the step profile times."""
        s = self._probe_sampling
        params = SamplingParams(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                                repetition_penalty=s.repetition_penalty, max_tokens=64, ignore_eos=True)
        data = TalkerRequestData(tts_pad_embed=self._probe_row, text_finished=True)
        prompt = self._probe_row.expand(PROBE_PROMPT_ROWS, -1).clone()
        return Request(request_id, None, params, prompt_embeds=prompt, stage_data=data)

    @torch.inference_mode()
    def step_profile(self) -> dict[int, float]:
        if self.profile_max_batch < 1:
            return {}
        return measure_decode_steps(self.engine, self.probe_request, profile_batches(self.profile_max_batch))

    def audio_frames(self, output: RequestOutput) -> torch.Tensor | None:
        """The frames of one engine output that become audio (a family whose talker's last frame is audio
        overrides this)."""
        return talker_frames(output)

    def step(self) -> StepResult:
        outputs: list[StageOutput | RequestFailed] = []
        for out in self.engine.step():
            if out.finish_reason is FinishReason.ERROR:
                outputs.append(self.failed(out))
                continue
            frames = self.audio_frames(out)
            if frames is None:
                frames = torch.empty(0, self.num_groups, dtype=torch.long)
            outputs.append(StageOutput(out.request_id, CodecFrames(frames), out.finished, out.finish_reason))
            if out.finished:
                self.requests.pop(out.request_id, None)
        return StepResult(outputs, progressed=self.progressed())
