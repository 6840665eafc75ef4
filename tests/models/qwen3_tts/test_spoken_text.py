"""Qwen3-TTS spoken as its text is written: the talker starts on the first words, waits at a text row that has
not arrived, and its greedy codes are the one-shot streaming-mode codes of the whole text (the layout the reference
uses with ``non_streaming_mode=False``), for a speaker, a designed voice and a voice cloned in context; the
non-streaming one-shot (the speech API's default for CustomVoice) differs by construction."""

from __future__ import annotations

from dataclasses import replace

import msgspec
import pytest
import torch

from omnistage.families.qwen3_tts.offline import (
    TTSSettings,
    append_text,
    engine_config,
    request_frames,
    talker_request,
    talker_step_hook,
)
from omnistage.families.qwen3_tts.payloads import TextAppend
from omnistage.families.qwen3_tts.speech import Qwen3TTSSpeech
from omnistage.families.speech import SpeechAsk
from omnistage.models.qwen3_tts.prompt import build_talker_prompt
from omnistage.models.qwen3_tts.request import make_voice_clone
from omnistage.runner import build_ar_engine

TEXT = "Hello there, how are you today? I am fine."
PIECES = ["Hel", "lo th", "ere, how", " are", " you today", "? I am fi", "ne."]
SETTINGS = TTSSettings(max_new_tokens=40)
ROOM = 4096


def _engine(models, longest: int):  # noqa: ANN001, ANN202
    return build_ar_engine(models.talker, engine_config(models, longest),
                           talker_step_hook(models.talker, models.config))


def _one_shot(models, spec) -> torch.Tensor:  # noqa: ANN001
    prompt = build_talker_prompt(models.talker, models.config, spec)
    request = talker_request(models.config, "whole", prompt, SETTINGS.talker_params())
    engine = _engine(models, request.num_prompt_tokens + SETTINGS.max_new_tokens + len(spec.text_ids))
    engine.add_request(request)
    engine.run_until_done()
    return request_frames(request)


def _delta_fed(models, spoken) -> tuple[torch.Tensor, int, int]:  # noqa: ANN001
    """Feeds PIECES one at a time, stepping the engine until it has nothing it can run after each: (frames, steps
    on which the talker waited for text, the piece the request opened on)."""
    engine, request, waited, opened_at = None, None, 0, -1
    for k, piece in enumerate(PIECES):
        step = spoken.add(piece, done=k == len(PIECES) - 1)
        if step.opening is not None:
            prompt = build_talker_prompt(models.talker, models.config, step.opening)
            params = msgspec.structs.replace(SETTINGS.talker_params(), max_tokens=min(SETTINGS.max_new_tokens,
                                                                      spoken.max_frames(step.opening)))
            request = talker_request(models.config, "fed", prompt, params)
            engine = _engine(models, request.num_prompt_tokens + SETTINGS.max_new_tokens + 64)
            engine.add_request(request)
            opened_at = k
        if isinstance(step.more, TextAppend):
            append_text(models.talker, models.config, request, step.more)
        while engine is not None and engine.has_unfinished_requests():
            if not engine.step() and engine.last_num_scheduled == 0:
                waited += 1
                break
    return request_frames(request), waited, opened_at


@pytest.mark.parametrize("kind", ["custom_voice", "voice_design", "base"])
def test_delta_fed_codes_are_the_one_shot_streaming_codes(kind, tts_dirs, tts_models, tts_tokenizer) -> None:  # noqa: ANN001
    from omnistage.tools.verify.tts_compare import synthetic_voice

    models = tts_models[kind]
    speech = Qwen3TTSSpeech(tts_dirs[kind], models.config)
    if kind == "base":  # cloned in context: 0.4 s of reference, 6 codec rows, a transcript of 2 ids
        ask = SpeechAsk("", clone=make_voice_clone(models, tts_tokenizer, synthetic_voice(0.4), 24000, "Hi."))
    else:
        ask = SpeechAsk("", voice="ryan") if kind == "custom_voice" else SpeechAsk("", instructions="A calm voice.")
    frames, waited, opened_at = _delta_fed(models, speech.spoken_text(ask, ROOM))
    whole = speech.prompt(replace(ask, text=TEXT))
    streaming = _one_shot(models, replace(whole, non_streaming=False))
    assert frames.shape[0] == SETTINGS.max_new_tokens - 1
    assert torch.equal(frames, streaming)
    assert waited > 0  # the talker ran ahead of the text and waited for it
    if kind == "base":  # cloned in context: the prompt holds as many text rows as the reference has codec rows
        assert opened_at > 0
    else:
        assert opened_at == 1  # "Hel" alone may still grow; "Hello" is out once " th" has begun
        assert not torch.equal(frames, _one_shot(models, replace(whole, non_streaming=True)))
