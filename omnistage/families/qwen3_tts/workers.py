"""Qwen3-TTS's stage workers: the talker (with its code predictor) and the 12 Hz codec decoder.

Each loads only its own part of the checkpoint. The talker builds each request's prompt from its
:class:`TalkerSpeech` (the utterance's ids, on its own device) and runs on the generic talker step hook; the
codec stage decodes each request as a stream whose joined chunks equal one whole decode.
"""

from __future__ import annotations

import torch

from omnistage.engine import Request
from omnistage.engine.generation_engine import ChunkDecoder
from omnistage.families.qwen3_tts.payloads import TalkerSpeech, TextAppend
from omnistage.ipc.messages import RequestFailed, StageInput, StageOutput
from omnistage.models.qwen3_tts.checkpoint import load_codec_decoder, load_talker
from omnistage.models.qwen3_tts.codec_stream import StreamingCodecDecoder
from omnistage.models.qwen3_tts.config import Qwen3TTSConfig
from omnistage.families.qwen3_tts.offline import append_text, talker_request, talker_step_hook
from omnistage.models.qwen3_tts.prompt import build_talker_prompt
from omnistage.runner import GenerationRunner, build_ar_engine
from omnistage.workers.base import WorkerSpec, engine_config, resolve_device
from omnistage.workers.codec import CodecWorker
from omnistage.workers.talker import TalkerWorker as FramesWorker


class TalkerWorker(FramesWorker):
    def __init__(self, spec: WorkerSpec) -> None:
        device, dtype = resolve_device(spec.stage.device, spec.stage.dtype)
        self.config = Qwen3TTSConfig.from_folder(spec.model_dir)
        self.talker = load_talker(spec.model_dir, self.config, device, dtype, spec.stage.quantization)
        self.num_groups = self.config.talker.num_code_groups
        positions = self.config.talker.max_positions
        super().__init__(build_ar_engine(self.talker, engine_config(spec.stage, device, dtype, positions),
                                         talker_step_hook(self.talker, self.config)))
        self.requests: dict[str, Request]
        self.profile_with(spec.stage, self.talker.codec_head.weight)

    @torch.inference_mode()
    def handle(self, message: StageInput) -> list[StageOutput | RequestFailed]:
        payload = message.payload
        if isinstance(payload, TextAppend):
            self._append(message.request_id, payload)
            return []
        if not isinstance(payload, TalkerSpeech):
            raise TypeError(f"the Qwen3-TTS talker does not take {type(payload).__name__}")
        prompt = build_talker_prompt(self.talker, self.config, payload.prompt)
        request = talker_request(self.config, message.request_id, prompt, payload.sampling)
        self.engine.add_request(request)
        self.requests[message.request_id] = request
        return []

    def _append(self, request_id: str, more: TextAppend) -> None:
        request = self.requests.get(request_id)
        if request is not None:  # else it ended (codec EOS, its cap) before its text did
            append_text(self.talker, self.config, request, more)


class CodecDecoderWorker(CodecWorker):
    def load_vocoder(self, spec: WorkerSpec, device: str, dtype: torch.dtype) -> ChunkDecoder:
        config = Qwen3TTSConfig.from_folder(spec.model_dir)
        decoder = load_codec_decoder(spec.model_dir, config, device, dtype)
        return GenerationRunner(StreamingCodecDecoder(decoder), device)
