"""Qwen2.5-Omni's stage workers: the thinker on omnistage's AR engine (paged KV, continuous batching).

A prompt whose reply the talker speaks (``ThinkerPrompt.capture_hidden``) runs with its hidden states captured
(:class:`ThinkerHiddenHook`); each of its token outputs is preceded by a :class:`ReplyHidden` with the rows computed
since the previous one.
"""

from __future__ import annotations

import torch

from omnistage.engine import Request, RequestOutput
from omnistage.engine.generation_engine import ChunkDecoder
from omnistage.families.qwen2_5_omni.payloads import ReplyFeed, ReplyHidden, TalkerStart, ThinkerPrompt
from omnistage.families.qwen2_5_omni.talker_stage import TalkerContext, build_talker_request, feed_reply, finish_reply
from omnistage.families.qwen2_5_omni.thinker_hook import HiddenCapture, ThinkerHiddenHook
from omnistage.families.qwen2_5_omni.thinker_stage import build_thinker_request
from omnistage.families.qwen2_5_omni.voices import load_speakers, speaker
from omnistage.ipc.messages import RequestFailed, StageInput, StageOutput
from omnistage.models.qwen2_5_omni.config import Qwen25OmniConfig
from omnistage.models.qwen2_5_omni.talker import Talker
from omnistage.models.qwen2_5_omni.thinker import Thinker
from omnistage.models.qwen2_5_omni.token2wav import Token2Wav
from omnistage.models.qwen2_5_omni.token2wav_stream import Token2WavStreams
from omnistage.models.thinker_embedding import load_thinker_embedding
from omnistage.runner import build_ar_engine
from omnistage.runner.generation_runner import GenerationRunner
from omnistage.workers.base import WorkerSpec, engine_config, resolve_device
from omnistage.workers.codec import CodecWorker
from omnistage.workers.talker import TalkerWorker as FramesWorker
from omnistage.workers.thinker import ThinkerWorker as OmniThinkerWorker


class ThinkerWorker(OmniThinkerWorker[ThinkerPrompt]):
    prompt_type = ThinkerPrompt

    def __init__(self, spec: WorkerSpec) -> None:
        device, dtype = resolve_device(spec.stage.device, spec.stage.dtype)
        config = Qwen25OmniConfig.from_folder(spec.model_dir)
        self.model = Thinker.from_checkpoint(spec.model_dir, device, dtype, config=config)
        self.eos_token_id = config.eos_token_id
        super().__init__(build_ar_engine(self.model, engine_config(spec.stage, device, dtype, config.max_positions),
                                         ThinkerHiddenHook(self.model.config.text_config.hidden_size)))

    def build_request(self, request_id: str, prompt: ThinkerPrompt) -> Request:
        return build_thinker_request(self.model, request_id, prompt.token_ids, prompt.mm, prompt.sampling,
                                     self.eos_token_id, capture=prompt.capture_hidden)

    def hidden_payload(self, request: Request) -> ReplyHidden | None:
        """The rows computed since the request's previous output."""
        data = request.stage_data
        rows = data.drain() if isinstance(data, HiddenCapture) else None
        return None if rows is None else ReplyHidden(rows)


class TalkerWorker(FramesWorker):
    """One codebook per step; every sampled code is audio up to the first codec pad/eos (transformers'
    ``talker_code_lengths``): a reply stopped at max tokens keeps its last code, unlike the generic talker's rule."""

    num_groups = 1

    def __init__(self, spec: WorkerSpec) -> None:
        device, dtype = resolve_device(spec.stage.device, spec.stage.dtype)
        config = Qwen25OmniConfig.from_folder(spec.model_dir)
        if not config.has_talker:
            raise ValueError(f"{spec.model_dir} has no talker (enable_audio_output false or no spk_dict.pt)")
        talker = Talker.from_checkpoint(spec.model_dir, device, dtype, config=config)
        tc = config.hf.thinker_config
        media = (tc.audio_token_index, tc.image_token_index, tc.video_token_index)
        self.ctx = TalkerContext(talker, load_thinker_embedding(spec.model_dir, device, dtype), media)
        self.speakers = load_speakers(spec.model_dir)
        positions = int(talker.config.max_position_embeddings)
        super().__init__(build_ar_engine(talker, engine_config(spec.stage, device, dtype, positions),
                                         self.ctx.step_hook()))

    @torch.inference_mode()
    def handle(self, message: StageInput) -> list[StageOutput | RequestFailed]:
        payload, rid = message.payload, message.request_id
        if isinstance(payload, TalkerStart):
            bos = speaker(self.speakers, payload.voice).bos_token
            request = build_talker_request(self.ctx, rid, payload.token_ids, payload.layout, payload.prompt_hidden,
                                           bos, payload.first_token, payload.first_hidden, payload.sampling)
            self.engine.add_request(request)
            self.requests[rid] = request
        elif isinstance(payload, ReplyFeed):
            request = self.requests.get(rid)
            if request is not None:  # None: the talker already stopped (a stop code before the text ran out)
                if payload.token_ids and payload.hidden is not None:
                    feed_reply(self.ctx, request, payload.token_ids, payload.hidden)
                if payload.finished:
                    finish_reply(self.ctx, request)
        else:
            raise TypeError(f"the Qwen2.5-Omni talker does not take {type(payload).__name__}")
        return []

    def audio_frames(self, output: RequestOutput) -> torch.Tensor | None:
        frames = output.new_frames
        if frames is not None and output.finished and frames.shape[0] and int(frames[-1, 0]) in self.ctx.stop_codes:
            return frames[:-1]
        return frames


class Token2WavWorker(CodecWorker):
    """token2wav on the generic codec stage (batched chunk jobs, playback-deadline order): each chunk a window of
    overlapping context decoded in its stream's voice from its stream's noise
    (:mod:`omnistage.models.qwen2_5_omni.token2wav_stream`). fp32 unless the stage sets ``dtype`` (its ODE runs
    in fp32, as transformers')."""

    def load_vocoder(self, spec: WorkerSpec, device: str, dtype: torch.dtype) -> ChunkDecoder:
        dtype = torch.float32 if spec.stage.dtype == "auto" else dtype
        model = Token2Wav.from_checkpoint(spec.model_dir, device, dtype)
        speakers = load_speakers(spec.model_dir)

        def voice(name: str) -> tuple[torch.Tensor, torch.Tensor]:
            found = speaker(speakers, name)
            return found.cond, found.ref_mel

        return GenerationRunner(Token2WavStreams(model, voice), device)
