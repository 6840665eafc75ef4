"""One utterance offline through omnistage's engine: text + voice -> talker codes -> 24 kHz waveform.

The same pieces a serving pipeline uses: :func:`talker_request` (the AR engine's :class:`Request`, its trailing
text already complete), :func:`talker_step_hook` (the generic :class:`TalkerStepHook` with Qwen3-TTS's suppressed
ids), and :class:`StreamingCodecDecoder` for the audio. Greedy or seeded; ``omnistage verify`` holds this against
the reference's ``generate_custom_voice``/``generate_voice_design``/``generate_voice_clone``.

Frames follow the reference: ``n`` talker steps give ``n - 1`` frames (the last code 0, EOS or not, never gets its
residual codes), and codes stop before codec EOS. A voice clone's audio is decoded after the reference's frames
(their samples dropped), as the reference decodes ``[reference codes, generated codes]`` and cuts the former.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import msgspec
import torch

from omnistage.engine import EngineConfig, Request
from omnistage.families.qwen3_tts.payloads import TextAppend
from omnistage.models.qwen3_tts.checkpoint import Qwen3TTSModels
from omnistage.models.qwen3_tts.codec_stream import StreamingCodecDecoder
from omnistage.models.qwen3_tts.config import Qwen3TTSConfig
from omnistage.models.qwen3_tts.prompt import TalkerPrompt, build_talker_prompt, text_rows
from omnistage.models.qwen3_tts.request import SpeechInput, TextTokenizer, prompt_spec
from omnistage.models.qwen3_tts.talker import Qwen3TTSTalker
from omnistage.runner import TalkerRequestData, TalkerStepHook, build_ar_engine
from omnistage.runner.talker_hook import talker_data, talker_suppress_mask
from omnistage.sampling_params import SamplingParams


@dataclass(frozen=True)
class TTSSettings:
    """Talker sampling; the defaults are greedy (verify's). The reference's own defaults sample (temperature 0.9,
    top-k 50, repetition penalty 1.05); its code predictor takes separate settings, here it shares code 0's."""

    max_new_tokens: int = 24
    min_new_tokens: int = 2  # fixed in the reference's generate
    temperature: float = 0.0
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.05
    seed: int | None = None

    def talker_params(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p,
                              repetition_penalty=self.repetition_penalty, seed=self.seed,
                              max_tokens=self.max_new_tokens, min_tokens=min(self.min_new_tokens, self.max_new_tokens))


def talker_request(config: Qwen3TTSConfig, request_id: str, prompt: TalkerPrompt, params: SamplingParams) -> Request:
    """The talker engine's request: the prompt as embeddings, the trailing text known so far (the whole of it
    unless the text is still being written)."""
    data = TalkerRequestData(tts_pad_embed=prompt.tts_pad, trailing_text=list(prompt.trailing_text.unbind(0)),
                             text_finished=prompt.text_finished)
    return Request(request_id, None, params, prompt_embeds=prompt.embeds, eos_token_id=config.talker.codec.eos,
                   stage_data=data)


def append_text(talker: Qwen3TTSTalker, config: Qwen3TTSConfig, request: Request, more: TextAppend) -> None:
    """An open text's next ids become the request's trailing rows (the talker waits at a row not yet there); at
    its end ``tts_eos`` follows and the frames are capped as the whole text's would be."""
    data = talker_data(request)
    ids = more.ids + ([config.token_ids.tts_eos] if more.done else [])
    if ids:
        data.add_text(text_rows(talker, ids))
    if more.done:
        data.finish_text()
        params = request.sampling_params
        if more.max_frames is not None and (params.max_tokens is None or more.max_frames < params.max_tokens):
            request.sampling_params = msgspec.structs.replace(params, max_tokens=more.max_frames)


def talker_step_hook(talker: Qwen3TTSTalker, config: Qwen3TTSConfig) -> TalkerStepHook:
    return TalkerStepHook(talker, talker_suppress_mask(config.talker.vocab_size, config.talker.codec.eos))


def request_frames(request: Request) -> torch.Tensor:
    """A finished talker request's audio frames ``[T, G]``: its last frame (EOS, or cut at max tokens) dropped."""
    data = request.stage_data
    if not isinstance(data, TalkerRequestData):
        raise TypeError(f"{request.request_id}: not a talker request")
    frames = data.frames[:-1]
    return torch.stack(frames).cpu() if frames else torch.zeros(0, 0, dtype=torch.long)


def engine_config(models: Qwen3TTSModels, max_len: int, max_num_seqs: int = 1) -> EngineConfig:
    """Room for ``max_num_seqs`` requests of up to ``max_len`` tokens; eager (nothing to amortise a capture over)."""
    block = 16
    return EngineConfig(block_size=block, num_blocks=max_num_seqs * (-(-max_len // block) + 1) + 2,
                        max_num_seqs=max_num_seqs, max_num_batched_tokens=max(max_len * max_num_seqs, 1),
                        max_model_len=max_len, device=str(models.device), dtype=models.dtype, enforce_eager=True)


class SpeechOutput(NamedTuple):
    codes: torch.Tensor  # [T, G] talker frames
    wav: torch.Tensor  # [1920 T] at 24 kHz


def decode_frames(models: Qwen3TTSModels, frames: torch.Tensor, ref_codes: torch.Tensor | None = None) -> torch.Tensor:
    """Frames ``[T, G]`` -> ``[1920 T]``, after ``ref_codes`` ``[R, G]`` as left context when given."""
    if frames.shape[0] == 0:
        return torch.zeros(0)
    decoder = StreamingCodecDecoder(models.codec_decoder)
    index = 0
    if ref_codes is not None and ref_codes.shape[0]:
        decoder.decode("utterance", 0, ref_codes.T)
        index = 1
    return decoder.decode("utterance", index, frames.T, last=True).float().cpu()


def generate_offline(models: Qwen3TTSModels, tokenizer: TextTokenizer, speech: SpeechInput,
                     settings: TTSSettings | None = None) -> SpeechOutput:
    """One request through the talker engine to completion, then the codec decoder."""
    settings = settings or TTSSettings()
    prompt = build_talker_prompt(models.talker, models.config, prompt_spec(models.config, tokenizer, speech))
    request = talker_request(models.config, "offline", prompt, settings.talker_params())
    engine = build_ar_engine(models.talker, engine_config(models, request.num_prompt_tokens + settings.max_new_tokens),
                             talker_step_hook(models.talker, models.config))
    engine.add_request(request)
    engine.run_until_done()
    frames = request_frames(request)
    clone = speech.voice_clone
    return SpeechOutput(frames, decode_frames(models, frames, clone.ref_codes if clone is not None else None))
